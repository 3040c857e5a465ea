import { type CallHandler, type ExecutionContext, Inject, Injectable, type NestInterceptor } from '@nestjs/common'
import { Reflector } from '@nestjs/core'
import { from, type Observable, of } from 'rxjs'
import { mergeMap } from 'rxjs/operators'
import { createEngine, type IdempotencyEngine } from '../engine.js'
import { abandonAfter, attachContext, capture, holdUntilCommit } from '../node-response.js'
import type { Decision, HttpResponseLike, IdempotencyContext } from '../types.js'
import { IDEMPOTENCY_OPTIONS, IDEMPOTENT_METADATA, type IdempotencyModuleOptions, type RouteIdempotency } from './options.js'
import { handlesResponse, platformOf } from './platform.js'

/** Marks a request one interceptor took on, so a second one on the same route (global and per route) lets it be. */
const TAKEN = Symbol.for('idemkey:nestjs:taken')
/** What NestJS (11.1+) sets on a request its pipes rejected: the handler did not run. */
const REJECTED_BY_PIPES = Symbol.for('nestjs:rejected-by-pipes')

/** What Express's `req` and Fastify's `request` both have, and the marks the interceptor reads and sets. */
type PlatformRequest = {
  method: string
  headers: Record<string, string | string[] | undefined>
  [TAKEN]?: boolean
  [REJECTED_BY_PIPES]?: boolean
  idempotency?: IdempotencyContext
}

/**
 * Runs the idempotency engine around a route handler (docs/http.md). Guards run before it, so a request they
 * refuse never touches the ledger. Whatever the handler answers (a returned value NestJS serializes, an
 * exception a filter turns into a response, `@Res()`), the bytes the platform writes are what is stored;
 * a replay sends those bytes again, with `Idempotent-Replayed: true`.
 *
 * Bind it with `IdempotencyModule.forRoot({ …, global: true })`, `@Idempotent()`, or
 * `@UseInterceptors(IdempotencyInterceptor)`.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  readonly #options: IdempotencyModuleOptions<unknown>
  /** The module's `abandonAfterMs`, checked once; a route's own was checked by `@Idempotent(...)`. */
  readonly #abandonAfterMs: number
  readonly #reflector: Reflector
  readonly #engine: IdempotencyEngine
  readonly #perRoute = new WeakMap<object, IdempotencyEngine>()
  readonly #handlers = new WeakMap<object, boolean>()

  constructor(@Inject(IDEMPOTENCY_OPTIONS) options: IdempotencyModuleOptions<unknown>, @Inject(Reflector) reflector: Reflector) {
    this.#abandonAfterMs = abandonAfter(options.abandonAfterMs)
    this.#options = options
    this.#reflector = reflector
    this.#engine = createEngine(options)
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() !== 'http') return next.handle()
    const http = context.switchToHttp()
    const request = http.getRequest<PlatformRequest>()
    if (request[TAKEN]) return next.handle()
    const route = this.#reflector.getAllAndOverride<RouteIdempotency | undefined>(IDEMPOTENT_METADATA, [
      context.getHandler(),
      context.getClass(),
    ])
    const engine = this.#engineFor(route)
    if (!engine) return next.handle()
    // Uncovered traffic (GETs, keyless POSTs) goes straight on, with nothing allocated for it.
    if (!engine.applies(request.method, request.headers[engine.keyHeader] !== undefined)) return next.handle()
    request[TAKEN] = true
    const platform = platformOf(request, http.getResponse())
    return from(engine.begin(platform.requestLike())).pipe(
      mergeMap((decision): Observable<unknown> => {
        if (decision.kind === 'passthrough') return next.handle()
        if (decision.kind === 'respond') {
          if (!this.#answersItself(context)) return of(platform.answer(decision.response))
          platform.send(decision.response)
          return of(undefined)
        }
        attachContext(request, decision.context)
        const options = { ...this.#options, ...(route || {}) }
        const abandonAfterMs = (route ? route.abandonAfterMs : undefined) ?? this.#abandonAfterMs
        const finish = settleUnlessRejected(request, decision)
        if (options.transactional) holdUntilCommit(platform.rawResponse, abandonAfterMs, finish, decision.fail)
        else capture(platform.rawResponse, abandonAfterMs, options.maxStoredBody ?? 1024 * 1024, finish, decision.fail)
        return next.handle()
      }),
    )
  }

  #answersItself(context: ExecutionContext): boolean {
    const handler = context.getHandler()
    let answers = this.#handlers.get(handler)
    if (answers === undefined) {
      answers = handlesResponse(context.getClass(), handler.name)
      this.#handlers.set(handler, answers)
    }
    return answers
  }

  #engineFor(route: RouteIdempotency | undefined): IdempotencyEngine | undefined {
    if (route === false) return undefined
    if (route === undefined) return this.#engine
    let engine = this.#perRoute.get(route)
    if (!engine) {
      // `@Idempotent()` without options is the module's engine.
      engine = Object.keys(route).length === 0 ? this.#engine : createEngine({ ...this.#options, ...route })
      this.#perRoute.set(route, engine)
    }
    return engine
  }
}

/**
 * NestJS runs pipes (validation) after interceptors, inside `next.handle()`: a request they reject never
 * reached the handler, so its `400` is not an outcome to store. The record is released instead, as if
 * the layer had never seen it (work rejected before the handler runs never touches the ledger: docs/ledger.md).
 */
function settleUnlessRejected(
  request: PlatformRequest,
  decision: Extract<Decision, { kind: 'execute' }>,
): (response: HttpResponseLike) => Promise<HttpResponseLike> {
  return async (response) => {
    if (request[REJECTED_BY_PIPES] !== true) return decision.finish(response)
    await decision.fail(new Error('The request was rejected by a pipe before its handler ran.'))
    return response
  }
}
