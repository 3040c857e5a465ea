import { IdempotencyError, isIdempotencyError, storeUnavailable } from '../errors.js'
import { type Clock, systemClock } from './clock.js'
import { type Duration, parseDuration } from './duration.js'
import { fingerprintOf } from './fingerprint.js'
import { type Classification, classifyStatus } from './outcome.js'
import { Schedule, type Scheduled } from './schedule.js'
import { type Reconcile, type RecordStepFn, StepLog, type StepMethods } from './steps.js'
import {
  type AcquireResult,
  type IdempotencyStore,
  isTransactionalStore,
  type Outcome,
  type StepEntry,
  type StoredRecord,
  type StoredResponse,
  type TransactionalStore,
} from './store.js'
import { assertFingerprint, assertIdentity } from './validate.js'

/** The default scope when an intent names none. */
export const DEFAULT_SCOPE = 'default'

/** Options of {@link Ledger}. Durations take milliseconds or strings such as `30s`, `24h`. */
export interface LedgerOptions<S extends IdempotencyStore = IdempotencyStore> {
  /** Where records live. */
  store: S
  /** How long a holder owns a record without renewing it; renewed every third of it while work runs. @default '30s' */
  lease?: Duration
  /** How long completed and failed records are replayed. @default '24h' */
  ttl?: Duration
  /** How long to wait for another holder of the same key before answering `in_progress`. @default '10s' */
  wait?: Duration
  /** Where time comes from; inject a `ManualClock` in tests (and give the same one to the store). @default systemClock */
  clock?: Clock
  /** A network store call that takes longer than this fails with `STORE_UNAVAILABLE`. @default '5s' */
  storeTimeout?: Duration
  /**
   * Where `storeTimeout` is timed. Real time by default, even with an injected `clock`, so that a
   * test's stopped ManualClock cannot hang a store call forever; a simulation that owns all time
   * (npm run sim) passes its clock here too. @default systemClock
   */
  storeTimeoutClock?: Clock
  /** Called for each thing the ledger does: hook logs and metrics here. Must not throw. */
  onEvent?: (event: LedgerEvent) => void
  /**
   * Traces and metrics of each run, e.g. `openTelemetry()` from `idemkey/opentelemetry`
   * (docs/observability.md). Unset, nothing is recorded and nothing is spent on it.
   */
  telemetry?: LedgerTelemetry
}

/**
 * What the ledger calls to trace and measure its runs (docs/observability.md). `idemkey/opentelemetry`
 * implements it; implement it to feed another system. Called on the hot path: keep it cheap, never throw.
 */
export interface LedgerTelemetry {
  /** A run begins (before its first store call). The run's store calls, events and end go to what it returns. */
  startRun(scope: string, key: string, store: string): RunTelemetry
}

/** One run, as {@link LedgerTelemetry} sees it. */
export interface RunTelemetry {
  /** Wraps one store operation (`acquire`, `renew`, `complete`, `release`); resolves or rejects as `call` does. */
  storeCall<R>(operation: string, call: () => Promise<R>): Promise<R>
  /** Runs the work function (in the run's trace context, so the work's own spans nest under it). */
  work<R>(fn: () => R): R
  /** Each event of the run, as the ledger's `onEvent` sees it. */
  event(event: LedgerEvent): void
  /** The run is over: with its result's kind, or the error it threw. */
  end(kind: RunResult<unknown>['kind'] | undefined, error?: unknown): void
}

/** One logical operation meant to happen once. */
export interface Intent {
  /** The idempotency key: 1–255 characters, each 0x20–0x7E. */
  key: string
  /** The namespace of the key (tenant, account). @default 'default' */
  scope?: string
  /** Hex SHA-256 of what the intent asks for. Give this or `payload`. */
  fingerprint?: string
  /** What the intent asks for; its canonical JSON is hashed into the fingerprint. */
  payload?: unknown
}

