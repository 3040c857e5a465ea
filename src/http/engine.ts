import { parseDuration } from '../core/duration.js'
import type { Acquired, Begun, Ledger, RunOptions, RunResult, TransactionContext } from '../core/ledger.js'
import { classifyStatus } from '../core/outcome.js'
import { isTransactionalStore } from '../core/store.js'
import { IdempotencyError, isIdempotencyError } from '../errors.js'
import { keyHeaderName, parseKeyHeader } from './key-header.js'
import { DEFAULT_PROBLEM_BASE, problem } from './problem.js'
import { credentialScope, functionScope, resolveScopeSecret } from './scope.js'
import { fromStored, requestFingerprint, storedHeaderSet, toStored } from './stored.js'
import type { AnswerOutcome, Decision, EngineEvent, EngineOptions, HttpRequestLike, HttpResponseLike, IdempotencyContext } from './types.js'

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

const MiB = 1024 * 1024
const storeDownDetail = (header: string) =>
  `The idempotency store is unavailable right now, so this request was not run. Retry with the same ${header} after the Retry-After delay.`
const MISCONFIGURED_DETAIL =
  'The server could not tell which account this request belongs to (its idempotency scope is misconfigured), so it was not run. This is not something a retry fixes; contact the API operator.'

/** The first thing that happens to a request in the ledger. */
type Step = { ctx: IdempotencyContext } | { result: RunResult<HttpResponseLike> } | { error: unknown }

/** A ledger answer that did not run the handler. */
type Settled = Exclude<RunResult<HttpResponseLike>, { kind: 'executed' }>

/**
 * Creates the engine the adapters share.
 *
 * @example
 * const engine = createEngine({ ledger, required: true })
 * const response = await engine.handle(request, (ctx) => runHandler(request, ctx))
 */
/** What idemkey's own front ends (the proxy) set beyond the public options. */
export interface EngineInternals {
  /** Replaces the scope rule with one that namespaces its own scopes (e.g. the proxy's trusted header). */
  scopeOf?: (req: HttpRequestLike) => string
  /** Run options of one request on top of the engine's (a Lambda invocation's deadline). */
  runOptionsOf?: (req: HttpRequestLike) => Partial<RunOptions<HttpResponseLike>>
}

