import { AsyncLocalStorage } from 'node:async_hooks'
import type { Clock } from '../core/clock.js'
import { Ledger, type LedgerOptions } from '../core/ledger.js'
import type { IdempotencyStore } from '../core/store.js'
import { IdempotencyError } from '../errors.js'
import type { LambdaContextLike } from './types.js'

const invocation = new AsyncLocalStorage<LambdaContextLike>()

/** Runs `fn` as part of the invocation `context`: the leases it takes end by the invocation's deadline. */
export function inInvocation<R>(context: LambdaContextLike | undefined, fn: () => Promise<R>): Promise<R> {
  if (typeof context?.getRemainingTimeInMillis !== 'function') {
    return Promise.reject(
      new IdempotencyError(
        'INVALID_ARGUMENT',
        'An idemkey/lambda wrapper was called without the Lambda context (its second argument). Pass the handler straight to Lambda, or forward (event, context) when you call it yourself.',
      ),
    )
  }
  return invocation.run(context, fn)
}

/**
 * The end of the current invocation in epoch ms by `clock`, or `undefined` outside one: a run's
 * `deadlineMs`, so that no lease it takes outlives the invocation.
 */
export function invocationDeadline(clock: Clock): number | undefined {
  const context = invocation.getStore()
  return context === undefined ? undefined : clock.now() + Math.floor(context.getRemainingTimeInMillis())
}

/** Throws unless `ledger` is a Ledger: the wrappers of idemkey/lambda take any. */
export function assertLedger(ledger: Ledger, wrapper: string): void {
  if (!ledger || typeof ledger.run !== 'function' || typeof ledger.begin !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', `${wrapper} needs a ledger: new Ledger({ store }) from idemkey.`)
  }
}

/**
 * A {@link Ledger} with these options. Kept for code written against earlier versions of idemkey/lambda:
 * the wrappers now cap every lease by the invocation's time left themselves, on any Ledger.
 *
 * @deprecated Use `new Ledger(options)`.
 */
export function lambdaLedger<S extends IdempotencyStore>(options: LedgerOptions<S>): Ledger<S> {
  return new Ledger(options)
}