/** What the work function receives; `step`, `capture`, `now`, `uuid` and `random` are durable steps (docs/steps.md). */
export interface IntentContext extends StepMethods {
  scope: string
  key: string
  fingerprint: string
  /** The fencing token this attempt holds. */
  token: number
  /** `true` when an earlier attempt at this key did not finish (it crashed, timed out or released a transient failure). */
  takeover: boolean
  /** Aborted when this attempt loses its lease (another holder took over): stop work that has not committed. */
  signal: AbortSignal
}

/** Context of {@link Ledger.runInTransaction}: the same, plus the store's transaction. */
export interface TransactionContext<Tx> extends IntentContext {
  /** The open transaction that will also complete the record. Do the business writes on it. */
  tx: Tx
}

/** How a value becomes a stored response and back. The default stores JSON with status 200. */
export interface RunOptions<T> {
  /** Turns the work's value into what is stored. */
  encode?: (value: T) => StoredResponse
  /** Turns a stored response back into a value for a replay. */
  decode?: (response: StoredResponse, record: StoredRecord) => T
  /** Decides whether the value is stored (`completed`/`failed`) or released (`transient`). @default by the response's status: 2xx/3xx completed, 4xx failed except 401, 408, 409, 425, 429, which and 5xx are transient */
  classify?: (value: T, response: StoredResponse) => Classification
  /** A pointer to what the work created, stored with the record. */
  resourceId?: (value: T) => string | null | undefined
  lease?: Duration
  ttl?: Duration
  wait?: Duration
  /** Also called for this run's events, besides the ledger's `onEvent` (the HTTP layer reports through it). Must not throw. */
  onEvent?: (event: LedgerEvent) => void
  /**
   * Called on a takeover, before the work, with the steps an earlier attempt started but did not record
   * (docs/steps.md, "Reconciliation"). Setting it makes each step record a "started" marker first.
   */
  reconcile?: Reconcile
  /**
   * When this run's hold must end at the latest, in epoch ms by the ledger's clock (a Lambda invocation's
   * end): every lease the run takes or renews ends by then, and a renewal due after it is not made (the
   * lease is lost, and the work's signal aborted). A run that dies with its deadline frees the record
   * then, not a whole lease later.
   */
  deadlineMs?: number
}

/** What happened to the outcome of an executed attempt. */
export type ExecutedOutcome =
  /** Stored as a success; replayed from now on. */
  | 'completed'
  /** Stored as a final failure; replayed from now on. */
  | 'failed'
  /** Transient: released, the next retry runs afresh. */
  | 'released'
  /** Another holder took the record over meanwhile; this outcome was discarded. */
  | 'fenced_out'
  /**
   * The store could not take it for as long as the lease protected the record (it was retried until
   * shortly before the lease's end): a retry after the lease will run the work again. Reported with an
   * `unrecorded` event; see docs/ledger.md, "Store outages", for what an operator does about it.
   */
  | 'unrecorded'

/** The result of {@link Ledger.run}. */
export type RunResult<T> =
  | { kind: 'executed'; value: T; token: number; outcome: ExecutedOutcome; response: StoredResponse }
  | { kind: 'replayed'; value: T; record: StoredRecord }
  | { kind: 'mismatch'; scope: string; key: string }
  | { kind: 'in_progress'; lockedUntilMs: number; retryAfterMs: number }

/**
 * Reported through {@link LedgerOptions.onEvent}. `durationMs` is the time since the run began (by the
 * ledger's clock), but on `store_error`, where it is how long the failed store call took; `waitedMs` is
 * the time spent waiting for another holder of the key before this event.
 */
