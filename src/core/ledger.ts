import { IdempotencyError } from '../errors.js'
import { Attempt, STEPS } from './attempt.js'
import { assertClock, type Clock, systemClock } from './clock.js'
import { parsePositiveDuration, runDuration } from './duration.js'
import { fingerprintOf } from './fingerprint.js'
import { Held } from './held.js'
import type {
  Begun,
  FailedWrites,
  Intent,
  IntentContext,
  LedgerEvent,
  LedgerOptions,
  LedgerTelemetry,
  RunOptions,
  RunResult,
  RunTelemetry,
  Settled,
  TransactionContext,
} from './ledger-types.js'
import { DEFAULT_SCOPE } from './ledger-types.js'
import { classifyStatus } from './outcome.js'
import { Renewal } from './renewal.js'
import {
  type AcquireResult,
  type IdempotencyStore,
  isTransactionalStore,
  type Outcome,
  type StoredResponse,
  type TransactionalStore,
} from './store.js'
import { leaseFor, type Plan, type RunLimits, StoreCalls } from './store-calls.js'
import { assertFingerprint, assertFunctions, assertIdentity, assertMethods } from './validate.js'
import { Waiter } from './waiter.js'

export type {
  Acquired,
  Begun,
  ExecutedOutcome,
  FailedWrites,
  Intent,
  IntentContext,
  LedgerEvent,
  LedgerOptions,
  LedgerTelemetry,
  RunOptions,
  RunResult,
  RunTelemetry,
  TransactionContext,
} from './ledger-types.js'
export { DEFAULT_SCOPE } from './ledger-types.js'

type TxOf<S> = S extends TransactionalStore<infer Tx> ? Tx : never

const encoder = new TextEncoder()
const decoder = new TextDecoder()
const FIRST_POLL_MS = 20
const MAX_POLL_MS = 250

function encodeJson(value: unknown): StoredResponse {
  return {
    status: 200,
    headers: { 'content-type': 'application/json' },
    body: encoder.encode(JSON.stringify(value === undefined ? null : value)),
  }
}

function decodeJson<T>(response: StoredResponse): T {
  return JSON.parse(decoder.decode(response.body)) as T
}

/** Thrown inside a store transaction to roll it back without an error reaching the caller. */
class Rollback {
  constructor(
    readonly reason: 'transient' | 'fenced_out',
    readonly response: StoredResponse,
    readonly value: unknown,
  ) {}
}

/**
 * Runs each intent once, whatever the network does: atomic acquire, a lease renewed while the work
 * runs, replay of stored outcomes, rejection of a reused key with another payload, and release of
 * transient failures (docs/ledger.md).
 *
 * @example
 * const ledger = new Ledger({ store: new SqliteStore({ path: 'idemkey.db' }) })
 * const result = await ledger.run({ key, payload: order }, () => charge(order))
 * if (result.kind === 'executed' || result.kind === 'replayed') return result.value
 */
export class Ledger<S extends IdempotencyStore = IdempotencyStore> {
  readonly store: S
  readonly clock: Clock
  readonly leaseMs: number
  readonly ttlMs: number
  readonly waitMs: number
  readonly #telemetry: LedgerTelemetry | undefined
  readonly #calls: StoreCalls

