/** The lease of an attempt while its work runs (src/core/ledger.ts): renewed, lost, and finished. */
import { IdempotencyError } from '../errors.js'
import { type Attempt, LOSE } from './attempt.js'
import type { Scheduled } from './schedule.js'
import { leaseFor, type RunLimits, type StoreCalls } from './store-calls.js'

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
    protected readonly calls: StoreCalls,
    protected readonly attempt: Attempt,
    protected readonly plan: RunLimits,
  ) {
    this.#renewedAtMs = calls.clock.now()
    this.#everyMs = Math.max(1, Math.floor(plan.leaseMs / 3))
    calls.renewals.add(this, this.#everyMs)
  }

  fire(): void {
    this.#inFlight = this.#renewOnce()
  }

  async #renewOnce(): Promise<void> {
    const { calls, attempt, plan } = this
    const startedAtMs = calls.clock.now()
    let current: boolean
    try {
      // Past the run's deadline no renewal is made: the lease ends there.
      current =
        plan.deadlineMs !== undefined && startedAtMs >= plan.deadlineMs
          ? false
          : await calls.call(
              'renew',
              attempt.scope,
              attempt.key,
              () => calls.store.renew(attempt.scope, attempt.key, attempt.token, leaseFor(plan, calls.clock)),
              plan,
            )
    } catch {
      current = calls.clock.now() - this.#renewedAtMs < plan.leaseMs
      if (current) {
        if (!this.#stopped) calls.renewals.add(this, this.#everyMs)
        return
      }
    }
    // A renewal granted while the run was finishing still moved the lease's end: `complete` (Held.finish waits
    // for this renewal) retries its outcome until shortly before that end, not the previous one.
    if (current) this.#renewedAtMs = startedAtMs
    if (this.#stopped) return
    if (!current) {
      if (calls.listens(plan)) {
        calls.emit(
          { type: 'lease_lost', scope: attempt.scope, key: attempt.key, token: attempt.token, durationMs: calls.since(plan) },
          plan,
        )
      }
      attempt[LOSE](
        new IdempotencyError(
          'FENCED_OUT',
          `Lost the lease on key "${attempt.key}" (token ${attempt.token}): another holder may run it now. Stop work that has not committed.`,
        ),
      )
      return
    }
    calls.renewals.add(this, this.#everyMs)
  }

  /** Ends the renewals; resolves once a renewal under way has ended, `undefined` when none is. */
  stop(): Promise<void> | undefined {
    this.#stopped = true
    this.calls.renewals.remove(this, this.#everyMs)
    return this.#inFlight
  }

  leaseEndsAtMs(): number {
    const endsAtMs = this.#renewedAtMs + this.plan.leaseMs
    return this.plan.deadlineMs === undefined ? endsAtMs : Math.min(endsAtMs, this.plan.deadlineMs)
  }
}
