import type { Acquired, Begun } from '../core/ledger.js'
import { IdempotencyError, isIdempotencyError } from '../errors.js'
import { parseKeyHeader } from '../protocol/key-header.js'
import { decisionFromError, fencedOut, MISCONFIGURED_DETAIL, Reporter, type Settled, settledResponse } from './engine-answers.js'
import { type EngineInternals, resolveEngineConfig } from './engine-config.js'
import { executeInTransaction, type SettledAnswers } from './engine-transaction.js'
import type { Decision, EngineOptions, HttpRequestLike, HttpResponseLike, IdempotencyContext } from './types.js'

export type { EngineInternals } from './engine-config.js'

/** The neutral HTTP layer: every rule of docs/http.md, once, for every adapter. */
export interface IdempotencyEngine {
  /**
   * The header that carries the key (the `keyHeader` option), lower-cased as Node's header records
   * name it: adapters look it up to tell {@link applies} whether a request has one.
   */
  readonly keyHeader: string
  /**
   * Whether a request needs the layer at all: a covered method that carries a key (in
   * {@link keyHeader}), or whose route requires one. Synchronous and allocation-free, so adapters let
   * other traffic (GETs, keyless POSTs) straight through without building a neutral request.
   */
  applies(method: string, hasKey: boolean): boolean
  /** Decides what to do with a request before the handler runs (for adapters that run the handler themselves). */
  begin(req: HttpRequestLike): Promise<Decision>
  /**
   * Runs one request through the layer's rules (docs/http.md): `next` runs the real handler and returns its captured response.
   * Resolves with the response to send: the handler's own when it ran, else a replay or a problem.
   */
  handle(req: HttpRequestLike, next: (ctx: IdempotencyContext | undefined) => Promise<HttpResponseLike>): Promise<HttpResponseLike>
}

/**
 * Creates the engine the adapters share: the options are resolved once (engine-config.ts), answers that
 * do not run the handler come from engine-answers.ts, and `transactional: true` runs through
 * engine-transaction.ts. What stays here is the order of a request's steps.
 *
 * @example
 * const engine = createEngine({ ledger, required: true })
 * const response = await engine.handle(request, (ctx) => runHandler(request, ctx))
 */
