/**
 * `idemkey/koa`: idempotency middleware for Koa 2 and 3. The handler reads the context as
 * `ctx.state.idempotency`.
 */
import { Readable } from 'node:stream'
import type { DefaultContext, DefaultState, Next, ParameterizedContext } from 'koa'
import { createEngine } from '../engine.js'
import {
  distinctHeaders,
  isBytes,
  isJsonType,
  NULL_BODY_STATUSES,
  parseJsonOr,
  plainHeaders,
  readNodeBody,
  tooLarge,
} from '../node-body.js'
import type { EngineOptions, HttpRequestLike, HttpResponseLike, RegisteredContext } from '../types.js'

export type { IdempotencyContext, LedgerTransaction, Register, RegisteredContext, ReplayRequest, ReplayResponse } from '../types.js'

/**
 * What the middleware puts in `ctx.state`: `new Koa<IdempotencyState>()` types it for handlers, with
 * the transaction of the ledger named in `Register` as `tx` (`declare module 'idemkey/koa'`).
 */
export interface IdempotencyState {
  /** Set on covered requests: the key, scope, fencing token, takeover flag, lease signal. */
  idempotency?: RegisteredContext
}

/**
 * What the middleware hands on in `ctx.request` when no body parser ran before it (a body parser sets
 * the same fields): the body, parsed when it is JSON, and its text. `new Koa<IdempotencyState,
 * IdempotencyRequestContext>()` types them for handlers, without augmenting Koa's own `Request` (a body
 * parser's typings do that, each its own way).
 */
export interface IdempotencyRequestContext {
  request: { body?: unknown; rawBody?: string | undefined }
}

/**
 * Options of the middleware. `scope` receives Koa's `ctx`, so it sees what your authentication
 * middleware set (`(ctx) => ctx.state.user?.tenantId`).
 */
export type KoaIdempotencyOptions<Ctx = ParameterizedContext> = EngineOptions<Ctx>

/**
 * The middleware's type: a Koa middleware for any app and router, generic over their state, context
 * and body types, so it leaves them as they are.
 */
export type IdempotencyMiddleware = <StateT = DefaultState, ContextT = DefaultContext, ResponseBodyT = unknown>(
  ctx: ParameterizedContext<StateT, ContextT, ResponseBodyT>,
  next: Next,
) => Promise<void>

/** The body fields body parsers leave on `ctx.request` (koa-bodyparser, @koa/bodyparser, koa-body). */
type ParsedRequest = { body?: unknown; rawBody?: unknown }

/**
 * The middleware. Mount it after your body parser, or before any: without one it reads the body
 * itself (up to `maxRequestBody`) and hands it on as `ctx.request.body` (parsed when it is JSON) and
 * `ctx.request.rawBody`. The handler's response (`ctx.status`, headers, `ctx.body`) is stored once
 * `next()` resolves; a stream body is buffered to be stored.
 *
 * @example
 * app.use(idempotency({ ledger, scope: (ctx) => ctx.state.user.id }))
 * router.post('/charges', async (ctx) => { ctx.status = 201; ctx.body = charge(ctx.request.body) })
 */
export function idempotency<Ctx = ParameterizedContext>(options: KoaIdempotencyOptions<Ctx>): IdempotencyMiddleware {
  const engine = createEngine(options)
  return async function idempotencyMiddleware(context, next) {
    // Through unknown: an app may augment Koa's DefaultContext (@types/koa__multer adds file, files).
    const ctx = context as unknown as ParameterizedContext<IdempotencyState>
    if (!engine.applies(ctx.method, ctx.req.headers[engine.keyHeader] !== undefined)) return next()
    const decision = await engine.begin(requestLike(ctx))
    if (decision.kind === 'passthrough') return next()
    if (decision.kind === 'respond') return send(ctx, decision.response)
    ctx.state.idempotency = decision.context
    try {
      await next()
    } catch (error) {
      // A thrown error (ctx.throw included) is transient (docs/http.md, outcomes): release, and let Koa answer it.
      await decision.fail(error)
      throw error
    }
    if (ctx.respond === false) {
      // The handler wrote to ctx.res itself, past Koa: there is no response here to store.
      await decision.fail(new Error('The response bypassed Koa (ctx.respond = false), so it could not be stored.'))
      return
    }
    let captured: HttpResponseLike
    try {
      captured = await captureResponse(ctx)
    } catch (error) {
      await decision.fail(error)
      throw error
    }
    const answer = await decision.finish(captured)
    // Transactional mode, and the transaction did not commit: answer the engine's problem instead.
    if (answer !== captured) send(ctx, answer, true)
  }
}