export type LedgerEvent =
  | { type: 'acquired'; scope: string; key: string; token: number; waitedMs: number; durationMs: number }
  | { type: 'replayed'; scope: string; key: string; waitedMs: number; durationMs: number }
  | { type: 'mismatch'; scope: string; key: string; waitedMs: number; durationMs: number }
  | { type: 'waiting'; scope: string; key: string; lockedUntilMs: number; durationMs: number }
  /** Still held by another after the whole `wait`: answered `in_progress` (`409` over HTTP). */
  | { type: 'in_progress'; scope: string; key: string; lockedUntilMs: number; waitedMs: number; durationMs: number }
  | { type: 'stored'; scope: string; key: string; token: number; status: 'completed' | 'failed'; durationMs: number }
  | { type: 'released'; scope: string; key: string; token: number; durationMs: number }
  | { type: 'fenced_out'; scope: string; key: string; token: number; durationMs: number }
  | { type: 'lease_lost'; scope: string; key: string; token: number; durationMs: number }
  | { type: 'store_error'; scope: string; key: string; operation: string; error: unknown; durationMs: number }
  /** The work ran but its outcome could not be stored before the lease ended: a retry will run it again. */
  | {
      type: 'unrecorded'
      scope: string
      key: string
      token: number
      status: 'completed' | 'failed'
      attempts: number
      error: unknown
      durationMs: number
    }

type TxOf<S> = S extends TransactionalStore<infer Tx> ? Tx : never

