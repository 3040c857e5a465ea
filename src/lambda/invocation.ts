import { AsyncLocalStorage } from 'node:async_hooks'
import { Ledger, type LedgerOptions } from '../core/ledger.js'
import type { IdempotencyStore } from '../core/store.js'
import { IdempotencyError } from '../errors.js'
import type { LambdaContextLike } from './types.js'

const invocation = new AsyncLocalStorage<LambdaContextLike>()
const BOUND = Symbol.for('idemkey.lambda.invocationBound')

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

/** The current invocation's time left, or `undefined` outside one. */
function remainingMs(): number | undefined {
  const context = invocation.getStore()
  return context === undefined ? undefined : Math.floor(context.getRemainingTimeInMillis())
}

/**
 * The store with every lease capped by the time left in the current Lambda invocation, so the record of
 * an invocation that times out frees itself when the invocation ends, not a whole lease later. A renewal
 * after the deadline is refused (the lease is lost). Outside an invocation the store is unchanged.
 */
export function boundToInvocation<S extends IdempotencyStore>(store: S): S {
  if ((store as unknown as Record<symbol, unknown>)[BOUND]) return store
  return new Proxy(store, {
    get(target, property) {
      if (property === BOUND) return true
      if (property === 'acquire') {
        return (scope: string, key: string, fingerprint: string, leaseMs: number) => {
          const left = remainingMs()
          return target.acquire(scope, key, fingerprint, left === undefined ? leaseMs : Math.max(1, Math.min(leaseMs, left)))
        }
      }
      if (property === 'renew') {
        return async (scope: string, key: string, token: number, leaseMs: number) => {
          const left = remainingMs()
          if (left !== undefined && left <= 0) return false
          return target.renew(scope, key, token, left === undefined ? leaseMs : Math.min(leaseMs, left))
        }
      }
      const value = Reflect.get(target, property, target)
      // Stores keep private fields: their methods must run on the store itself, not on the proxy.
      return typeof value === 'function' ? value.bind(target) : value
    },
  })
}

/** Whether a ledger's store caps its leases by the invocation (made by {@link lambdaLedger}). */
export function assertLambdaLedger(ledger: Ledger, wrapper: string): void {
  if (!ledger || typeof ledger.run !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', `${wrapper} needs a ledger: lambdaLedger({ store }) from idemkey/lambda.`)
  }
  if (!(ledger.store as unknown as Record<symbol, unknown>)[BOUND]) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${wrapper} needs a ledger made by lambdaLedger({ store, ... }) from idemkey/lambda (it takes the same options as new Ledger), so that no lease outlives the invocation that took it. Replace new Ledger(...) with lambdaLedger(...).`,
    )
  }
}

/**
 * A {@link Ledger} for Lambda functions: the same options, and each lease it takes is capped by
 * `context.getRemainingTimeInMillis()` of the invocation that runs it. The wrappers of `idemkey/lambda` need it.
 *
 * @example
 * const ledger = lambdaLedger({ store: new DynamoDbStore({ table: 'idemkey' }) })
 */
export function lambdaLedger<S extends IdempotencyStore>(options: LedgerOptions<S>): Ledger<S> {
  if (!options?.store || typeof options.store.acquire !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'lambdaLedger({ store }) needs a store, e.g. new DynamoDbStore({ table }).')
  }
  return new Ledger({ ...options, store: boundToInvocation(options.store) })
}
