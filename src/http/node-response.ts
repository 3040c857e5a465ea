/**
 * A Node `ServerResponse` seen from the inside: what a handler writes to it, however it writes it, is
 * kept for the ledger while it goes out. Express writes to one directly; NestJS's platforms (Express,
 * and Fastify's `reply.raw`) end up writing to one, so both adapters share this.
 */
import { IncomingMessage, ServerResponse } from 'node:http'
import { delayOption } from '../core/duration.js'
import { longTimeout } from '../core/long-timer.js'
import { plainHeaders } from './node-body.js'
import type { HttpResponseLike, IdempotencyContext } from './types.js'

type Chunk = string | Uint8Array
type WriteArgs = [chunk?: unknown, encoding?: unknown, callback?: unknown]
type Finish = (response: HttpResponseLike) => Promise<HttpResponseLike>
type Fail = (error: unknown) => Promise<void>

/** Sends a neutral response (a replay, a problem) on a response nothing has written to yet. */
export function sendNode(res: ServerResponse, response: HttpResponseLike): void {
  res.statusCode = response.status
  for (const [name, value] of Object.entries(response.headers)) res.setHeader(name, value)
  res.end(Buffer.from(response.body))
}

/**
 * The `abandonAfterMs` option (Express, NestJS): 30 s when not given, else a delay in ms. Checked
 * where the middleware is made: a NaN or negative one released the record at once after the client
 * left, while its handler still ran, so a retry could run the effect beside it.
 */
export function abandonAfter(value: number | undefined): number {
  return delayOption(value, 30_000, 'abandonAfterMs')
}

/**
 * Keeps a copy of everything the handler writes, however it writes it, while it goes to the client.
 * When the handler ends the response, the copy is stored. A client that leaves first does not make the
 * outcome transient; a handler that never ends the response releases the record after `abandonAfterMs`.
 *
 * Headers given to `writeHead(status, headers)` count too: Fastify hands all of its headers over that
 * way, and Node keeps those out of `getHeaders()` when nothing was set before. They are read back from
 * the header block Node has built by the time the body ends, so `writeHead` is not wrapped.
 *
 * How the copy is taken: `ServerResponse.prototype.write` and `end` are wrapped once per process, and
 * a response being captured is looked up in a WeakMap (one lookup per write for every other response).
 * Wrapping each response instead means adding `write` and `end` as its own properties, and on a
 * response Express has given its own prototype every added property makes a new hidden class for that
 * one object, which costs a request as much as the rest of the layer (bench/peers/README.md). Where something already sits above Node's methods for this response (a
 * `compression()` installed before idemkey wraps them as own properties; an http2 compat response has
 * other methods), the response gets its own `write` and `end`, so the copy is always what the
 * handler wrote, never what a wrapper installed earlier made of it.
 */
export function capture(res: ServerResponse, abandonAfterMs: number, keepAtMost: number, finish: Finish, fail: Fail): void {
  const hooks = nodeHooks()
  const onTheWire = res.write === hooks.write && res.end === hooks.end
  const copy = new Capture(keepAtMost, finish, onTheWire)
  if (onTheWire) captures.set(res, copy)
  else wrapOwn(res, copy)
  releaseIfAbandoned(res, abandonAfterMs, copy, fail)
}

/**
 * Sets `req.idempotency` (the API handlers read) without adding a property to the request: Node's
 * requests get an `idempotency` accessor, once per process, that keeps the value in a WeakMap. For the
 * same reason as {@link capture}: on a request whose prototype Express swapped, an added property is a
 * hidden class for that one object. A request of another kind (an http2 compat request, a Fastify
 * request) gets an own property instead; so does one whose app already defines `idempotency`.
 */
export function attachContext(req: object, context: IdempotencyContext): void {
  contextAccessor()
  ;(req as { idempotency?: IdempotencyContext }).idempotency = context
}

const contexts = new WeakMap<object, IdempotencyContext>()
let accessorInstalled = false

function contextAccessor(): void {
  if (accessorInstalled) return
  accessorInstalled = true
  // Another copy of idemkey (or the app) got there first: its accessor (or its absence) stays.
  if (Object.getOwnPropertyDescriptor(IncomingMessage.prototype, 'idempotency')) return
  Object.defineProperty(IncomingMessage.prototype, 'idempotency', {
    configurable: true,
    enumerable: false,
    get(this: object) {
      return contexts.get(this)
    },
    set(this: object, value: IdempotencyContext) {
      contexts.set(this, value)
    },
  })
}

/** What a handler has written to one response so far. */
class Capture {
  chunks: Buffer[] = []
  length = 0
  ended = false

  constructor(
    readonly keepAtMost: number,
    readonly finish: Finish,
    /**
     * Whether the copy is the bytes that go out (taken below every wrapper: a `compression()` mounted
     * after idemkey compresses before they reach it), or what the handler wrote above a wrapper installed
     * earlier, which may still encode them.
     */
    readonly onTheWire: boolean,
  ) {}