const encoder = new TextEncoder()
const decoder = new TextDecoder()
const FIRST_POLL_MS = 20
const MAX_POLL_MS = 250
const COMPLETE_FIRST_BACKOFF_MS = 50
const COMPLETE_MAX_BACKOFF_MS = 1_000

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
  readonly #core: Core

  constructor(options: LedgerOptions<S>) {
    if (!options?.store || typeof options.store.acquire !== 'function') {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'new Ledger({ store }) needs a store, e.g. new MemoryStore() or new SqliteStore({ path }).',
      )
    }
    this.store = options.store
    this.clock = options.clock ?? systemClock
    this.leaseMs = positive(parseDuration(options.lease ?? '30s', 'lease'), 'lease')
    this.ttlMs = positive(parseDuration(options.ttl ?? '24h', 'ttl'), 'ttl')
    this.waitMs = parseDuration(options.wait ?? '10s', 'wait')
    const storeTimeoutMs = positive(parseDuration(options.storeTimeout ?? '5s', 'storeTimeout'), 'storeTimeout')
    this.#telemetry = options.telemetry
    this.#core = new Core(this.store, this.clock, storeTimeoutMs, options.onEvent, options.storeTimeoutClock ?? systemClock)
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
      const held = new Held<T>(this.#core, attempt, plan)
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
   * was fenced out meanwhile has its writes rolled back. Needs a transactional store (PostgreSQL).
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
    return this.#run(intent, options, (attempt, plan) => this.#executeInTransaction(store, attempt, plan, fn))
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
      fingerprint = intent.fingerprint ?? fingerprintOf(intent.payload ?? null)
      if (intent.fingerprint !== undefined) assertFingerprint(fingerprint)
      plan = {
        leaseMs: options.lease === undefined ? this.leaseMs : positive(parseDuration(options.lease, 'lease'), 'lease'),
        ttlMs: options.ttl === undefined ? this.ttlMs : positive(parseDuration(options.ttl, 'ttl'), 'ttl'),
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
    const core = this.#core
    const startedAtMs = plan.startedAtMs
    const waitMs = options.wait === undefined ? this.waitMs : parseDuration(options.wait, 'wait')
    const deadlineMs = startedAtMs + waitMs
    let waitedMs = 0
    let waiter: Waiter | undefined
    try {
      for (let pollMs = FIRST_POLL_MS; ; pollMs = Math.min(pollMs * 2, MAX_POLL_MS)) {
        const result: AcquireResult = await core.call(
          'acquire',
          scope,
          key,
          () => this.store.acquire(scope, key, fingerprint, leaseFor(plan, this.clock)),
          plan,
        )
        switch (result.kind) {
          case 'acquired': {
            if (core.listens(plan)) {
              core.emit({ type: 'acquired', scope, key, token: result.token, waitedMs, durationMs: core.since(plan) }, plan)
            }
            const acquired = onAcquired(new Attempt(core, plan, scope, key, fingerprint, result.token, result.steps), plan)
            // A value is returned as it is: awaiting it would only cost a turn of the microtask queue.
            return acquired instanceof Promise ? await acquired : acquired
          }
          case 'replay':
            if (core.listens(plan)) core.emit({ type: 'replayed', scope, key, waitedMs, durationMs: core.since(plan) }, plan)
            return { kind: 'replayed', value: plan.decode(result.record.response as StoredResponse, result.record), record: result.record }
          case 'mismatch':
            if (core.listens(plan)) core.emit({ type: 'mismatch', scope, key, waitedMs, durationMs: core.since(plan) }, plan)
            return { kind: 'mismatch', scope, key }
          case 'in_progress': {
            const nowMs = this.clock.now()
            if (nowMs >= deadlineMs) {
              core.emit(
                { type: 'in_progress', scope, key, lockedUntilMs: result.lockedUntilMs, waitedMs, durationMs: nowMs - startedAtMs },
                plan,
              )
              return {
                kind: 'in_progress',
                lockedUntilMs: result.lockedUntilMs,
                retryAfterMs: retryAfter(result.lockedUntilMs, nowMs),
              }
            }
            core.emit({ type: 'waiting', scope, key, lockedUntilMs: result.lockedUntilMs, durationMs: nowMs - startedAtMs }, plan)
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
    const held = new Held<T>(this.#core, attempt, plan)
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
  ): Promise<RunResult<T>> {
    const core = this.#core
    const { scope, key, token } = attempt
    const renewal = new Renewal(core, attempt, plan)
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
        const context = attempt.inTransaction(tx)
        const value = await (plan.telemetry ? plan.telemetry.work(() => fn(context)) : fn(context))
        const response = plan.encode(value)
        const classification = plan.classify(value, response)
        if (classification === 'transient') throw new Rollback('transient', response, value)
        const outcome: Outcome = { status: classification, response, resourceId: plan.resourceId?.(value) ?? null }
        await renewal.stop()
        // The token check and the business writes commit together: a zombie's writes roll back here.
        if (!(await store.completeInTransaction(tx, scope, key, token, outcome, plan.ttlMs))) {
          throw new Rollback('fenced_out', response, value)
        }
        return { value, response, status: classification }
      })
      if (core.listens(plan)) core.emit({ type: 'stored', scope, key, token, status: done.status, durationMs: core.since(plan) }, plan)
      return { kind: 'executed', value: done.value, token, outcome: done.status, response: done.response }
    } catch (error) {
      await renewal.stop()
      if (error instanceof Rollback && error.reason === 'fenced_out') {
        if (core.listens(plan)) core.emit({ type: 'fenced_out', scope, key, token, durationMs: core.since(plan) }, plan)
        return { kind: 'executed', value: error.value as T, token, outcome: 'fenced_out', response: error.response }
      }
      await core.release(scope, key, token, plan)
      if (error instanceof Rollback) {
        return { kind: 'executed', value: error.value as T, token, outcome: 'released', response: error.response }
      }
      throw error
    }
  }
}

interface Plan<T> {
  leaseMs: number
  ttlMs: number
  encode: (value: T) => StoredResponse
  decode: (response: StoredResponse, record: StoredRecord) => T
  classify: (value: T, response: StoredResponse) => Classification
  resourceId: ((value: T) => string | null | undefined) | undefined
  onEvent: ((event: LedgerEvent) => void) | undefined
  /** When the run began, by the ledger's clock. */
  startedAtMs: number
  telemetry: RunTelemetry | undefined
  reconcile: Reconcile | undefined
  /** The latest end of any lease of this run (RunOptions.deadlineMs). */
  deadlineMs: number | undefined
}

/** What the renewal, completion and release of one run need of its plan. */
type RunLimits = Pick<Plan<unknown>, 'leaseMs' | 'ttlMs' | 'onEvent' | 'startedAtMs' | 'telemetry' | 'reconcile' | 'deadlineMs'>

/**
 * The lease to ask for now: the run's lease, cut to what is left before its deadline (at least 1 ms).
 * The clock is read only for a run with a deadline.
 */
function leaseFor(plan: RunLimits, clock: Clock): number {
  return plan.deadlineMs === undefined ? plan.leaseMs : Math.max(1, Math.min(plan.leaseMs, plan.deadlineMs - clock.now()))
}

/** A run that ended without this caller holding the record. */
type Settled<T> = Exclude<RunResult<T>, { kind: 'executed' }>

/** What {@link Ledger.begin} resolves with. */
export type Begun<T> = Acquired<T> | Settled<T>

/** The record is this caller's: run the work, then call exactly one of `finish` or `fail`. */
export interface Acquired<T> {
  readonly kind: 'acquired'
  /** What the work sees, as `run`'s work function would. */
  readonly context: IntentContext
  /** Stores the work's value (or releases it, when classified transient), as `run` would, and resolves with `run`'s result. */
  finish(value: T): Promise<RunResult<T>>
  /** The work failed: releases the record so a retry runs afresh. */
  fail(error: unknown): Promise<void>
}

const STEPS = Symbol('steps')
const LOSE = Symbol('lose')

/**
 * What runs share in one ledger: the store calls (errors wrapped, network calls timed), events, the
 * completion and release, and the schedules of renewals and timeouts. Made once per ledger, so a run
 * makes no closures for it.
 */
class Core {
  /** Lease renewals, on the ledger's clock (a test's ManualClock drives them). */
  readonly renewals: Schedule
  /** Timeouts of network store calls, on real time whatever the ledger's clock (unless told otherwise). */
  readonly #timeouts: Schedule
  readonly #timed: boolean

  constructor(
    readonly store: IdempotencyStore,
    readonly clock: Clock,
    readonly storeTimeoutMs: number,
    readonly onEvent: ((event: LedgerEvent) => void) | undefined,
    timeoutClock: Clock,
  ) {
    this.renewals = new Schedule(clock)
    this.#timeouts = new Schedule(timeoutClock)
    // In-process stores answer synchronously underneath: a timeout per call would only cost time.
    this.#timed = store.serverClock === true
  }

  /** Whether anyone hears this run's events: without a listener none is built. */
  listens(plan: RunLimits): boolean {
    return this.onEvent !== undefined || plan.onEvent !== undefined
  }

  emit(event: LedgerEvent, plan: RunLimits): void {
    // A broken metrics hook must not break an intent.
    if (this.onEvent) safely(this.onEvent, event)
    if (plan.onEvent) safely(plan.onEvent, event)
  }

  /** Milliseconds since the run began. */
  since(plan: RunLimits): number {
    return this.clock.now() - plan.startedAtMs
  }

  /** One store call: errors become STORE_UNAVAILABLE with the driver's error as cause; network stores get a timeout. */
  call<R>(operation: string, scope: string, key: string, call: () => Promise<R>, plan: RunLimits): Promise<R> {
    const startedAtMs = this.listens(plan) ? this.clock.now() : 0
    let pending: Promise<R>
    try {
      pending = plan.telemetry
        ? plan.telemetry.storeCall(operation, this.#timed ? () => this.#withTimeout(call(), operation) : call)
        : this.#timed
          ? this.#withTimeout(call(), operation)
          : call()
    } catch (error) {
      pending = Promise.reject(error)
    }
    return pending.then(undefined, (error: unknown) => {
      const wrapped = storeUnavailable(this.store.name, operation, error)
      if ((wrapped.code === 'STORE_UNAVAILABLE' || wrapped.code === 'STORE_SCHEMA') && this.listens(plan)) {
        this.emit({ type: 'store_error', scope, key, operation, error: wrapped, durationMs: this.clock.now() - startedAtMs }, plan)
      }
      throw wrapped
    })
  }

  #withTimeout<R>(promise: Promise<R>, operation: string): Promise<R> {
    const ms = this.storeTimeoutMs
    return new Promise<R>((resolve, reject) => {
      const deadline = new Deadline(reject, this.store.name, operation, ms)
      this.#timeouts.add(deadline, ms)
      promise.then(
        (value) => {
          this.#timeouts.remove(deadline, ms)
          resolve(value)
        },
        (error: unknown) => {
          this.#timeouts.remove(deadline, ms)
          reject(error)
        },
      )
    })
  }

  /**
   * Stores the outcome. The work already ran, so a store outage here must not end in a second run:
   * while this holder's lease lasts, no one else can take the record over, so the outcome is retried
   * (backoff from 50 ms up to 1 s) until shortly before the lease ends. Only then is it given up as
   * `unrecorded`, loudly, since the next retry after the lease will run the work again.
   *
   *   acquire ── work ── complete ✗ ── 50ms ── ✗ ── 100ms ── … ── ✓ completed
   *                                                          └─ lease end − margin: unrecorded
   */
  async complete(
    scope: string,
    key: string,
    token: number,
    outcome: Outcome,
    plan: RunLimits,
    leaseEndsAtMs: number,
  ): Promise<ExecutedOutcome> {
    // Stop early enough that the last try lands inside the lease, whatever the store's round trip.
    const giveUpAtMs = leaseEndsAtMs - Math.min(1_000, Math.floor(plan.leaseMs / 10))
    let backoffMs = COMPLETE_FIRST_BACKOFF_MS
    for (let attempt = 1; ; attempt++) {
      try {
        const stored = await this.call('complete', scope, key, () => this.store.complete(scope, key, token, outcome, plan.ttlMs), plan)
        if (stored) {
          if (this.listens(plan)) {
            this.emit({ type: 'stored', scope, key, token, status: outcome.status, durationMs: this.since(plan) }, plan)
          }
          return outcome.status
        }
        if (this.listens(plan)) this.emit({ type: 'fenced_out', scope, key, token, durationMs: this.since(plan) }, plan)
        return 'fenced_out'
      } catch (error) {
        const retriable = isIdempotencyError(error) && error.code === 'STORE_UNAVAILABLE'
        const leftMs = giveUpAtMs - this.clock.now()
        if (!retriable || leftMs <= 0) {
          this.emit(
            { type: 'unrecorded', scope, key, token, status: outcome.status, attempts: attempt, error, durationMs: this.since(plan) },
            plan,
          )
          return 'unrecorded'
        }
        await this.clock.sleep(Math.min(backoffMs, leftMs))
        backoffMs = Math.min(backoffMs * 2, COMPLETE_MAX_BACKOFF_MS)
      }
    }
  }

  /** Releases after a transient failure; a store outage here only means the lease ends by itself. */
  async release(scope: string, key: string, token: number, plan: RunLimits): Promise<void> {
    try {
      if ((await this.call('release', scope, key, () => this.store.release(scope, key, token), plan)) && this.listens(plan)) {
        this.emit({ type: 'released', scope, key, token, durationMs: this.since(plan) }, plan)
      }
    } catch {
      // Reported by call(); the record becomes acquirable when its lease ends.
    }
  }

  /** Where an attempt's steps are recorded, when the store records steps. */
  stepRecorder(attempt: Attempt, plan: RunLimits): RecordStepFn | undefined {
    const store = this.store
    if (!store.recordStep) return undefined
    const { scope, key, token } = attempt
    return (name, result) =>
      this.call('recordStep', scope, key, () => store.recordStep?.(scope, key, token, name, result) as Promise<boolean>, plan)
  }
}

/** A network store call's timeout. */
class Deadline implements Scheduled {
  dueAtMs = 0

  constructor(
    readonly reject: (error: unknown) => void,
    readonly storeName: string,
    readonly operation: string,
    readonly ms: number,
  ) {}

  fire(): void {
    this.reject(
      new IdempotencyError(
        'STORE_UNAVAILABLE',
        `${this.storeName}: ${this.operation} took longer than ${this.ms}ms. Check that the store is reachable and not overloaded.`,
      ),
    )
  }
}

/**
 * Renews the lease every third of it while the work runs. When the store says the token is no
 * longer current, or renewals fail for a whole lease, the attempt's signal is aborted.
 * On the ledger's shared schedule, not a timer per run: most work ends long before the first renewal
 * is due. `leaseEndsAtMs` is this process's conservative view of when the lease ends: the last
 * renewal's start (or the acquire's end, which is later than the store granted it only by the round
 * trip) plus one lease.
 */
class Renewal implements Scheduled {
  dueAtMs = 0
  #stopped = false
  #inFlight: Promise<void> | undefined
  #renewedAtMs: number
  readonly #everyMs: number

  constructor(
    protected readonly core: Core,
    protected readonly attempt: Attempt,
    protected readonly plan: RunLimits,
  ) {
    this.#renewedAtMs = core.clock.now()
    this.#everyMs = Math.max(1, Math.floor(plan.leaseMs / 3))
    core.renewals.add(this, this.#everyMs)
  }

  fire(): void {
    this.#inFlight = this.#renewOnce()
  }

  async #renewOnce(): Promise<void> {
    const { core, attempt, plan } = this
    const startedAtMs = core.clock.now()
    let current: boolean
    try {
      // Past the run's deadline no renewal is made: the lease ends there.
      current =
        plan.deadlineMs !== undefined && startedAtMs >= plan.deadlineMs
          ? false
          : await core.call(
              'renew',
              attempt.scope,
              attempt.key,
              () => core.store.renew(attempt.scope, attempt.key, attempt.token, leaseFor(plan, core.clock)),
              plan,
            )
    } catch {
      current = core.clock.now() - this.#renewedAtMs < plan.leaseMs
      if (current) {
        if (!this.#stopped) core.renewals.add(this, this.#everyMs)
        return
      }
    }
    if (this.#stopped) return
    if (!current) {
      if (core.listens(plan)) {
        core.emit({ type: 'lease_lost', scope: attempt.scope, key: attempt.key, token: attempt.token, durationMs: core.since(plan) }, plan)
      }
      attempt[LOSE](
        new IdempotencyError(
          'FENCED_OUT',
          `Lost the lease on key "${attempt.key}" (token ${attempt.token}): another holder may run it now. Stop work that has not committed.`,
        ),
      )
      return
    }
    this.#renewedAtMs = startedAtMs
    core.renewals.add(this, this.#everyMs)
  }

  /** Ends the renewals; resolves once a renewal under way has ended, `undefined` when none is. */
  stop(): Promise<void> | undefined {
    this.#stopped = true
    this.core.renewals.remove(this, this.#everyMs)
    return this.#inFlight
  }

  leaseEndsAtMs(): number {
    const endsAtMs = this.#renewedAtMs + this.plan.leaseMs
    return this.plan.deadlineMs === undefined ? endsAtMs : Math.min(endsAtMs, this.plan.deadlineMs)
  }
}

/** A record this caller holds while its work runs: renewed until `finish` or `fail`. */
class Held<T> extends Renewal implements Acquired<T> {
  readonly kind = 'acquired'
  /** Set when the run was handed back by {@link Ledger.begin} with telemetry: it ends at finish or fail. */
  endsTelemetry = false
  #settled = false

  get context(): IntentContext {
    return this.attempt
  }

  async finish(value: T): Promise<RunResult<T>> {
    this.#settle()
    const inFlight = this.stop()
    if (inFlight) await inFlight
    const { core, attempt, plan } = this
    const { scope, key, token } = attempt
    const run = plan as Plan<T>
    let result: RunResult<T>
    try {
      const response = run.encode(value)
      const classification = run.classify(value, response)
      if (classification === 'transient') {
        await core.release(scope, key, token, plan)
        result = { kind: 'executed', value, token, outcome: 'released', response }
      } else {
        const outcome: Outcome = { status: classification, response, resourceId: run.resourceId?.(value) ?? null }
        const stored = await core.complete(scope, key, token, outcome, plan, this.leaseEndsAtMs())
        result = { kind: 'executed', value, token, outcome: stored, response }
      }
    } catch (error) {
      if (this.endsTelemetry) plan.telemetry?.end(undefined, error)
      throw error
    }
    if (this.endsTelemetry) plan.telemetry?.end(result.kind)
    return result
  }

  async fail(error: unknown): Promise<void> {
    this.#settle()
    const inFlight = this.stop()
    if (inFlight) await inFlight
    await this.core.release(this.attempt.scope, this.attempt.key, this.attempt.token, this.plan)
    if (this.endsTelemetry) this.plan.telemetry?.end(undefined, error)
  }

  #settle(): void {
    if (this.#settled) {
      throw new IdempotencyError('INVALID_ARGUMENT', 'finish() or fail() was already called for this run: call exactly one of them, once.')
    }
    this.#settled = true
  }
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

/** Waits for a change of one record: woken by the store's notification, or after the poll interval. */
class Waiter {
  #changed = false
  #wake: AbortController | undefined
  readonly #unsubscribe: (() => void) | undefined

  constructor(store: IdempotencyStore, scope: string, key: string) {
    this.#unsubscribe = store.watch?.(scope, key, () => {
      this.#changed = true
      this.#wake?.abort()
    })
  }

  async wait(clock: Clock, ms: number): Promise<void> {
    if (this.#changed) {
      this.#changed = false
      return
    }
    this.#wake = new AbortController()
    try {
      await clock.sleep(ms, this.#wake.signal)
    } catch {
      // Woken by a notification.
    }
    this.#changed = false
  }

  close(): void {
    this.#unsubscribe?.()
  }
}

/**
 * One attempt at an intent, and the context its work sees ({@link IntentContext}). Its signal and its
 * steps are made on first use: most work looks at neither, and an AbortController per run costs more
 * than the rest of a replay. The step methods are getters so that `const { step } = ctx` works too.
 */
class Attempt implements IntentContext {
  readonly takeover: boolean
  #controller: AbortController | undefined
  #lostReason: unknown
  #steps: StepLog | undefined
  readonly #core: Core
  readonly #plan: RunLimits
  readonly #recorded: StepEntry[] | undefined

  constructor(
    core: Core,
    plan: RunLimits,
    readonly scope: string,
    readonly key: string,
    readonly fingerprint: string,
    readonly token: number,
    recorded: StepEntry[] | undefined,
  ) {
    this.#core = core
    this.#plan = plan
    this.#recorded = recorded
    this.takeover = token > 1
  }

  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController()
      if (this.#lostReason !== undefined) this.#controller.abort(this.#lostReason)
    }
    return this.#controller.signal
  }

  get step(): StepMethods['step'] {
    return (name, fn) => this[STEPS].step(name, fn)
  }

  get capture(): StepMethods['capture'] {
    return (name, fn) => this[STEPS].capture(name, fn)
  }

  get now(): StepMethods['now'] {
    return () => this[STEPS].now()
  }

  get uuid(): StepMethods['uuid'] {
    return () => this[STEPS].uuid()
  }

  get random(): StepMethods['random'] {
    return () => this[STEPS].random()
  }

  /** The attempt's steps, made on first use: most work records none. */
  get [STEPS](): StepLog {
    this.#steps ??= new StepLog(
      this.scope,
      this.key,
      this.token,
      this.#recorded,
      this.#core.store.name,
      this.#core.stepRecorder(this, this.#plan),
      this.#plan.reconcile !== undefined,
      () => this.signal,
      () => this.#core.clock.now(),
      () => this.#lostReason,
    )
    return this.#steps
  }

  /** The lease is gone: abort the signal now, or as soon as the work looks at it. */
  [LOSE](reason: unknown): void {
    this.#lostReason = reason
    this.#controller?.abort(reason)
  }

  /** This attempt as the work of `runInTransaction` sees it: with the transaction. */
  inTransaction<Tx>(tx: Tx): TransactionContext<Tx> {
    return Object.assign(this, { tx })
  }
}

function safely(hook: (event: LedgerEvent) => void, event: LedgerEvent): void {
  try {
    hook(event)
  } catch {
    // Swallowed on purpose: see #emit.
  }
}

function positive(ms: number, name: string): number {
  if (ms <= 0) throw new IdempotencyError('INVALID_OPTION', `${name} must be longer than 0, got ${ms}ms.`)
  return ms
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
