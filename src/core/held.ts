import { IdempotencyError } from '../errors.js'
import type { Acquired, IntentContext, RunResult } from './ledger-types.js'
import { Renewal } from './renewal.js'
import type { Outcome, StoredResponse } from './store.js'
import type { Plan } from './store-calls.js'

/** A record this caller holds while its work runs (src/core/ledger.ts): renewed until `finish` or `fail`. */
export class Held<T> extends Renewal implements Acquired<T> {
  readonly kind = 'acquired'
  /** Set when the run was handed back by {@link Ledger.begin} with telemetry: it ends at finish or fail. */
  endsTelemetry = false
  #settled = false
  /** `finish` threw: the work ran, and the record was left as it must stay (see {@link Held.fail}). */
  #finishThrew = false

  get context(): IntentContext {
    return this.attempt
  }

  async finish(value: T): Promise<RunResult<T>> {
    this.#settle()
    const inFlight = this.stop()
    if (inFlight) await inFlight
    const { calls, attempt, plan } = this
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
        await calls.release(scope, key, token, plan)
        result = { kind: 'executed', value, token, outcome: 'released', response }
      } else {
        const outcome: Outcome = { status: classification, response, resourceId: run.resourceId?.(value) ?? null }
        const stored = await calls.complete(scope, key, token, outcome, plan, this.leaseEndsAtMs())
        result = { kind: 'executed', value, token, outcome: stored, response }
      }
    } catch (error) {
      this.#finishThrew = true
      if (this.endsTelemetry) plan.telemetry?.end(undefined, error)
      throw error
    }
    if (this.endsTelemetry) plan.telemetry?.end(result.kind)
    return result
  }

  /**
   * Releases the record: the work failed, and a retry runs it afresh. After a `finish` that threw (the
   * try/catch around both, as docs/ledger.md writes it, lands here with finish's error) it does nothing:
   * the work ran, and finish left the record as it must stay (held until its lease ends when the value
   * could not be recorded), so a release would let a retry run the work again at once, and a refusal
   * would hide finish's error from the caller.
   */
  async fail(error: unknown): Promise<void> {
    if (this.#finishThrew) return
    this.#settle()
    const inFlight = this.stop()
    if (inFlight) await inFlight
    await this.calls.release(this.attempt.scope, this.attempt.key, this.attempt.token, this.plan)
    if (this.endsTelemetry) this.plan.telemetry?.end(undefined, error)
  }

  /**
   * The work ran, but its value cannot become an outcome (`encode` or `classify` threw: a value JSON
   * cannot hold, such as a BigInt or a cycle). Released, a retry would run the work again at once; so the
   * record stays held until its lease ends (its renewal stops here), and this is reported as the
   * outcome the store could not take: an `unrecorded` event, and an error that says what to fix.
   */
  #unstorable(error: unknown): IdempotencyError {
    const { scope, key, token } = this.attempt
    this.calls.emit(
      { type: 'unrecorded', scope, key, token, status: 'completed', attempts: 0, error, durationMs: this.calls.since(this.plan) },
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
