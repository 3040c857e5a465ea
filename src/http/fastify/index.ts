/**
 * `idemkey/fastify`: a Fastify plugin. It runs in `preHandler`, after Fastify's own validation, so a
 * request that fails its schema never touches the ledger. The handler reads `request.idempotency`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Readable, Transform, type TransformCallback } from 'node:stream'
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify'
import { createEngine, type IdempotencyEngine } from '../engine.js'
import { distinctHeaders, plainHeaders, readWebBody, tooLarge } from '../node-body.js'
import type { Decision, EngineOptions, HttpRequestLike, HttpResponseLike, RegisteredContext } from '../types.js'

export type { IdempotencyContext, LedgerTransaction, Register, RegisteredContext, ReplayRequest, ReplayResponse } from '../types.js'

/** Per-route setting: `config: { idempotency: false }` turns it off, an object overrides options. */
export type RouteIdempotency = false | Partial<Omit<FastifyIdempotencyOptions, 'ledger'>>

/** Options of the plugin. `scope` receives Fastify's own `request` (`(request) => request.user?.tenantId`). */
export type FastifyIdempotencyOptions = EngineOptions<FastifyRequest>

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by idemkey on covered requests; `tx` typed by the ledger named in `Register` (`declare module 'idemkey/fastify'`). */
    idempotency?: RegisteredContext
  }
  interface FastifyContextConfig {
    /** `false` to leave this route alone, or options for it (e.g. `{ required: true }`). */
    idempotency?: RouteIdempotency
  }
}

const decisions = new WeakMap<FastifyRequest, Extract<Decision, { kind: 'execute' }>>()
/** The raw body of each covered request, kept while Fastify parses it: the fingerprint needs the bytes. */
const rawBodies = new WeakMap<FastifyRequest, RawBody>()

/**
 * Passes the body on to Fastify's parser untouched and keeps a copy of up to `limit` bytes, so the
 * fingerprint is taken from what the client sent (exact numbers, duplicate members seen), not from
 * what the parser made of it.
 */
class RawBody extends Transform {
  readonly chunks: Buffer[] = []
  receivedEncodedLength = 0
  overflow = false

  constructor(readonly limit: number) {
    super()
  }

  override _transform(chunk: Buffer | string, _encoding: BufferEncoding, callback: TransformCallback): void {
    const buffer = typeof chunk === 'string' ? Buffer.from(chunk) : chunk
    this.receivedEncodedLength += buffer.byteLength
    if (this.receivedEncodedLength > this.limit) {
      this.overflow = true
      this.chunks.length = 0
    } else this.chunks.push(buffer)
    callback(null, buffer)
  }

  bytes(): Uint8Array {
    return this.chunks.length === 1 ? (this.chunks[0] as Buffer) : Buffer.concat(this.chunks)
  }
}

