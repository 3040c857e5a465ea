/** The lease of an attempt while its work runs (src/core/ledger.ts): renewed, lost, and finished. */
import { IdempotencyError } from '../errors.js'
import { type Attempt, LOSE } from './attempt.js'
import type { Acquired, IntentContext, RunResult } from './ledger-types.js'
import { type Core, leaseFor, type Plan, type RunLimits } from './run-core.js'
import type { Scheduled } from './schedule.js'
import type { Outcome, StoredResponse } from './store.js'

/**
 * Renews the lease every third of it while the work runs. When the store says the token is no
 * longer current, or renewals fail for a whole lease, the attempt's signal is aborted.
 * On the ledger's shared schedule, not a timer per run: most work ends long before the first renewal
 * is due. `leaseEndsAtMs` is this process's conservative view of when the lease ends: the last
 * renewal's start (or the acquire's end, which is later than the store granted it only by the round
 * trip) plus one lease.
 */
export class Renewal implements Scheduled {
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
export class Held<T> extends Renewal implements Acquired<T> {
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
      let response: StoredResponse
      let classification: ReturnType<Plan<T>['classify']>
      try {
        response = run.encode(value)
        classification = run.classify(value, response)
      } catch (error) {
        throw this.#unstorable(error)
      }
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

  /**
   * The work ran, but its value cannot become an outcome (`encode` or `classify` threw: a value JSON
   * cannot hold, such as a BigInt or a cycle). Released, a retry would run the work again at once; so the
   * record stays held until its lease ends (it is no longer renewed), and this is reported as the
   * outcome the store could not take: an `unrecorded` event, and an error that says what to fix.
   */
  #unstorable(error: unknown): IdempotencyError {
    const { scope, key, token } = this.attempt
    this.core.emit(
      { type: 'unrecorded', scope, key, token, status: 'completed', attempts: 0, error, durationMs: this.core.since(this.plan) },
      this.plan,
    )
    const reason = error instanceof Error ? error.message : String(error)
    return new IdempotencyError(
      'INVALID_ARGUMENT',
      `The work of ${scope}/${key} ran, but its value could not be recorded (encode or classify threw: ${reason}). The record stays in progress until its lease ends, and a retry after that runs the work again: return a value JSON can hold, or give encode() that turns it into one.`,
      { cause: error },
    )
  }

  #settle(): void {
    if (this.#settled) {
      throw new IdempotencyError('INVALID_ARGUMENT', 'finish() or fail() was already called for this run: call exactly one of them, once.')
    }
    this.#settled = true
  }
}
