/**
 * `idemkey/fetch`: idempotency for any `(Request) => Response` handler: Next.js route handlers, Bun,
 * Deno, workers, `@hono/node-server`'s fetch, undici servers.
 */
import type { Ledger } from '../../core/ledger.js'
import { createEngine } from '../engine.js'
import { headersRecord, readWebBody, toWebResponse } from '../node-body.js'
import type { EngineOptions, HttpRequestLike, IdempotencyContext, RegisteredContext } from '../types.js'

export type { IdempotencyContext, LedgerTransaction, Register, RegisteredContext, ReplayRequest, ReplayResponse } from '../types.js'

/**
 * Options of {@link withIdempotency}: every engine option but the ledger. `scope` receives the request
 * the handler takes (a fetch `Request`, or your framework's subclass of it, such as Next.js's `NextRequest`).
 */
export type FetchIdempotencyOptions<R extends Request = Request> = Omit<EngineOptions<R>, 'ledger'>

const contexts = new WeakMap<Request, IdempotencyContext>()

/**
 * The idempotency context of a request a wrapped handler is serving, or `undefined` when it is not
 * covered; `tx` is typed by the ledger named in `Register` (`declare module 'idemkey/fetch'`).
 */
export function getIdempotency(request: Request): RegisteredContext | undefined {
  return contexts.get(request) as RegisteredContext | undefined
}

/**
 * Wraps a fetch-style handler so each Idempotency-Key runs it once (docs/http.md). The handler's response
 * is buffered to be stored; extra arguments (a Next.js route context) pass through. The wrapper takes
 * the same request type and arguments as the handler (`NextRequest`, a typed route context).
 *
 * @example
 * export const POST = withIdempotency(ledger, async (request) => Response.json(await charge(await request.json()), { status: 201 }))
 */
export function withIdempotency<R extends Request, A extends unknown[]>(
  ledger: Ledger,
  handler: (request: R, ...rest: A) => Response | Promise<Response>,
  options: FetchIdempotencyOptions<R> = {},
): (request: R, ...rest: A) => Promise<Response> {
  const engine = createEngine<R>({ ...options, ledger })
  return async function idempotentHandler(request: R, ...rest: A): Promise<Response> {
    // Uncovered traffic gets the handler's own Response, unbuffered (streams and SSE stay streams).
    if (!engine.applies(request.method, request.headers.has(engine.keyHeader))) return handler(request, ...rest)
    const url = new URL(request.url)
    const neutral: HttpRequestLike = {
      method: request.method,
      url: url.pathname + url.search,
      headers: Object.fromEntries(request.headers),
      native: request,
      // Read a clone, so the handler can still read the original body.
      body: (limit) => readWebBody(request.clone().body, request.headers.get('content-length'), limit),
    }
    const response = await engine.handle(neutral, async (ctx) => {
      if (ctx) contexts.set(request, ctx)
      const result = await handler(request, ...rest)
      return { status: result.status, headers: headersRecord(result.headers), body: new Uint8Array(await result.arrayBuffer()) }
    })
    return toWebResponse(response)
  }
}
