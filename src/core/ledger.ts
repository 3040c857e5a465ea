import { IdempotencyError, isIdempotencyError, storeUnavailable } from '../errors.js'
import { type Clock, systemClock } from './clock.js'
import { type Duration, parseDuration } from './duration.js'
import { fingerprintOf } from './fingerprint.js'
import { type Classification, classifyStatus } from './outcome.js'
import { type Reconcile, StepLog, type StepMethods } from './steps.js'
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
  readonly #storeTimeoutMs: number
  readonly #onEvent: ((event: LedgerEvent) => void) | undefined
  readonly #telemetry: LedgerTelemetry | undefined

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
    this.#storeTimeoutMs = positive(parseDuration(options.storeTimeout ?? '5s', 'storeTimeout'), 'storeTimeout')
    this.#onEvent = options.onEvent
    this.#telemetry = options.telemetry
  }

  /**
   * Runs `fn` once for the intent: executes it when the ledger grants the record, replays the stored
   * outcome when it already ran, waits (bounded) while another holder runs it.
   * A thrown error releases the record (transient) and is rethrown.
   */
  run<T>(intent: Intent, fn: (ctx: IntentContext) => T | Promise<T>, options: RunOptions<T> = {}): Promise<RunResult<T>> {
    return this.#run(intent, options, (ctx, plan) => this.#execute(ctx, plan, fn))
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
    return this.#run(intent, options, (ctx, plan) => this.#executeInTransaction(store, ctx, plan, fn))
  }

  /** Closes the store. */
  close(): Promise<void> {
    return this.store.close()
  }

  /**
   * Validates the intent and makes the run's plan, then runs it. Not async itself: without telemetry
   * the run's promise is the attempt's own, with no extra step; invalid input still rejects.
   */
  #run<T>(intent: Intent, options: RunOptions<T>, execute: (ctx: Attempt, plan: Plan<T>) => Promise<RunResult<T>>): Promise<RunResult<T>> {
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
      }
    } catch (error) {
      return Promise.reject(error)
    }
    const telemetry = this.#telemetry?.startRun(scope, key, this.store.name)
    if (!telemetry) return this.#attempt(scope, key, fingerprint, options, plan, execute)
    plan.telemetry = telemetry
    plan.onEvent = withTelemetry(options.onEvent, telemetry)
    return this.#attempt(scope, key, fingerprint, options, plan, execute).then(
      (result) => {
        telemetry.end(result.kind)
        return result
      },
      (error: unknown) => {
        telemetry.end(undefined, error)
        throw error
      },
    )
  }

  async #attempt<T>(
    scope: string,
    key: string,
    fingerprint: string,
    options: RunOptions<T>,
    plan: Plan<T>,
    execute: (ctx: Attempt, plan: Plan<T>) => Promise<RunResult<T>>,
  ): Promise<RunResult<T>> {
    const startedAtMs = plan.startedAtMs
    const waitMs = options.wait === undefined ? this.waitMs : parseDuration(options.wait, 'wait')
    const deadlineMs = startedAtMs + waitMs
    let waitedMs = 0
    let waiter: Waiter | undefined
    try {
      for (let pollMs = FIRST_POLL_MS; ; pollMs = Math.min(pollMs * 2, MAX_POLL_MS)) {
        const result: AcquireResult = await this.#call(
          'acquire',
          scope,
          key,
          () => this.store.acquire(scope, key, fingerprint, plan.leaseMs),
          plan,
        )
        switch (result.kind) {
          case 'acquired':
            this.#emit({ type: 'acquired', scope, key, token: result.token, waitedMs, durationMs: this.#since(plan) }, plan.onEvent)
            return await execute(this.#context(scope, key, fingerprint, result.token, result.steps, plan), plan)
          case 'replay':
            this.#emit({ type: 'replayed', scope, key, waitedMs, durationMs: this.#since(plan) }, plan.onEvent)
            return { kind: 'replayed', value: plan.decode(result.record.response as StoredResponse, result.record), record: result.record }
          case 'mismatch':
            this.#emit({ type: 'mismatch', scope, key, waitedMs, durationMs: this.#since(plan) }, plan.onEvent)
            return { kind: 'mismatch', scope, key }
          case 'in_progress': {
            const nowMs = this.clock.now()
            if (nowMs >= deadlineMs) {
              this.#emit(
                { type: 'in_progress', scope, key, lockedUntilMs: result.lockedUntilMs, waitedMs, durationMs: nowMs - startedAtMs },
                plan.onEvent,
              )
              return {
                kind: 'in_progress',
                lockedUntilMs: result.lockedUntilMs,
                retryAfterMs: retryAfter(result.lockedUntilMs, nowMs),
              }
            }
            this.#emit({ type: 'waiting', scope, key, lockedUntilMs: result.lockedUntilMs, durationMs: nowMs - startedAtMs }, plan.onEvent)
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

  #context(scope: string, key: string, fingerprint: string, token: number, steps: StepEntry[] | undefined, plan: RunLimits): Attempt {
    const store = this.store
    const record = store.recordStep
      ? (name: string, result: string | null) =>
          this.#call('recordStep', scope, key, () => store.recordStep?.(scope, key, token, name, result) as Promise<boolean>, plan)
      : undefined
    return new Attempt(scope, key, fingerprint, token, steps, store.name, record, plan.reconcile !== undefined, this.clock)
  }

  /** On a takeover, hands the steps that started but have no result to `reconcile`, before the work. */
  async #reconcile(ctx: Attempt, plan: RunLimits): Promise<void> {
    if (!plan.reconcile || !ctx.takeover) return
    const pending = ctx.steps.pending()
    if (pending.length === 0) return
    const { steps } = ctx
    await plan.reconcile(pending, {
      scope: ctx.scope,
      key: ctx.key,
      token: ctx.token,
      get signal() {
        return ctx.signal
      },
      recordStep: (name, value) => steps.reconciled(name, value),
    })
  }

  async #execute<T>(ctx: Attempt, plan: Plan<T>, fn: (ctx: IntentContext) => T | Promise<T>): Promise<RunResult<T>> {
    const { scope, key, token } = ctx
    const renewal = this.#renewWhileRunning(ctx, plan)
    let value: T
    try {
      await this.#reconcile(ctx, plan)
      value = await (plan.telemetry ? plan.telemetry.work(() => fn(publicContext(ctx))) : fn(publicContext(ctx)))
    } catch (error) {
      await renewal.stop()
      await this.#release(scope, key, token, plan)
      throw error
    }
    await renewal.stop()
    const response = plan.encode(value)
    const classification = plan.classify(value, response)
    if (classification === 'transient') {
      await this.#release(scope, key, token, plan)
      return { kind: 'executed', value, token, outcome: 'released', response }
    }
    const outcome: Outcome = { status: classification, response, resourceId: plan.resourceId?.(value) ?? null }
    const stored = await this.#complete(scope, key, token, outcome, plan, renewal.leaseEndsAtMs())
    return { kind: 'executed', value, token, outcome: stored, response }
  }

  async #executeInTransaction<T, Tx>(
    store: TransactionalStore<Tx>,
    ctx: Attempt,
    plan: Plan<T>,
    fn: (ctx: TransactionContext<Tx>) => T | Promise<T>,
  ): Promise<RunResult<T>> {
    const { scope, key, token } = ctx
    const renewal = this.#renewWhileRunning(ctx, plan)
    try {
      const done = await store.transaction(async (tx) => {
        const inTx = store.recordStepInTransaction
        // Steps recorded in the transaction commit with the business writes, or roll back with them. The
        // first one locks the record's row until the transaction ends, which keeps any takeover waiting
        // (it then finds the record completed, or, after a rollback, this attempt's lease), so renewals
        // stop there: on another connection they would wait for that lock, and the commit for them.
        if (inTx) {
          ctx.steps.useRecorder(async (name, result) => {
            await renewal.stop()
            return inTx.call(store, tx, scope, key, token, name, result)
          })
        }
        await this.#reconcile(ctx, plan)
        const context = Object.assign(publicContext(ctx), { tx })
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
      this.#emit({ type: 'stored', scope, key, token, status: done.status, durationMs: this.#since(plan) }, plan.onEvent)
      return { kind: 'executed', value: done.value, token, outcome: done.status, response: done.response }
    } catch (error) {
      await renewal.stop()
      if (error instanceof Rollback && error.reason === 'fenced_out') {
        this.#emit({ type: 'fenced_out', scope, key, token, durationMs: this.#since(plan) }, plan.onEvent)
        return { kind: 'executed', value: error.value as T, token, outcome: 'fenced_out', response: error.response }
      }
      await this.#release(scope, key, token, plan)
      if (error instanceof Rollback) {
        return { kind: 'executed', value: error.value as T, token, outcome: 'released', response: error.response }
      }
      throw error
    }
  }

  /**
   * Renews the lease every third of it while the work runs. When the store says the token is no
   * longer current, or renewals fail for a whole lease, the attempt's signal is aborted.
   * A plain timer, not a loop of sleeps: most work ends long before the first renewal is due.
   * `leaseEndsAtMs` is this process's conservative view of when the lease ends: the last renewal's
   * start (or the acquire's end, which is later than the store granted it only by the round trip) plus
   * one lease.
   */
  #renewWhileRunning(attempt: Attempt, plan: RunLimits): { stop(): Promise<void>; leaseEndsAtMs(): number } {
    const leaseMs = plan.leaseMs
    const everyMs = Math.max(1, Math.floor(leaseMs / 3))
    let stopped = false
    let renewedAtMs = this.clock.now()
    let inFlight: Promise<void> | undefined
    const renewOnce = async () => {
      const startedAtMs = this.clock.now()
      let current: boolean
      try {
        current = await this.#call(
          'renew',
          attempt.scope,
          attempt.key,
          () => this.store.renew(attempt.scope, attempt.key, attempt.token, leaseMs),
          plan,
        )
      } catch {
        current = this.clock.now() - renewedAtMs < leaseMs
        if (current) return schedule()
      }
      if (stopped) return
      if (!current) {
        this.#emit(
          { type: 'lease_lost', scope: attempt.scope, key: attempt.key, token: attempt.token, durationMs: this.#since(plan) },
          plan.onEvent,
        )
        attempt.lose(
          new IdempotencyError(
            'FENCED_OUT',
            `Lost the lease on key "${attempt.key}" (token ${attempt.token}): another holder may run it now. Stop work that has not committed.`,
          ),
        )
        return
      }
      renewedAtMs = startedAtMs
      schedule()
    }
    let cancel = () => {}
    const schedule = () => {
      if (stopped) return
      cancel = this.clock.timer(everyMs, () => {
        inFlight = renewOnce()
      })
    }
    schedule()
    return {
      stop: async () => {
        stopped = true
        cancel()
        await inFlight
      },
      leaseEndsAtMs: () => renewedAtMs + leaseMs,
    }
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
  async #complete(
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
        const stored = await this.#call('complete', scope, key, () => this.store.complete(scope, key, token, outcome, plan.ttlMs), plan)
        if (stored) {
          this.#emit({ type: 'stored', scope, key, token, status: outcome.status, durationMs: this.#since(plan) }, plan.onEvent)
          return outcome.status
        }
        this.#emit({ type: 'fenced_out', scope, key, token, durationMs: this.#since(plan) }, plan.onEvent)
        return 'fenced_out'
      } catch (error) {
        const retriable = isIdempotencyError(error) && error.code === 'STORE_UNAVAILABLE'
        const leftMs = giveUpAtMs - this.clock.now()
        if (!retriable || leftMs <= 0) {
          this.#emit(
            { type: 'unrecorded', scope, key, token, status: outcome.status, attempts: attempt, error, durationMs: this.#since(plan) },
            plan.onEvent,
          )
          return 'unrecorded'
        }
        await this.clock.sleep(Math.min(backoffMs, leftMs))
        backoffMs = Math.min(backoffMs * 2, COMPLETE_MAX_BACKOFF_MS)
      }
    }
  }

  /** Releases after a transient failure; a store outage here only means the lease ends by itself. */
  async #release(scope: string, key: string, token: number, plan: RunLimits): Promise<void> {
    try {
      if (await this.#call('release', scope, key, () => this.store.release(scope, key, token), plan)) {
        this.#emit({ type: 'released', scope, key, token, durationMs: this.#since(plan) }, plan.onEvent)
      }
    } catch {
      // Reported by #call; the record becomes acquirable when its lease ends.
    }
  }

  /** One store call: errors become STORE_UNAVAILABLE with the driver's error as cause; network stores get a timeout. */
  async #call<R>(operation: string, scope: string, key: string, call: () => Promise<R>, plan: RunLimits): Promise<R> {
    const startedAtMs = this.clock.now()
    // In-process stores answer synchronously underneath: a timer per call would only cost time.
    const timed = this.store.serverClock ? () => withTimeout(call(), this.#storeTimeoutMs, this.store.name, operation) : call
    try {
      return await (plan.telemetry ? plan.telemetry.storeCall(operation, timed) : timed())
    } catch (error) {
      const wrapped = storeUnavailable(this.store.name, operation, error)
      if (wrapped.code === 'STORE_UNAVAILABLE' || wrapped.code === 'STORE_SCHEMA') {
        this.#emit({ type: 'store_error', scope, key, operation, error: wrapped, durationMs: this.clock.now() - startedAtMs }, plan.onEvent)
      }
      throw wrapped
    }
  }

  /** Milliseconds since the run began. */
  #since(plan: RunLimits): number {
    return this.clock.now() - plan.startedAtMs
  }

  #emit(event: LedgerEvent, listener?: (event: LedgerEvent) => void): void {
    // A broken metrics hook must not break an intent.
    if (this.#onEvent) safely(this.#onEvent, event)
    if (listener) safely(listener, event)
  }
}

