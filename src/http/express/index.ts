/**
 * `idemkey/express`: idempotency middleware for Express 4 and 5. Mount it after your body parser;
 * the handler reads the context as `req.idempotency`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Request as ExpressRequest } from 'express'
import { createEngine } from '../engine.js'
import { KEY_HEADER } from '../key-header.js'
import { distinctHeaders, readNodeBody, tooLarge } from '../node-body.js'
import type { EngineOptions, HttpRequestLike, HttpResponseLike, IdempotencyContext } from '../types.js'

export type { IdempotencyContext } from '../types.js'

declare global {
  namespace Express {
    interface Request {
      /** Set by idemkey on covered requests: the key, scope, fencing token, takeover flag, lease signal. */
      idempotency?: IdempotencyContext
    }
  }
}

/** Options of the Express middleware. */
/**
 * Options of the Express middleware. `scope` receives Express's own `req`, so it sees what your
 * authentication middleware set (`(req) => req.user?.tenantId`).
 */
export interface ExpressIdempotencyOptions extends EngineOptions<ExpressRequest> {
  /**
   * How long to wait for the handler to end the response after the client went away, before the
   * record is released. @default 30_000
   */
  abandonAfterMs?: number
}

type Req = IncomingMessage & {
  body?: unknown
  /** The raw body, where the app keeps it: `express.json({ verify: (req, _res, buf) => { req.rawBody = buf } })`. */
  rawBody?: unknown
  _body?: boolean
  originalUrl?: string
  idempotency?: IdempotencyContext
}
type Next = (error?: unknown) => void

/**
 * The middleware. The handler's response streams to the client as usual (`res.json`, `res.send`,
 * `res.write` + `res.end`, piped streams); a copy is kept to store for replays.
 *
 * @example
 * app.post('/charges', express.json(), idempotency({ ledger, required: true }), (req, res) => res.status(201).json(charge(req.body)))
 */
export function idempotency(options: ExpressIdempotencyOptions): (req: Req, res: ServerResponse, next: Next) => void {
  const engine = createEngine(options)
  const abandonAfterMs = options.abandonAfterMs ?? 30_000
  const keepAtMost = options.maxStoredBody ?? 1024 * 1024
  return function idempotencyMiddleware(req, res, next) {
    if (!engine.applies(req.method ?? 'GET', req.headers[KEY_HEADER] !== undefined)) return next()
    const neutral: HttpRequestLike = {
      method: req.method ?? 'GET',
      url: req.originalUrl ?? req.url ?? '/',
      headers: distinctHeaders(req),
      native: req,
      // A body parser before us consumed the stream (body-parser 1 sets _body; 2 only ends the stream).
      // Its raw bytes, when a `verify` hook kept them as req.rawBody, fingerprint exactly; else the parsed value.
      parsedBody: bodyParsed(req) && !isBytes(req.body) && !isBytes(req.rawBody) ? req.body : undefined,
      body: async (limit) => {
        if (isBytes(req.rawBody)) {
          const raw = Buffer.from(req.rawBody as Buffer)
          if (raw.byteLength > limit) throw tooLarge(limit)
          return raw
        }
        if (bodyParsed(req)) return isBytes(req.body) ? Buffer.from(req.body as Buffer) : new Uint8Array(0)
        const bytes = await readNodeBody(req, limit)
        // No body parser ran before us: hand the body on, parsed when it is JSON, so handlers still get it.
        req.body = parseJsonOr(bytes, req.headers['content-type'])
        req._body = true
        return bytes
      },
    }
    engine.begin(neutral).then(
      (decision) => {
        if (decision.kind === 'passthrough') return next()
        if (decision.kind === 'respond') return send(res, decision.response)
        req.idempotency = decision.context
        if (options.transactional) holdUntilCommit(res, abandonAfterMs, decision.finish, decision.fail)
        else capture(res, abandonAfterMs, keepAtMost, decision.finish, decision.fail)
        next()
      },
      (error: unknown) => next(error),
    )
  }
}

function bodyParsed(req: Req): boolean {
  return req._body === true || (req.readableEnded && req.body !== undefined)
}

function isBytes(body: unknown): boolean {
  return Buffer.isBuffer(body) || typeof body === 'string'
}

function parseJsonOr(bytes: Uint8Array, contentType: string | undefined): unknown {
  const type = contentType?.split(';')[0]?.trim().toLowerCase() ?? ''
  if (type === 'application/json' || type.endsWith('+json')) {
    try {
      return JSON.parse(Buffer.from(bytes).toString('utf8'))
    } catch {
      // Invalid JSON: the handler gets the bytes and answers as it sees fit.
    }
  }
  return Buffer.from(bytes)
}

