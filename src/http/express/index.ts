/**
 * `idemkey/express`: idempotency middleware for Express 4 and 5. Mount it after your body parser;
 * the handler reads the context as `req.idempotency`.
 */
import type { ServerResponse } from 'node:http'
import type { Request as ExpressRequest, NextFunction, Response } from 'express'
import { createEngine } from '../engine.js'
import { abandonAfter, attachContext, capture, holdUntilCommit, sendNode } from '../node-response.js'
import type { EngineOptions, IdempotencyContext, RegisteredContext } from '../types.js'
import { type BodyCarrier, expressRequestLike } from './request.js'

export type { IdempotencyContext, LedgerTransaction, Register, RegisteredContext, ReplayRequest, ReplayResponse } from '../types.js'

declare global {
  namespace Express {
    interface Request {
      /**
       * Set by idemkey on covered requests: the key, scope, fencing token, takeover flag, lease signal,
       * and with `transactional: true` the transaction as `tx` (typed by the ledger named in `Register`).
       */
      idempotency?: RegisteredContext
    }
  }
}

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

/**
 * The middleware's type: an Express `RequestHandler` for whatever route it is mounted on. It is generic,
 * so it takes the route's own types (path parameters, body, query, locals) instead of imposing its own:
 * the next handler's `req.body` stays what Express would make it without idemkey.
 */
export type IdempotencyMiddleware = <
  P,
  ResBody,
  ReqBody,
  ReqQuery,
  // biome-ignore lint/suspicious/noExplicitAny: the constraint Express puts on locals
  Locals extends Record<string, any>,
>(
  req: ExpressRequest<P, ResBody, ReqBody, ReqQuery, Locals>,
  res: Response<ResBody, Locals>,
  next: NextFunction,
) => void

/**
 * The middleware. The handler's response streams to the client as usual (`res.json`, `res.send`,
 * `res.write` + `res.end`, piped streams); a copy is kept to store for replays.
 *
 * @example
 * app.post('/charges', express.json(), idempotency({ ledger, required: true }), (req, res) => res.status(201).json(charge(req.body)))
 */
export function idempotency(options: ExpressIdempotencyOptions): IdempotencyMiddleware {
  const engine = createEngine(options)
  const abandonAfterMs = abandonAfter(options.abandonAfterMs)
  const keepAtMost = options.maxStoredBody ?? 1024 * 1024
  return function idempotencyMiddleware(request, response, next) {
    const req = request as unknown as BodyCarrier & { idempotency?: IdempotencyContext }
    const res = response as unknown as ServerResponse
    if (!engine.applies(req.method ?? 'GET', req.headers[engine.keyHeader] !== undefined)) return next()
    engine.begin(expressRequestLike(req)).then(
      (decision) => {
        if (decision.kind === 'passthrough') return next()
        if (decision.kind === 'respond') return sendNode(res, decision.response)
        attachContext(req, decision.context)
        if (options.transactional) holdUntilCommit(res, abandonAfterMs, decision.finish, decision.fail)
        else capture(res, abandonAfterMs, keepAtMost, decision.finish, decision.fail)
        next()
      },
      (error: unknown) => next(error),
    )
  }
}
