/**
 * `idemkey/hono`: idempotency middleware for Hono. The handler reads the context as
 * `c.get('idempotency')`, typed through {@link IdempotencyVariables}.
 */

import type { IncomingMessage } from 'node:http'
import type { Context, Env, MiddlewareHandler } from 'hono'
import type { Ledger } from '../../core/ledger.js'
import { createEngine } from '../engine.js'
import { distinctHeaders, headersRecord, readWebBody, tooLarge, toWebResponse } from '../node-body.js'
import type { EngineOptions, HttpRequestLike, IdempotencyContext, LedgerTransaction, RegisteredContext } from '../types.js'

export type { IdempotencyContext, LedgerTransaction, Register, RegisteredContext, ReplayRequest, ReplayResponse } from '../types.js'

/**
 * Context variables the middleware sets: `c.get('idempotency')`, whose `tx` is the transaction of the
 * middleware's ledger (`Tx`: named in `Register` when the app's own `Hono<{ Variables: … }>` declares it).
 */
export type IdempotencyVariables<Tx = RegisteredContext['tx']> = { idempotency: IdempotencyContext<Tx> | undefined }

/**
 * Options of the middleware. `scope` receives Hono's `Context`, typed with your app's `Env` when you
 * name it: `idempotency<AppEnv>({ ledger, scope: (c) => c.get('jwtPayload').sub })`.
 */
export type HonoIdempotencyOptions<E extends Env = Env, L extends Ledger = Ledger> = Omit<EngineOptions<Context<E>>, 'ledger'> & {
  ledger: L
}

/**
 * The middleware. It adds only its own variable to the app's `Env`, so the handlers after it keep their
 * bindings, variables, path parameters and validated input.
 *
 * @example
 * const app = new Hono<{ Variables: IdempotencyVariables }>()
 * app.post('/charges', idempotency({ ledger }), async (c) => c.json(await charge(await c.req.json()), 201))
 */
export function idempotency<E extends Env = Env, L extends Ledger = Ledger>(
  options: HonoIdempotencyOptions<E, L>,
): MiddlewareHandler<{ Variables: IdempotencyVariables<LedgerTransaction<L>> }> {
  const engine = createEngine(options)
  return async function idempotencyMiddleware(c, next) {
    const raw = c.req.raw
    if (!engine.applies(raw.method, raw.headers.has(engine.keyHeader))) {
      c.set('idempotency', undefined)
      await next()
      return
    }
    const url = new URL(raw.url)
    const incoming = nodeRequest(c.env)
    const neutral: HttpRequestLike = {
      method: raw.method,
      url: url.pathname + url.search,
      headers: incoming?.rawHeaders ? distinctHeaders(incoming as IncomingMessage) : Object.fromEntries(raw.headers),
      native: c,
      // A clone: the handler can still read the body with c.req.json() / c.req.text(). A body that
      // middleware before this one read through c.req (a validator, a signature check) cannot be
      // cloned: Hono keeps it, and hands it over again.
      body: (limit) => (raw.bodyUsed ? readCachedBody(c, limit) : readWebBody(raw.clone().body, raw.headers.get('content-length'), limit)),
    }
    const decision = await engine.begin(neutral)
    if (decision.kind === 'passthrough') {
      c.set('idempotency', undefined)
      await next()
      return
    }
    if (decision.kind === 'respond') return toWebResponse(decision.response)
    c.set('idempotency', decision.context as IdempotencyContext<LedgerTransaction<L>>)
    await next()
    if (c.error) {
      // Hono turned the handler's error into a 500 already: release the record.
      await decision.fail(c.error)
      return
    }
    const response = c.res
    let body: Uint8Array
    try {
      body = new Uint8Array(await response.arrayBuffer())
    } catch (error) {
      // The handler's stream failed: nothing to store. Release the record (else it stays held, its
      // lease renewed, for good) and let Hono answer the error.
      await decision.fail(error)
      throw error
    }
    const captured = { status: response.status, headers: headersRecord(response.headers), body }
    // The handler's response, or a problem when its transaction did not commit (transactional mode).
    const answer = await decision.finish(captured)
    // Reset first, so Hono does not merge the old response's headers into the new one.
    c.res = undefined as unknown as Response
    c.res = toWebResponse(answer)
  }
}

/**
 * The body Hono kept after middleware read it (`c.req.text()`, `c.req.json()`, a validator). Kept
 * only as form data, it is not the client's bytes (Hono re-encodes it with a new boundary each time),
 * so it would fingerprint every retry differently; read from `c.req.raw`, it is gone: refused instead.
 */
async function readCachedBody(c: Context, limit: number): Promise<Uint8Array> {
  const first = Object.keys(c.req.bodyCache)[0]
  if (first !== 'text' && first !== 'arrayBuffer' && first !== 'blob') {
    throw new Error(
      'idemkey/hono: middleware before idempotency() read the request body in a way that does not keep its bytes (c.req.raw directly, c.req.formData(), c.req.parseBody()), so the request cannot be fingerprinted. Mount idempotency() before it.',
    )
  }
  const bytes = new Uint8Array(await c.req.arrayBuffer())
  if (bytes.byteLength > limit) throw tooLarge(limit)
  return bytes
}

/**
 * On @hono/node-server, `c.env.incoming` is Node's request, whose raw headers keep a repeated
 * Idempotency-Key apart (a fetch Headers object joins them into one value).
 */
function nodeRequest(env: unknown): { rawHeaders?: string[] } | undefined {
  return (env as { incoming?: { rawHeaders?: string[] } } | undefined)?.incoming
}