  write(chunk: unknown, encoding: unknown): void {
    // Copied: a streaming handler may reuse its buffer for the next write.
    this.#keep(toBuffer(chunk, encoding))
  }

  /** The body is complete: hands the response to the ledger. Once; a second `end` is Node's to refuse. */
  end(res: ServerResponse, chunk: unknown, encoding: unknown): void {
    if (this.ended) return
    this.ended = true
    // The last chunk is kept as it is: once handed to end() it is the response's.
    this.#keep(Buffer.isBuffer(chunk) ? chunk : toBuffer(chunk, encoding))
    const body = this.chunks.length === 1 ? (this.chunks[0] as Buffer) : Buffer.concat(this.chunks)
    const headers = sentHeaders(res)
    // A Content-Encoding set by a wrapper above the copy (compression() mounted before idemkey) describes
    // bytes the copy does not hold: the replay goes out through that wrapper again, which encodes it.
    if (!this.onTheWire) delete headers['content-encoding']
    void this.finish({ status: res.statusCode, headers, body, bodyLength: this.length })
  }

  #keep(buffer: Buffer | undefined): void {
    if (!buffer) return
    this.length += buffer.byteLength
    // A body over the stored limit is stored without its bytes: stop holding a copy of a long stream.
    if (this.length > this.keepAtMost) this.chunks = []
    else this.chunks.push(buffer)
  }
}

/** Responses whose body is being copied, by the process-wide wrappers of Node's write and end. */
const captures = new WeakMap<ServerResponse, Capture>()
let hooks: { write: ServerResponse['write']; end: ServerResponse['end'] } | undefined

/** Wraps `ServerResponse.prototype.write` and `end`, once; a response not being captured passes straight through. */
function nodeHooks(): NonNullable<typeof hooks> {
  if (hooks) return hooks
  const proto = ServerResponse.prototype
  const write = proto.write
  const end = proto.end
  // `arguments`, not rest parameters: no array per call, and every argument passes through as given.
  proto.write = function idemkeyWrite(this: ServerResponse, chunk: unknown, encoding?: unknown) {
    captures.get(this)?.write(chunk, encoding)
    // biome-ignore lint/complexity/noArguments: forwards the call exactly as it was made
    return Reflect.apply(write, this, arguments) as boolean
  } as ServerResponse['write']
  proto.end = function idemkeyEnd(this: ServerResponse, chunk?: unknown, encoding?: unknown) {
    const copy = captures.get(this)
    if (copy !== undefined) {
      captures.delete(this)
      copy.end(this, chunk, encoding)
    }
    // biome-ignore lint/complexity/noArguments: forwards the call exactly as it was made
    return Reflect.apply(end, this, arguments) as ServerResponse
  } as ServerResponse['end']
  hooks = { write: proto.write, end: proto.end }
  return hooks
}

/** The per-response wrapping, for a response whose write or end something else has wrapped already. */
function wrapOwn(res: ServerResponse, copy: Capture): void {
  const write = res.write
  const end = res.end
  res.write = function captureWrite(this: ServerResponse, chunk: unknown, encoding?: unknown) {
    copy.write(chunk, encoding)
    // biome-ignore lint/complexity/noArguments: forwards the call exactly as it was made
    return Reflect.apply(write, this, arguments) as boolean
  } as ServerResponse['write']
  res.end = function captureEnd(this: ServerResponse, chunk?: unknown, encoding?: unknown) {
    copy.end(res, chunk, encoding)
    // biome-ignore lint/complexity/noArguments: forwards the call exactly as it was made
    return Reflect.apply(end, this, arguments) as ServerResponse
  } as ServerResponse['end']
}

/**
 * The headers of a response whose body is ending: once `writeHead` has run, the header block Node built
 * (it holds what `writeHead(status, headers)` was given, which `getHeaders()` may not); before, the
 * headers set so far, which `end` is about to send.
 */
function sentHeaders(res: ServerResponse): Record<string, string | string[]> {
  const block = (res as ServerResponse & { _header?: unknown })._header
  if (typeof block !== 'string' || block === '') return headersOf(res)
  const headers: Record<string, string | string[]> = {}
  // The status line, then `Name: value` lines, then an empty line.
  let at = block.indexOf('\r\n') + 2
  while (at > 1 && at < block.length) {
    const eol = block.indexOf('\r\n', at)
    const line = block.slice(at, eol === -1 ? block.length : eol)
    if (line === '') break
    const colon = line.indexOf(':')
    if (colon > 0) {
      const name = line.slice(0, colon).trim().toLowerCase()
      const value = line.slice(colon + 1).trim()
      const existing = headers[name]
      headers[name] = existing === undefined ? value : Array.isArray(existing) ? [...existing, value] : [existing, value]
    }
    at = eol === -1 ? block.length : eol + 2
  }
  return headers
}