  constructor(options: LedgerOptions<S>) {
    if (!options?.store || typeof options.store.acquire !== 'function') {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'new Ledger({ store }) needs a store, e.g. new MemoryStore() or new SqliteStore({ path }).',
      )
    }
    assertFunctions('new Ledger()', { onEvent: options.onEvent })
    assertClock('new Ledger()', 'clock', options.clock)
    assertClock('new Ledger()', 'storeTimeoutClock', options.storeTimeoutClock)
    assertMethods('new Ledger()', 'telemetry', options.telemetry, ['startRun'])
    this.store = options.store
    this.clock = options.clock ?? systemClock
    this.leaseMs = runDuration('lease', options.lease ?? '30s')
    this.ttlMs = runDuration('ttl', options.ttl ?? '24h')
    this.waitMs = runDuration('wait', options.wait ?? '10s')
    const storeTimeoutMs = parsePositiveDuration(options.storeTimeout ?? '5s', 'storeTimeout')
    this.#telemetry = options.telemetry
    this.#calls = new StoreCalls(this.store, this.clock, storeTimeoutMs, options.onEvent, options.storeTimeoutClock ?? systemClock)
  }

  /**
   * Runs `fn` once for the intent: executes it when the ledger grants the record, replays the stored
   * outcome when it already ran, waits (bounded) while another holder runs it.
   * A thrown error releases the record (transient) and is rethrown.
   */
  run<T>(intent: Intent, fn: (ctx: IntentContext) => T | Promise<T>, options: RunOptions<T> = {}): Promise<RunResult<T>> {
    return this.#run(intent, options, (attempt, plan) => this.#execute(attempt, plan, fn))
  }

  /**
   * The first half of {@link Ledger.run}, for front ends whose framework runs the work itself (the HTTP
   * layer: the handler runs between the middleware and the response's end). Resolves as `run` would
   * without running anything, or with `acquired`: this caller holds the record, its lease is renewed
   * from now on, and exactly one of `finish(value)` (the work's value: stored or released as `run`
   * would) or `fail(error)` (the work threw: released) must follow.
   *
   * @example
   * const begun = await ledger.begin({ key, fingerprint })
   * if (begun.kind !== 'acquired') return answer(begun)
   * try { return await begun.finish(await work(begun.context)) } catch (e) { await begun.fail(e); throw e }
   */
  begin<T>(intent: Intent, options: RunOptions<T> = {}): Promise<Begun<T>> {
    return this.#run<T, Held<T>>(intent, options, (attempt, plan) => {
      const held = new Held<T>(this.#calls, attempt, plan)
      if (!plan.reconcile || !attempt.takeover) return held
      return this.#reconcile(attempt, plan).then(
        () => held,
        async (error: unknown) => {
          await held.fail(error)
          throw error
        },
      )
    })
  }

  /**
   * Like {@link Ledger.run}, but `fn` runs inside a store transaction that also completes the record
   * (docs/postgres.md): the business writes and the record commit together or not at all, and a holder that
   * was fenced out meanwhile has its writes rolled back. A final failure `fn` returns is recorded without
   * its writes, unless `failedWrites: 'commit'` (docs/http.md, "What happens to the handler's writes").
   * Needs a transactional store (PostgreSQL, MySQL).
   */
  runInTransaction<T>(
    intent: Intent,
    fn: (ctx: TransactionContext<TxOf<S>>) => T | Promise<T>,
    options: RunOptions<T> = {},
  ): Promise<RunResult<T>> {
    if (!isTransactionalStore(this.store)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `runInTransaction needs a store that runs transactions (PostgresStore, MySqlStore); ${this.store.name} does not. Use run() instead.`,
      )
    }
    const store = this.store as unknown as TransactionalStore<TxOf<S>>
    let rollbackFailed: boolean
    try {
      rollbackFailed = rollsBackFailed(store, options.failedWrites)
    } catch (error) {
      return Promise.reject(error)
    }
    return this.#run(intent, options, (attempt, plan) => this.#executeInTransaction(store, attempt, plan, fn, rollbackFailed))
  }

  /** Closes the store. */
  close(): Promise<void> {
    return this.store.close()
  }

  /**
   * Validates the intent and makes the run's plan, then runs it. Not async itself: without telemetry
   * the run's promise is the attempt's own, with no extra step; invalid input still rejects.
   */
  #run<T, R = RunResult<T>>(
    intent: Intent,
    options: RunOptions<T>,
    onAcquired: (attempt: Attempt, plan: Plan<T>) => R | Promise<R>,
  ): Promise<R | Settled<T>> {
    let scope: string
    let key: string
    let fingerprint: string
    let plan: Plan<T>
    try {
      scope = intent?.scope ?? DEFAULT_SCOPE
      key = intent?.key
      assertIdentity(scope, key)
      if (intent.fingerprint !== undefined && intent.payload !== undefined) {
        // One would be ignored: two different payloads under one fingerprint would replay each other.
        throw new IdempotencyError(
          'INVALID_ARGUMENT',
          'An intent takes a payload (hashed into its fingerprint) or a fingerprint you computed, not both: drop one.',
        )
      }
      fingerprint = intent.fingerprint ?? fingerprintOf(intent.payload ?? null)
      if (intent.fingerprint !== undefined) assertFingerprint(fingerprint)
      plan = {
        leaseMs: options.lease === undefined ? this.leaseMs : runDuration('lease', options.lease),
        ttlMs: options.ttl === undefined ? this.ttlMs : runDuration('ttl', options.ttl),
        encode: options.encode ?? (encodeJson as (value: T) => StoredResponse),
        decode: options.decode ?? decodeJson<T>,
        classify: options.classify ?? ((_value, response) => classifyStatus(response.status)),
        resourceId: options.resourceId,
        onEvent: options.onEvent,
        startedAtMs: this.clock.now(),
        telemetry: undefined,
        reconcile: options.reconcile,
        deadlineMs: options.deadlineMs,
      }
      if (options.deadlineMs !== undefined && !Number.isFinite(options.deadlineMs)) {
        throw new IdempotencyError('INVALID_OPTION', `deadlineMs must be a time in epoch ms, got ${options.deadlineMs}.`)
      }
    } catch (error) {
      return Promise.reject(error)
    }
    const telemetry = this.#telemetry?.startRun(scope, key, this.store.name)
    if (!telemetry) return this.#attempt(scope, key, fingerprint, options, plan, onAcquired)
    plan.telemetry = telemetry
    plan.onEvent = withTelemetry(options.onEvent, telemetry)
    return this.#attempt(scope, key, fingerprint, options, plan, onAcquired).then(
      (result) => {
        // A run handed back to its caller ends at its finish or fail.
        if (result instanceof Held) result.endsTelemetry = true
        else telemetry.end((result as RunResult<T>).kind)
        return result
      },
      (error: unknown) => {
        telemetry.end(undefined, error)
        throw error
      },
    )
  }

  async #attempt<T, R>(
    scope: string,
    key: string,
    fingerprint: string,
    options: RunOptions<T>,
    plan: Plan<T>,
    onAcquired: (attempt: Attempt, plan: Plan<T>) => R | Promise<R>,
  ): Promise<R | Settled<T>> {
    const calls = this.#calls
    const startedAtMs = plan.startedAtMs
    const waitMs = options.wait === undefined ? this.waitMs : runDuration('wait', options.wait)
    const deadlineMs = startedAtMs + waitMs
    let waitedMs = 0
    let waiter: Waiter | undefined
    try {
      for (let pollMs = FIRST_POLL_MS; ; pollMs = Math.min(pollMs * 2, MAX_POLL_MS)) {
        const result: AcquireResult = await calls.call(
          'acquire',
          scope,
          key,
          () => this.store.acquire(scope, key, fingerprint, leaseFor(plan, this.clock)),
          plan,
        )
        switch (result.kind) {
          case 'acquired': {
            if (calls.listens(plan)) {
              calls.emit({ type: 'acquired', scope, key, token: result.token, waitedMs, durationMs: calls.since(plan) }, plan)
            }
            const acquired = onAcquired(new Attempt(calls, plan, scope, key, fingerprint, result.token, result.steps), plan)
            // A value is returned as it is: awaiting it would only cost a turn of the microtask queue.
            return acquired instanceof Promise ? await acquired : acquired
          }
          case 'replay':
            if (calls.listens(plan)) calls.emit({ type: 'replayed', scope, key, waitedMs, durationMs: calls.since(plan) }, plan)
            return { kind: 'replayed', value: plan.decode(result.record.response as StoredResponse, result.record), record: result.record }
          case 'mismatch':
            if (calls.listens(plan)) calls.emit({ type: 'mismatch', scope, key, waitedMs, durationMs: calls.since(plan) }, plan)
            return { kind: 'mismatch', scope, key }
          case 'in_progress': {
            const nowMs = this.clock.now()
            if (nowMs >= deadlineMs) {
              calls.emit(
                { type: 'in_progress', scope, key, lockedUntilMs: result.lockedUntilMs, waitedMs, durationMs: nowMs - startedAtMs },
                plan,
              )
              return {
                kind: 'in_progress',
                lockedUntilMs: result.lockedUntilMs,
                retryAfterMs: retryAfter(result.lockedUntilMs, nowMs),
              }
            }
            calls.emit({ type: 'waiting', scope, key, lockedUntilMs: result.lockedUntilMs, durationMs: nowMs - startedAtMs }, plan)
            waiter ??= new Waiter(this.store, scope, key)
            // Polling is the fallback for lost notifications and for leases that end with no event.
            await waiter.wait(this.clock, Math.min(pollMs, deadlineMs - nowMs))
            waitedMs += this.clock.now() - nowMs
          }
        }
      }
    } finally {
      waiter?.close()
    }
  }

  /** On a takeover, hands the steps that started but have no result to `reconcile`, before the work. */
  async #reconcile(attempt: Attempt, plan: RunLimits): Promise<void> {
    if (!plan.reconcile || !attempt.takeover) return
    const steps = attempt[STEPS]
    const pending = steps.pending()
    if (pending.length === 0) return
    await plan.reconcile(pending, {
      scope: attempt.scope,
      key: attempt.key,
      token: attempt.token,
      get signal() {
        return attempt.signal
      },
      recordStep: (name, value) => steps.reconciled(name, value),
    })
  }

  async #execute<T>(attempt: Attempt, plan: Plan<T>, fn: (ctx: IntentContext) => T | Promise<T>): Promise<RunResult<T>> {
    const held = new Held<T>(this.#calls, attempt, plan)
    let value: T
    try {
      await this.#reconcile(attempt, plan)
      value = await (plan.telemetry ? plan.telemetry.work(() => fn(attempt)) : fn(attempt))
    } catch (error) {
      await held.fail(error)
      throw error
    }
    return held.finish(value)
  }

  async #executeInTransaction<T, Tx>(
    store: TransactionalStore<Tx>,
    attempt: Attempt,
    plan: Plan<T>,
    fn: (ctx: TransactionContext<Tx>) => T | Promise<T>,
    rollbackFailed: boolean,
  ): Promise<RunResult<T>> {
    const calls = this.#calls
    const { scope, key, token } = attempt
    const renewal = new Renewal(calls, attempt, plan)
    try {
      const done = await store.transaction(async (tx) => {
        const inTx = store.recordStepInTransaction
        // Steps recorded in the transaction commit with the business writes, or roll back with them. The
        // first one locks the record's row until the transaction ends, which keeps any takeover waiting
        // (it then finds the record completed, or, after a rollback, this attempt's lease), so renewals
        // stop there: on another connection they would wait for that lock, and the commit for them.
        if (inTx) {
          attempt[STEPS].useRecorder(async (name, result) => {
            await renewal.stop()
            return inTx.call(store, tx, scope, key, token, name, result)
          })
        }
        await this.#reconcile(attempt, plan)
        // Around the work alone: a final failure it returns is recorded without its writes.
        if (rollbackFailed) await store.savepointInTransaction?.(tx, 'set')
        const context = attempt.inTransaction(tx)
        const value = await (plan.telemetry ? plan.telemetry.work(() => fn(context)) : fn(context))
        const response = plan.encode(value)
        const classification = plan.classify(value, response)
        if (classification === 'transient') throw new Rollback('transient', response, value)
        if (classification === 'failed' && rollbackFailed) await store.savepointInTransaction?.(tx, 'rollback')
        const outcome: Outcome = { status: classification, response, resourceId: plan.resourceId?.(value) ?? null }
        await renewal.stop()
        // The token check and the business writes commit together: a zombie's writes roll back here.
        if (!(await store.completeInTransaction(tx, scope, key, token, outcome, plan.ttlMs))) {
          throw new Rollback('fenced_out', response, value)
        }
        return { value, response, status: classification }
      })
      if (calls.listens(plan)) calls.emit({ type: 'stored', scope, key, token, status: done.status, durationMs: calls.since(plan) }, plan)
      return { kind: 'executed', value: done.value, token, outcome: done.status, response: done.response }
    } catch (error) {
      await renewal.stop()
      if (error instanceof Rollback && error.reason === 'fenced_out') {
        if (calls.listens(plan)) calls.emit({ type: 'fenced_out', scope, key, token, durationMs: calls.since(plan) }, plan)
        return { kind: 'executed', value: error.value as T, token, outcome: 'fenced_out', response: error.response }
      }
      await calls.release(scope, key, token, plan)
      if (error instanceof Rollback) {
        return { kind: 'executed', value: error.value as T, token, outcome: 'released', response: error.response }
      }
      throw error
    }
  }
}