const plugin: FastifyPluginAsync<FastifyIdempotencyOptions> = async (app, options) => {
  const base = createEngine(options)
  const maxRequestBodyOf = (config: RouteIdempotency | undefined) =>
    (config ? config.maxRequestBody : undefined) ?? options.maxRequestBody ?? 1024 * 1024
  const perRoute = new WeakMap<object, IdempotencyEngine>()
  const engineFor = (config: RouteIdempotency | undefined): IdempotencyEngine | undefined => {
    if (config === false) return undefined
    if (config === undefined) return base
    let engine = perRoute.get(config)
    if (!engine) {
      engine = createEngine({ ...options, ...config })
      perRoute.set(config, engine)
    }
    return engine
  }

  // A route's own options are checked when the route is added (a bad maxRequestBody fails at start-up),
  // not at its first request, where each request would fail with a 500.
  app.addHook('onRoute', (route) => {
    engineFor((route.config as { idempotency?: RouteIdempotency } | undefined)?.idempotency)
  })

  app.decorateRequest('idempotency', undefined)

  const routeConfig = (request: FastifyRequest) =>
    (request.routeOptions.config as { idempotency?: RouteIdempotency } | undefined)?.idempotency

  // Only covered requests pay for the copy; the rest pass this hook synchronously.
  app.addHook('preParsing', function idempotencyPreParsing(request, _reply, payload, done) {
    const engine = engineFor(routeConfig(request))
    if (!engine?.applies(request.method, request.headers[engine.keyHeader] !== undefined)) return done(null, payload)
    const raw = new RawBody(maxRequestBodyOf(routeConfig(request)))
    rawBodies.set(request, raw)
    payload.on('error', (error) => raw.destroy(error))
    done(null, payload.pipe(raw))
  })

  // Callback-style hooks: a request the layer does not cover passes each of them synchronously,
  // with no promise made for it.
  app.addHook('preHandler', function idempotencyPreHandler(request: FastifyRequest, reply: FastifyReply, done: (error?: Error) => void) {
    const engine = engineFor(routeConfig(request))
    if (!engine?.applies(request.method, request.headers[engine.keyHeader] !== undefined)) return done()
    const body = request.body
    const raw = rawBodies.get(request)
    rawBodies.delete(request)
    const neutral: HttpRequestLike = raw
      ? {
          method: request.method,
          url: request.url,
          headers: distinctHeaders(request.raw),
          native: request,
          body: async (limit) => {
            if (raw.overflow || raw.receivedEncodedLength > limit) throw tooLarge(limit)
            return raw.bytes()
          },
        }
      : {
          // No body reached the parser (GET-like) or another hook replaced it: what was parsed is all there is.
          method: request.method,
          url: request.url,
          headers: distinctHeaders(request.raw),
          native: request,
          parsedBody: body !== undefined && body !== null && !Buffer.isBuffer(body) && typeof body !== 'string' ? body : undefined,
          body: async () =>
            body === undefined || body === null ? new Uint8Array(0) : Buffer.from(typeof body === 'string' ? body : (body as Buffer)),
        }
    engine.begin(neutral).then((decision) => {
      if (decision.kind === 'passthrough') return done()
      if (decision.kind === 'respond') {
        // Answered here: the handler does not run, and done() is not called.
        sendAnswer(reply, decision.response)
        return
      }
      request.idempotency = decision.context
      decisions.set(request, decision)
      done()
    }, done)
  })

  app.addHook('onSend', function idempotencyOnSend(request, reply, payload, done) {
    const decision = decisions.get(request)
    if (!decision) return done(null, payload)
    decisions.delete(request)
    settle(decision, reply, payload).then(
      (result) => done(null, result),
      // The payload could not be read (a stream that failed): nothing was stored. The record is
      // released before Fastify answers the error, or it would stay held, its lease renewed, for good.
      (error: Error) => decision.fail(error).then(() => done(error)),
    )
  })

  // A request that never reached onSend (aborted, or the reply was hijacked): release its record.
  app.addHook('onResponse', function idempotencyOnResponse(request, _reply, done) {
    const decision = decisions.get(request)
    if (!decision) return done()
    decisions.delete(request)
    decision.fail(new Error('The response was not sent through Fastify.')).then(() => done(), done)
  })
}

/**
 * A replay or problem, sent through Fastify. Fastify types a Buffer as `application/octet-stream`;
 * a stored response without a type has none, so its body goes as a stream of known length instead.
 */
function sendAnswer(reply: FastifyReply, response: HttpResponseLike): void {
  reply.code(response.status).headers(response.headers)
  const body = Buffer.from(response.body)
  if (response.headers['content-type'] !== undefined) reply.send(body)
  else if (body.byteLength === 0) reply.send()
  else reply.header('content-length', String(body.byteLength)).send(Readable.from([body]))
}