function requestLike(ctx: ParameterizedContext): HttpRequestLike {
  const request = ctx.request as ParameterizedContext['request'] & ParsedRequest
  const req = ctx.req
  const raw = isBytes(request.rawBody)
  // A body parser read the stream: its raw text fingerprints exactly, else what it parsed.
  const consumed = req.readableEnded
  return {
    method: ctx.method,
    url: ctx.originalUrl,
    headers: distinctHeaders(req),
    native: ctx,
    parsedBody: !raw && consumed && request.body !== undefined && !isBytes(request.body) ? request.body : undefined,
    body: async (limit) => {
      if (raw) {
        const bytes = Buffer.from(request.rawBody as string | Buffer)
        if (bytes.byteLength > limit) throw tooLarge(limit)
        return bytes
      }
      if (consumed) return isBytes(request.body) ? Buffer.from(request.body as string | Buffer) : new Uint8Array(0)
      // A body that is not JSON is left in the stream too, for a parser mounted after the layer (@koa/multer).
      const bytes = await readNodeBody(req, limit, { keep: !isJsonType(req.headers['content-type']) })
      // Nothing read the body before us: hand it on, as body parsers do, so handlers (and a body parser
      // mounted after us, which skips a request whose body is set) still get it.
      if (request.body === undefined) request.body = parseJsonOr(bytes, req.headers['content-type'])
      if (request.rawBody === undefined) request.rawBody = Buffer.from(bytes).toString('utf8')
      return bytes
    },
  }
}

/** What Koa will send for this context, as bytes: it sends a string, a buffer, a stream, or JSON. */
async function captureResponse(ctx: ParameterizedContext): Promise<HttpResponseLike> {
  const status = ctx.status
  const headers = plainHeaders(ctx.response.headers)
  const body: unknown = ctx.body
  if (NULL_BODY_STATUSES.has(status) || ctx.method === 'HEAD') return { status, headers, body: new Uint8Array(0) }
  if (body === null || body === undefined) {
    if ((ctx.response as { _explicitNullBody?: boolean })._explicitNullBody) return { status, headers, body: new Uint8Array(0) }
    // Koa answers the status text as plain text.
    const text = ctx.req.httpVersionMajor >= 2 ? String(status) : ctx.message || String(status)
    return { status, headers: { ...headers, 'content-type': 'text/plain; charset=utf-8' }, body: Buffer.from(text) }
  }
  if (Buffer.isBuffer(body)) return { status, headers, body }
  if (typeof body === 'string') return { status, headers, body: Buffer.from(body) }
  const stream = streamOf(body)
  if (stream) {
    const chunks: Buffer[] = []
    for await (const chunk of stream) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as Uint8Array))
    const bytes = Buffer.concat(chunks)
    // The stream is read: Koa sends the bytes instead (same status and type).
    ctx.body = bytes
    return { status: ctx.status, headers: plainHeaders(ctx.response.headers), body: bytes }
  }
  return { status, headers, body: Buffer.from(JSON.stringify(body)) }
}

function streamOf(body: unknown): AsyncIterable<unknown> | undefined {
  if (body instanceof Readable || (typeof (body as { pipe?: unknown }).pipe === 'function' && Symbol.asyncIterator in (body as object))) {
    return body as AsyncIterable<unknown>
  }
  if (body instanceof ReadableStream) return Readable.fromWeb(body as import('node:stream/web').ReadableStream)
  if (body instanceof Blob) return Readable.fromWeb(body.stream() as import('node:stream/web').ReadableStream)
  if (body instanceof Response)
    return body.body ? Readable.fromWeb(body.body as import('node:stream/web').ReadableStream) : Readable.from([])
  return undefined
}

/** Answers a replay or a problem through Koa, so middleware around this one still sees it. */
function send(ctx: ParameterizedContext, response: HttpResponseLike, replace = false): void {
  if (replace) for (const name of Object.keys(ctx.response.headers)) ctx.remove(name)
  ctx.status = response.status
  for (const [name, value] of Object.entries(response.headers)) ctx.set(name, value)
  ctx.body = Buffer.from(response.body)
  // Koa types a Buffer body as application/octet-stream; a stored response without a type has none.
  if (response.headers['content-type'] === undefined) ctx.remove('Content-Type')
}