/** What the renewal, completion and release of one run need of its plan. */
type RunLimits = Pick<Plan<unknown>, 'leaseMs' | 'ttlMs' | 'onEvent' | 'startedAtMs' | 'telemetry' | 'reconcile'>

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
 * One attempt at an intent: the context the work sees. Its signal is made on first use, since most
 * work never looks at it and an AbortController per call costs more than the rest of a replay.
 */
class Attempt {
  #controller: AbortController | undefined
  #lostReason: unknown
  #steps: StepLog | undefined

  constructor(
    readonly scope: string,
    readonly key: string,
    readonly fingerprint: string,
    readonly token: number,
    readonly recordedSteps: StepEntry[] | undefined,
    readonly storeName: string,
    readonly record: ((name: string, result: string | null) => Promise<boolean>) | undefined,
    readonly markers: boolean,
    readonly clock: Clock,
  ) {}

  /** The attempt's steps, made on first use: most work records none. */
  get steps(): StepLog {
    this.#steps ??= new StepLog(
      this.scope,
      this.key,
      this.token,
      this.recordedSteps,
      this.storeName,
      this.record,
      this.markers,
      () => this.signal,
      () => this.clock.now(),
    )
    return this.#steps
  }

  get takeover(): boolean {
    return this.token > 1
  }

  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController()
      if (this.#lostReason !== undefined) this.#controller.abort(this.#lostReason)
    }
    return this.#controller.signal
  }

  /** The lease is gone: abort the signal now, or as soon as the work looks at it. */
  lose(reason: unknown): void {
    this.#lostReason = reason
    this.#controller?.abort(reason)
  }
}

/** What the work sees of an attempt: its fields and signal (an own property, so a spread keeps it), without `lose`. */
function publicContext(ctx: Attempt): IntentContext {
  return {
    scope: ctx.scope,
    key: ctx.key,
    fingerprint: ctx.fingerprint,
    token: ctx.token,
    takeover: ctx.takeover,
    get signal() {
      return ctx.signal
    },
    step: (name, fn) => ctx.steps.step(name, fn),
    capture: (name, fn) => ctx.steps.capture(name, fn),
    now: () => ctx.steps.now(),
    uuid: () => ctx.steps.uuid(),
    random: () => ctx.steps.random(),
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

async function withTimeout<R>(promise: Promise<R>, ms: number, storeName: string, operation: string): Promise<R> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new IdempotencyError(
            'STORE_UNAVAILABLE',
            `${storeName}: ${operation} took longer than ${ms}ms. Check that the store is reachable and not overloaded.`,
          ),
        ),
      ms,
    )
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}