/** Stores what the handler sent and returns the payload to send: its own, or the engine's problem. */
async function settle(decision: Extract<Decision, { kind: 'execute' }>, reply: FastifyReply, payload: unknown): Promise<unknown> {
  let sent = payload
  if (isFetchResponse(payload)) {
    // Fastify takes a Response's status and headers after this hook: take them now, so they are stored.
    reply.code(payload.status)
    for (const [name, value] of payload.headers) reply.header(name, value)
    sent = payload.body
  }
  const body = await toBuffer(sent)
  const captured = { status: reply.statusCode, headers: plainHeaders(reply.getHeaders()), body }
  const answer = await decision.finish(captured)
  // Hand back what the handler gave when it is still readable: a string lets Node write the headers
  // and body as one chunk, where a Buffer costs a second one on every response. A stream, read by
  // now, goes as the bytes it gave.
  if (answer === captured) return sent instanceof Readable || sent instanceof ReadableStream ? body : sent
  // Transactional mode, and the transaction did not commit: answer the engine's problem instead.
  for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name)
  reply.code(answer.status).headers(answer.headers)
  return Buffer.from(answer.body)
}

async function toBuffer(payload: unknown): Promise<Buffer> {
  if (payload === null || payload === undefined) return Buffer.alloc(0)
  if (Buffer.isBuffer(payload)) return payload
  if (typeof payload === 'string') return Buffer.from(payload)
  if (payload instanceof Readable) {
    const chunks: Buffer[] = []
    for await (const chunk of payload) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
    return Buffer.concat(chunks)
  }
  if (payload instanceof ReadableStream) {
    // A web stream (Fastify 5 sends one as it is): read it, or its text would be "[object ReadableStream]".
    const bytes = await readWebBody(payload as ReadableStream<Uint8Array>, null, Number.POSITIVE_INFINITY)
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  }
  return Buffer.from(String(payload))
}

/** A fetch `Response`: Fastify 5 sends its status, headers and body. */
function isFetchResponse(payload: unknown): payload is Response {
  return typeof payload === 'object' && payload !== null && Object.prototype.toString.call(payload) === '[object Response]'
}

/**
 * What fastify-plugin does, without the dependency: marks the plugin to skip Fastify's encapsulation
 * (its hooks apply to the routes of the instance that registers it), names it, and states the Fastify
 * versions it supports (Fastify checks them at register time).
 */
function rootPlugin<T extends FastifyPluginAsync<FastifyIdempotencyOptions>>(fn: T, name: string, fastify: string): T {
  const marked = fn as unknown as Record<symbol, unknown>
  marked[Symbol.for('skip-override')] = true
  marked[Symbol.for('fastify.display-name')] = name
  marked[Symbol.for('plugin-meta')] = { name, fastify }
  return fn
}

/**
 * The plugin.
 *
 * @example
 * await app.register(idempotency, { ledger })
 * app.post('/charges', { config: { idempotency: { required: true } } }, async (request, reply) => reply.code(201).send(charge(request.body)))
 */
export const idempotency = rootPlugin(plugin, 'idemkey', '4.x || 5.x')
export default idempotency

/**
 * Serves an operator page (docs/observability.md) in a Fastify app, under the prefix it is registered with.
 * The page itself comes from `idemkey/observability`; this adapter does not load it.
 *
 * @example
 * import { operatorPage } from 'idemkey/observability'
 * const page = operatorPage({ store })
 * await app.register(idempotency, { ledger, onEvent: page.onEvent })
 * await app.register(operatorPagePlugin(page), { prefix: '/idemkey' })
 */
export function operatorPagePlugin(page: { handler: (req: IncomingMessage, res: ServerResponse) => void }): FastifyPluginAsync {
  return async (app) => {
    const prefix = app.prefix
    const serve = (request: FastifyRequest, reply: FastifyReply) => {
      reply.hijack()
      const raw = request.raw as typeof request.raw & { originalUrl?: string }
      const original = raw.url ?? '/'
      raw.originalUrl = original
      raw.url = original.slice(prefix.length) || '/'
      if (!raw.url.startsWith('/')) raw.url = `/${raw.url}`
      page.handler(raw, reply.raw)
    }
    app.get('/', serve)
    app.get('/*', serve)
  }
}