export function createEngine<Req = HttpRequestLike>(options: EngineOptions<Req>, internals: EngineInternals = {}): IdempotencyEngine {
  if (!options?.ledger || typeof options.ledger.begin !== 'function' || typeof options.ledger.run !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'idempotency({ ledger }) needs a Ledger: new Ledger({ store }).')
  }
  const ledger: Ledger = options.ledger
  if (options.transactional && !isTransactionalStore(ledger.store)) {
    // Said once at start-up, not as a failure of every request.
    throw new IdempotencyError(
      'INVALID_OPTION',
      `transactional: true needs a store that runs transactions (PostgresStore, MySqlStore); ${ledger.store.name} does not. Drop the option or change the store.`,
    )
  }
  const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()))
  const { name: header, lower: keyHeader } = keyHeaderName(options.keyHeader)
  const storeDown = storeDownDetail(header)
  const onReplay = options.onReplay
  const allow = storedHeaderSet(options.storedHeaders)
  const maxStoredBody = options.maxStoredBody ?? MiB
  const maxRequestBody = options.maxRequestBody ?? MiB
  const base = options.problemBaseUrl ?? DEFAULT_PROBLEM_BASE
  const classify = options.classify ?? classifyStatus
  const scopeFn = options.scope
  // Only the default scope needs the secret, so only it warns when none is set.
  const secret = scopeFn || internals.scopeOf ? undefined : resolveScopeSecret(options.scopeSecret)
  const scopeOf = internals.scopeOf
    ? internals.scopeOf
    : scopeFn
      ? async (req: HttpRequestLike) => functionScope(await scopeFn((req.native ?? req) as Req))
      : (req: HttpRequestLike) => credentialScope(req.headers, secret as string | Uint8Array)
  const onEvent = options.onEvent
  let configErrorLogged = false
  const configError = (key: string, error: Error) => {
    if (onEvent) {
      try {
        onEvent({ type: 'config_error', key, error })
      } catch {
        // A broken hook must not break the answer.
      }
    } else if (!configErrorLogged) {
      // Every covered request fails the same way until it is fixed: say it once, where someone looks.
      configErrorLogged = true
      console.error(`idemkey: ${error.message}`)
    }
  }
  /** Reports how a covered request was answered; only called when there is an `onEvent`. */
  const answered = (key: string, outcome: AnswerOutcome, status: number, startedAtMs: number) => {
    try {
      ;(onEvent as (event: EngineEvent) => void)({
        type: 'answered',
        key,
        outcome,
        status,
        durationMs: Math.round((performance.now() - startedAtMs) * 100) / 100,
      })
    } catch {
      // A broken hook must not break the answer.
    }
  }
  const fingerprintOf = options.fingerprint ?? requestFingerprint
  const runOptions: RunOptions<HttpResponseLike> = {
    encode: (response) => toStored(response, allow, maxStoredBody),
    decode: (stored) => fromStored(stored, base),
    classify: (response) => classify(response.status),
    wait: options.wait === undefined ? undefined : parseDuration(options.wait, 'wait'),
    lease: options.lease === undefined ? undefined : parseDuration(options.lease, 'lease'),
    ttl: options.ttl === undefined ? undefined : parseDuration(options.ttl, 'ttl'),
    onEvent: onEvent as ((event: EngineEvent) => void) | undefined,
    reconcile: options.reconcile,
  }

  const settled = (result: Settled, key: string): HttpResponseLike => {
    switch (result.kind) {
      case 'replayed':
        return result.value
      case 'mismatch':
        return problem(
          'FINGERPRINT_MISMATCH',
          `The ${header} "${key}" was already used with a different request (method, path or body). Use a new key for a new request.`,
          base,
          {},
          header,
        )
      case 'in_progress':
        return problem(
          'IN_PROGRESS',
          `A request with the ${header} "${key}" is still being processed. Retry after the Retry-After delay with the same key.`,
          base,
          { 'retry-after': String(Math.max(1, Math.ceil(result.retryAfterMs / 1_000))) },
          header,
        )
    }
  }

  const fromError = (error: unknown): Decision | undefined => {
    if (!isIdempotencyError(error)) return undefined
    switch (error.code) {
      case 'STORE_UNAVAILABLE':
      case 'STORE_SCHEMA':
        if (options.failOpen) return { kind: 'passthrough' }
        // The store's own message (addresses, roles, driver hints) is for the operator: it went to
        // onEvent as a store_error. The client learns only what to do.
        return {
          kind: 'respond',
          response: problem(error.code, storeDown, base, { 'retry-after': '1' }, header),
          outcome: 'store_unavailable',
        }
      case 'KEY_INVALID':
      case 'KEY_MISSING':
      case 'SCOPE_INVALID':
      case 'BODY_TOO_LARGE':
      case 'BODY_INVALID':
        return { kind: 'respond', response: problem(error.code, error.message, base, {}, header), outcome: 'rejected' }
      default:
        return undefined
    }
  }

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
        if (!options.required) return { kind: 'passthrough' }
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
        configError(key, error)
        if (onEvent) answered(key, 'rejected', 500, startedAtMs)
        return { kind: 'respond', response: problem('INVALID_OPTION', MISCONFIGURED_DETAIL, base, {}, header), outcome: 'rejected' }
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
      const decision = fromError(error)
      // A key that did not parse is reported as ''.
      if (decision?.kind === 'respond' && onEvent) answered(key ?? '', 'rejected', decision.response.status, startedAtMs)
      if (decision) return decision
      throw error
    }
    const runFor = internals.runOptionsOf ? { ...runOptions, ...internals.runOptionsOf(req) } : runOptions
    if (options.transactional) return executeInTransaction(req, key, scope, fingerprint, startedAtMs, runFor)
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
    const response = settled(result, key)
    if (onEvent) answered(key, result.kind, response.status, startedAtMs)
    if (onReplay && result.kind === 'replayed') await onReplay({ method: req.method, url: req.url, key, scope }, response)
    return { kind: 'respond', response, outcome: result.kind }
  }

  /** The ledger failed before the handler ran (the store is down): a 503, or a pass-through with failOpen. */
  function failed(key: string, error: unknown, startedAtMs: number): Decision {
    const decision = fromError(error)
    if (decision?.kind === 'respond' && onEvent) answered(key, 'store_unavailable', decision.response.status, startedAtMs)
    if (decision) return decision
    throw error
  }

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
          if (onEvent) answered(key, 'executed', sent.status, startedAtMs)
          return sent
        }
        return held.finish(response).then(
          (result) =>
            // Another attempt took over while this one ran (this one stalled past its lease): its outcome
            // is the one stored and replayed, so this one's response is not sent, or the same key would
            // get two different answers. The retry gets the outcome that counts.
            result.kind === 'executed' && result.outcome === 'fenced_out'
              ? done(
                  problem(
                    'FENCED_OUT',
                    `Another attempt with the ${header} "${key}" took over while this one ran, so this one's answer was not kept. Retry with the same key to get the outcome that counts.`,
                    base,
                    { 'retry-after': '1' },
                    header,
                  ),
                )
              : done(response),
          () => done(response),
        )
      },
      fail: (error) => held.fail(error).catch(() => {}),
    }
  }

  /**
   * With `transactional: true` the handler runs inside the ledger's transaction callback: whichever
   * comes first, the ledger hands the record over (run the handler) or settles without running it.
   */
  async function executeInTransaction(
    req: HttpRequestLike,
    key: string,
    scope: string,
    fingerprint: string,
    startedAtMs: number,
    runFor: RunOptions<HttpResponseLike>,
  ): Promise<Decision> {
    let finishHandler: (response: HttpResponseLike) => void = () => {}
    let failHandler: (error: unknown) => void = () => {}
    const handlerDone = new Promise<HttpResponseLike>((resolve, reject) => {
      finishHandler = resolve
      failHandler = reject
    })
    // Whichever comes first: the ledger hands us the record (run the handler), or it settles without
    // running it (replay, mismatch, still in flight) or fails (store down).
    let first: (step: Step) => void = () => {}
    const firstStep = new Promise<Step>((resolve) => {
      first = resolve
    })
    const work = (ctx: TransactionContext<unknown>): Promise<HttpResponseLike> => {
      first({ ctx })
      return handlerDone
    }
    const running = ledger.runInTransaction({ key, scope, fingerprint }, work as never, runFor)
    // Also keeps a rejection from being unhandled: finish() and fail() read `running` again later.
    void running.then(
      (result) => first({ result }),
      (error: unknown) => first({ error }),
    )
    const step = await firstStep
    if ('error' in step) return failed(key, step.error, startedAtMs)
    // A run that settled before handing the record over did not execute.
    if ('result' in step) return answer(req, key, scope, step.result as Settled, startedAtMs)
    return {
      kind: 'execute',
      context: step.ctx,
      finish: async (response) => {
        const sent = await settle(response)
        if (onEvent) answered(key, 'executed', sent.status, startedAtMs)
        return sent
      },
      fail: async (error) => {
        failHandler(error)
        await running.catch(() => {})
      },
    }

    async function settle(response: HttpResponseLike): Promise<HttpResponseLike> {
      finishHandler(response)
      const result = await running.catch((error: unknown) => ({ kind: 'error' as const, error }))
      if (result.kind === 'error') {
        // Why it did not commit is for the operator (onEvent); the client learns what to do.
        return problem(
          'STORE_UNAVAILABLE',
          `The request's transaction did not commit, so none of its writes were kept. Retry with the same ${header}.`,
          base,
          { 'retry-after': '1' },
          header,
        )
      }
      if (result.kind === 'executed' && result.outcome === 'fenced_out') {
        return problem(
          'FENCED_OUT',
          `Another attempt with the ${header} "${key}" took over while this one ran, so this one's writes were rolled back. Retry with the same key to get the outcome that counts.`,
          base,
          { 'retry-after': '1' },
          header,
        )
      }
      return response
    }
  }

  return {
    keyHeader,
    applies: (method, hasKey) => (hasKey || options.required === true) && methods.has(method.toUpperCase()),
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