function send(res: ServerResponse, response: HttpResponseLike): void {
  res.statusCode = response.status
  for (const [name, value] of Object.entries(response.headers)) res.setHeader(name, value)
  res.end(Buffer.from(response.body))
}

type Chunk = string | Uint8Array
type WriteArgs = [chunk?: unknown, encoding?: unknown, callback?: unknown]

/**
 * Keeps a copy of everything the handler writes, however it writes it, while it goes to the client.
 * When the handler ends the response, the copy is stored. A client that leaves first does not make the
 * outcome transient; a handler that never ends the response releases the record after `abandonAfterMs`.
 */
function capture(
  res: ServerResponse,
  abandonAfterMs: number,
  keepAtMost: number,
  finish: (response: HttpResponseLike) => Promise<HttpResponseLike>,
  fail: (error: unknown) => Promise<void>,
): void {
  let chunks: Buffer[] = []
  let length = 0
  let ended = false
  const keep = (chunk: unknown, encoding: unknown) => {
    const buffer = toBuffer(chunk, encoding)
    if (!buffer) return
    length += buffer.byteLength
    // A body over the stored limit is stored without its bytes: stop holding a copy of a long stream.
    if (length > keepAtMost) chunks = []
    else chunks.push(buffer)
  }
  const write = res.write
  const end = res.end
  res.write = function captureWrite(this: ServerResponse, ...args: WriteArgs) {
    keep(args[0], args[1])
    return (write as (...a: WriteArgs) => boolean).apply(this, args)
  } as ServerResponse['write']
  res.end = function captureEnd(this: ServerResponse, ...args: WriteArgs) {
    if (!ended) {
      ended = true
      keep(args[0], args[1])
      void finish({ status: res.statusCode, headers: headersOf(res), body: Buffer.concat(chunks), bodyLength: length })
    }
    return (end as (...a: WriteArgs) => ServerResponse).apply(this, args)
  } as ServerResponse['end']
  releaseIfAbandoned(res, abandonAfterMs, () => ended, fail)
}

/**
 * With `transactional: true`: holds the whole response until the transaction that completes the record
 * has committed, so a client never gets an answer whose writes were rolled back (a fenced-out holder
 * gets `409`, a failed commit `503`). Streaming handlers are buffered in this mode.
 */
function holdUntilCommit(
  res: ServerResponse,
  abandonAfterMs: number,
  finish: (response: HttpResponseLike) => Promise<HttpResponseLike>,
  fail: (error: unknown) => Promise<void>,
): void {
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
        const pairs = Array.isArray(arg[0]) ? (arg as [string, string][]) : pairsOf(arg as string[])
        for (const [name, value] of pairs) res.appendHeader(name, value)
      } else if (arg && typeof arg === 'object') {
        for (const [name, value] of Object.entries(arg)) if (value !== undefined) res.setHeader(name, value as string | string[])
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
  releaseIfAbandoned(res, abandonAfterMs, () => ended, fail)
}

/** A handler that never ends the response after its client left releases the record after a while. */
function releaseIfAbandoned(res: ServerResponse, afterMs: number, ended: () => boolean, fail: (error: unknown) => Promise<void>) {
  res.once('close', () => {
    if (ended()) return
    const timer = setTimeout(() => {
      if (!ended()) void fail(new Error('The handler did not end the response after the client went away.'))
    }, afterMs)
    timer.unref()
  })
}

function pairsOf(flat: string[]): [string, string][] {
  const pairs: [string, string][] = []
  for (let i = 0; i + 1 < flat.length; i += 2) pairs.push([flat[i] as string, flat[i + 1] as string])
  return pairs
}

function toBuffer(chunk: unknown, encoding: unknown): Buffer | undefined {
  if (chunk === undefined || chunk === null || typeof chunk === 'function') return undefined
  return typeof chunk === 'string'
    ? Buffer.from(chunk, (typeof encoding === 'string' ? encoding : 'utf8') as BufferEncoding)
    : Buffer.from(chunk as Chunk as Uint8Array)
}

function headersOf(res: ServerResponse): Record<string, string | string[]> {
  const headers: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(res.getHeaders())) {
    if (value !== undefined) headers[name] = Array.isArray(value) ? value : String(value)
  }
  return headers
}