/**
 * With `transactional: true`: holds the whole response until the transaction that completes the record
 * has committed, so a client never gets an answer whose writes were rolled back (a fenced-out holder
 * gets `409`, a failed commit `503`). Streaming handlers are buffered in this mode.
 */
export function holdUntilCommit(res: ServerResponse, abandonAfterMs: number, finish: Finish, fail: Fail): void {
  const chunks: Buffer[] = []
  let ended = false
  const write = res.write
  const end = res.end
  const writeHead = res.writeHead
  // writeHead would build the header block now; keep status and headers open until the commit, so a
  // failed commit can still replace them.
  res.writeHead = function holdWriteHead(this: ServerResponse, statusCode: number, ...rest: unknown[]) {
    res.statusCode = statusCode
    for (const arg of rest) {
      if (typeof arg === 'string') res.statusMessage = arg
      else if (Array.isArray(arg)) {
        // Node takes [name, value, name, value] or [[name, value], …]; repeated names add up.
        for (const [name, value] of headerEntries(arg)) res.appendHeader(name, value)
      } else if (arg && typeof arg === 'object') {
        for (const [name, value] of headerEntries(arg)) res.setHeader(name, value)
      }
    }
    return this
  } as ServerResponse['writeHead']
  res.write = function holdWrite(...args: WriteArgs) {
    const buffer = toBuffer(args[0], args[1])
    if (buffer) chunks.push(buffer)
    const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined
    if (callback) process.nextTick(callback)
    return true
  } as ServerResponse['write']
  res.end = function holdEnd(this: ServerResponse, ...args: WriteArgs) {
    if (ended) return this
    ended = true
    const buffer = toBuffer(args[0], args[1])
    if (buffer) chunks.push(buffer)
    const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined
    const body = Buffer.concat(chunks)
    void finish({ status: res.statusCode, headers: headersOf(res), body }).then((answer) => {
      res.writeHead = writeHead
      res.write = write
      res.end = end
      if (answer.body !== body && !res.headersSent) {
        // The transaction did not commit: answer the engine's problem instead of the handler's response.
        for (const name of res.getHeaderNames()) res.removeHeader(name)
        res.statusCode = answer.status
        for (const [name, value] of Object.entries(answer.headers)) res.setHeader(name, value)
      }
      const out = answer.body === body ? body : Buffer.from(answer.body)
      if (callback) res.end(out, callback)
      else res.end(out)
    })
    return this
  } as ServerResponse['end']
  releaseIfAbandoned(
    res,
    abandonAfterMs,
    {
      get ended() {
        return ended
      },
    },
    fail,
  )
}

/** A handler that never ends the response after its client left releases the record after a while. */
function releaseIfAbandoned(res: ServerResponse, afterMs: number, state: { readonly ended: boolean }, fail: Fail) {
  // `on`, not `once`: 'close' comes once, and once's wrapper and removal cost more than the listener.
  res.on('close', () => {
    if (state.ended) return
    longTimeout(
      () => {
        if (!state.ended) void fail(new Error('The handler did not end the response after the client went away.'))
      },
      afterMs,
      true,
    )
  })
}

/**
 * The fields of a `writeHead` argument: `{ name: value }`, `[name, value, name, value]` or
 * `[[name, value], …]`; a name given twice in an array adds up, as Node does.
 */
function headerEntries(arg: object): [string, string | string[]][] {
  if (!Array.isArray(arg)) {
    return Object.entries(arg)
      .filter((entry): entry is [string, string | string[]] => entry[1] !== undefined && entry[1] !== null)
      .map(([name, value]) => [name, Array.isArray(value) ? value.map(String) : String(value)])
  }
  const pairs: [string, string][] = Array.isArray(arg[0])
    ? (arg as [string, string][])
    : Array.from({ length: Math.floor(arg.length / 2) }, (_, i) => [arg[2 * i] as string, arg[2 * i + 1] as string])
  const merged = new Map<string, [string, string | string[]]>()
  for (const [name, value] of pairs) {
    const existing = merged.get(name.toLowerCase())
    if (!existing) merged.set(name.toLowerCase(), [name, String(value)])
    else existing[1] = [existing[1]].flat().concat(String(value))
  }
  return [...merged.values()]
}

function toBuffer(chunk: unknown, encoding: unknown): Buffer | undefined {
  if (chunk === undefined || chunk === null || typeof chunk === 'function') return undefined
  return typeof chunk === 'string'
    ? Buffer.from(chunk, (typeof encoding === 'string' ? encoding : 'utf8') as BufferEncoding)
    : Buffer.from(chunk as Chunk as Uint8Array)
}

/** The headers set on a response, as a record of strings. */
export function headersOf(res: ServerResponse): Record<string, string | string[]> {
  return plainHeaders(res.getHeaders())
}