/**
 * Whether a run's final failure rolls back its work's writes (`RunOptions.failedWrites`), checked before
 * anything runs (and by the HTTP layer at start-up): a store that cannot roll back to a savepoint must
 * be told to commit them.
 */
export function rollsBackFailed(store: TransactionalStore<unknown>, failedWrites: FailedWrites | undefined): boolean {
  if (failedWrites !== undefined && failedWrites !== 'rollback' && failedWrites !== 'commit') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `failedWrites is 'rollback' (a final failure the work returns keeps none of its writes) or 'commit' (they commit with it), got ${JSON.stringify(failedWrites)}.`,
    )
  }
  if (failedWrites === 'commit') return false
  if (typeof store.savepointInTransaction !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${store.name} cannot roll a transaction back to a savepoint (it has no savepointInTransaction), so a final failure the work returns would commit its writes: implement savepointInTransaction, or pass failedWrites: 'commit' to keep them.`,
    )
  }
  return true
}

/** The run's own listener, with the run's telemetry seeing each event first. */
function withTelemetry(listener: ((event: LedgerEvent) => void) | undefined, telemetry: RunTelemetry): (event: LedgerEvent) => void {
  return (event) => {
    try {
      telemetry.event(event)
    } catch {
      // A broken telemetry must not break an intent.
    }
    if (listener) listener(event)
  }
}

/** The longest `retryAfterMs` of an `in_progress` answer (the HTTP layer's `Retry-After`): 2 s. */
export const RETRY_AFTER_MAX_MS = 2_000

/**
 * When to try again after `in_progress`: a short hint, not the lease's end. The caller has already
 * waited (`wait`, 10 s by default) and its retry waits on the store again, woken the moment the holder
 * finishes; the lease's end says nothing about when that is (a live holder renews its lease, and only a
 * dead one is taken over at its end, which the retry's own wait sees too). Coming back at the lease's end
 * (up to 30 s) only made clients give up, or answer late, for work that finished meanwhile.
 *
 * Whole seconds (HTTP's delay-seconds), at least 1 s, at most {@link RETRY_AFTER_MAX_MS}, and never past
 * the lease's end when that is 1 s or more away. See docs/client.md, "Defaults that agree".
 *
 * @example retryAfter(nowMs + 25_000, nowMs) // 2000
 * @example retryAfter(nowMs + 1_500, nowMs) // 1000
 */
export function retryAfter(lockedUntilMs: number, nowMs: number): number {
  const leaseLeftS = Math.floor((lockedUntilMs - nowMs) / 1_000)
  return Math.max(1, Math.min(RETRY_AFTER_MAX_MS / 1_000, leaseLeftS)) * 1_000
}