export function createEngine<Req = HttpRequestLike>(options: EngineOptions<Req>, internals: EngineInternals = {}): IdempotencyEngine {
  const config = resolveEngineConfig(options, internals)
  const { ledger, methods, header, keyHeader, scopeOf, fingerprintOf, maxRequestBody, runOptions, onEvent, onReplay } = config
  const reporter = new Reporter(onEvent)

  async function begin(req: HttpRequestLike): Promise<Decision> {
    if (!methods.has(req.method.toUpperCase())) return { kind: 'passthrough' }
    // Timed only for a listener: without one the layer costs what it did.
    const startedAtMs = onEvent ? performance.now() : 0
    let key: string | undefined
    let scope: string
    let fingerprint: string
    try {
      key = parseKeyHeader(req.headers[keyHeader], header)
      if (key === undefined) {
        if (!config.required) return { kind: 'passthrough' }
        throw new IdempotencyError(
          'KEY_MISSING',
          `${req.method.toUpperCase()} ${req.url.split('?')[0]} requires an ${header} header (for example a UUID), the same on every retry of one request.`,
        )
      }
      try {
        // The default scope is synchronous: no await, so no extra microtask turn on every request.
        const scoped = scopeOf(req)
        scope = typeof scoped === 'string' ? scoped : await scoped
      } catch (error) {
        if (!isIdempotencyError(error) || error.code !== 'INVALID_OPTION') throw error
        reporter.configError(key, error)
        if (onEvent) reporter.answered(key, 'rejected', 500, startedAtMs)
        return { kind: 'respond', response: config.render('INVALID_OPTION', MISCONFIGURED_DETAIL), outcome: 'rejected' }
      }
      if (req.parsedBody !== undefined && Number(headerValue(req.headers['content-length'])) > maxRequestBody) {
        throw new IdempotencyError(
          'BODY_TOO_LARGE',
          `The request body is larger than ${maxRequestBody} bytes, the most the idempotency layer fingerprints. Send a smaller body, or raise maxRequestBody.`,
        )
      }
      const body = req.parsedBody !== undefined ? new Uint8Array(0) : await req.body(maxRequestBody)
      fingerprint = fingerprintOf(req, body)
    } catch (error) {
      const decision = decisionFromError(config, error)
      // A key that did not parse is reported as ''.
      if (decision?.kind === 'respond' && onEvent) reporter.answered(key ?? '', 'rejected', decision.response.status, startedAtMs)
      if (decision) return decision
      throw error
    }
    const runFor = config.runOptionsOf ? { ...runOptions, ...config.runOptionsOf(req) } : runOptions
    if (config.transactional) return executeInTransaction(config, reporter, answers, { req, key, scope, fingerprint, startedAtMs }, runFor)
    // Inline, not a function of its own: an async call returned from an async function costs three
    // more turns of the microtask queue on every request.
    let begun: Begun<HttpResponseLike>
    try {
      begun = await ledger.begin({ key, scope, fingerprint }, runFor)
    } catch (error) {
      return failed(key, error, startedAtMs)
    }
    if (begun.kind !== 'acquired') return answer(req, key, scope, begun, startedAtMs)
    return executing(begun, key, startedAtMs)
  }

  /** The ledger's answer when it did not hand the record over: a replay, a mismatch, still in flight. */
  async function answer(req: HttpRequestLike, key: string, scope: string, result: Settled, startedAtMs: number): Promise<Decision> {
    const response = settledResponse(config, result, key)
    if (onEvent) reporter.answered(key, result.kind, response.status, startedAtMs)
    if (onReplay && result.kind === 'replayed') await onReplay({ method: req.method, url: req.url, key, scope }, response)
    return { kind: 'respond', response, outcome: result.kind }
  }

  /**
   * The ledger refused before the handler ran: the store is down (a 503, or a pass-through with failOpen)
   * or the input is bad (a 400 reported as `rejected`, e.g. a scope the store cannot hold).
   */
  function failed(key: string, error: unknown, startedAtMs: number): Decision {
    const decision = decisionFromError(config, error)
    if (decision?.kind === 'respond' && onEvent)
      reporter.answered(key, decision.outcome ?? 'store_unavailable', decision.response.status, startedAtMs)
    if (decision) return decision
    throw error
  }

  const answers: SettledAnswers = { answer, failed }

  /**
   * The handler runs between `begin` and `finish`: the ledger hands the record over, the adapter runs the
   * handler, and the response settles the record (a store failure there is the ledger's to report; the
   * client still gets the handler's response).
   */
  function executing(held: Acquired<HttpResponseLike>, key: string, startedAtMs: number): Decision {
    return {
      kind: 'execute',
      context: held.context,
      finish: (response) => {
        const done = (sent: HttpResponseLike) => {
          if (onEvent) reporter.answered(key, 'executed', sent.status, startedAtMs)
          return sent
        }
        return held.finish(response).then(
          (result) =>
            result.kind === 'executed' && result.outcome === 'fenced_out'
              ? done(fencedOut(config, key, 'answer was not kept'))
              : done(response),
          () => done(response),
        )
      },
      fail: (error) => held.fail(error).catch(() => {}),
    }
  }

  return {
    keyHeader,
    applies: (method, hasKey) => (hasKey || config.required) && methods.has(method.toUpperCase()),
    begin,
    async handle(req, next) {
      const decision = await begin(req)
      if (decision.kind === 'passthrough') return next(undefined)
      if (decision.kind === 'respond') return decision.response
      let response: HttpResponseLike
      try {
        response = await next(decision.context)
      } catch (error) {
        await decision.fail(error)
        throw error
      }
      return decision.finish(response)
    },
  }
}

function headerValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value
}
