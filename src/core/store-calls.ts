/**
 * What the runs of one ledger share (src/core/ledger.ts): the plan a run follows, and the store-call
 * layer that makes its store calls (errors wrapped, network calls timed), reports its events, stores its
 * outcome (retried while the lease lasts) and releases it.
 */
import { IdempotencyError, isIdempotencyError, storeUnavailable } from '../errors.js'
import type { Clock } from './clock.js'
import type { ExecutedOutcome, LedgerEvent, RunTelemetry } from './ledger-types.js'
import type { Classification } from './outcome.js'
import { Schedule, type Scheduled } from './schedule.js'
import type { Reconcile, RecordStepFn } from './steps.js'
import type { IdempotencyStore, Outcome, StoredRecord, StoredResponse } from './store.js'

const COMPLETE_FIRST_BACKOFF_MS = 50
const COMPLETE_MAX_BACKOFF_MS = 1_000

export interface Plan<T> {
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
export type RunLimits = Pick<Plan<unknown>, 'leaseMs' | 'ttlMs' | 'onEvent' | 'startedAtMs' | 'telemetry' | 'reconcile' | 'deadlineMs'>

/**
 * The lease to ask for now: the run's lease, cut to what is left before its deadline (at least 1 ms).
 * The clock is read only for a run with a deadline.
 */
export function leaseFor(plan: RunLimits, clock: Clock): number {
  return plan.deadlineMs === undefined ? plan.leaseMs : Math.max(1, Math.min(plan.leaseMs, plan.deadlineMs - clock.now()))
}

/**
 * What runs share in one ledger: the store calls (errors wrapped, network calls timed), events, the
 * completion and release, and the schedules of renewals and timeouts. Made once per ledger, so a run
 * makes no closures for it.
 */
export class StoreCalls {
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
  stepRecorder(
    attempt: { readonly scope: string; readonly key: string; readonly token: number },
    plan: RunLimits,
  ): RecordStepFn | undefined {
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

function safely(hook: (event: LedgerEvent) => void, event: LedgerEvent): void {
  try {
    hook(event)
  } catch {
    // Swallowed on purpose: see #emit.
  }
}
