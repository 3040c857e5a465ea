import { runDurations } from '../core/duration.js'
import type { Ledger, RunOptions } from '../core/ledger.js'
import { assertFunctions } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'
import { assertLedger, inInvocation, invocationDeadline } from './invocation.js'
import type { LambdaContextLike } from './types.js'

/** Options of {@link makeIdempotent}. */
export interface MakeIdempotentOptions<E, R> extends Pick<RunOptions<R>, 'encode' | 'decode' | 'lease' | 'ttl' | 'wait' | 'onEvent'> {
  /** The ledger: `new Ledger({ store })`. */
  ledger: Ledger
  /**
   * The idempotency key of an event. An event without one (`undefined` or `''`) throws `KEY_MISSING`:
   * it never shares a record with other keyless events, and never runs unguarded.
   */
  key: (event: E) => string | undefined
  /** What is fingerprinted: the same key with another payload throws `FINGERPRINT_MISMATCH` instead of replaying. @default the event */
  payload?: (event: E) => unknown
  /**
   * The namespace of the keys. @default `lambda:<function name>` (the context's `functionName`), so one
   * event delivered to two functions (a rule with two targets) runs in each; 'default' without a name
   */
  scope?: string | ((event: E) => string)
}

/**
 * Makes any Lambda handler (EventBridge, Step Functions tasks, direct invocations) run once per key:
 * a repeated event gets the first run's stored result. A key reused with another payload throws
 * `FINGERPRINT_MISMATCH`; an event whose key another invocation is running throws `IN_PROGRESS` (Lambda
 * retries it). The result must be JSON unless you give `encode` and `decode`.
 *
 * @example
 * export const handler = makeIdempotent(async (event) => ship(event.detail.orderId), { ledger, key: (event) => event.id })
 */
export function makeIdempotent<E, R, C extends LambdaContextLike>(
  fn: (event: E, context: C) => R | Promise<R>,
  options: MakeIdempotentOptions<E, R>,
): (event: E, context: C) => Promise<R> {
  assertLedger(options?.ledger, 'makeIdempotent (idemkey/lambda)')
  if (typeof options.key !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'makeIdempotent(fn, { ledger, key }) needs key: (event) => string, e.g. (event) => event.id.',
    )
  }
  assertFunctions(
    'makeIdempotent()',
    { fn, scope: options.scope, payload: options.payload, encode: options.encode, decode: options.decode, onEvent: options.onEvent },
    { required: ['fn'], orString: ['scope'] },
  )
  const { ledger, key: keyOf, payload, scope } = options
  const runOptions: RunOptions<R> = {
    encode: options.encode,
    decode: options.decode,
    // Checked here, so a bad duration fails when the handler is made (at cold start), not each invocation.
    ...runDurations(options),
    onEvent: options.onEvent,
  }
  return function idempotent(event: E, context: C): Promise<R> {
    return inInvocation(context, async () => {
      const key = keyOf(event)
      if (typeof key !== 'string' || key === '') {
        throw new IdempotencyError(
          'KEY_MISSING',
          'makeIdempotent: this event has no idempotency key (the key function returned nothing), so it was not run. Fix the key function or the event.',
        )
      }
      const result = await ledger.run(
        {
          key,
          scope: typeof scope === 'function' ? scope(event) : (scope ?? functionScope(context)),
          payload: payload ? payload(event) : event,
        },
        () => fn(event, context),
        // No lease outlives the invocation: a timed-out one frees its record when it ends.
        { ...runOptions, deadlineMs: invocationDeadline(ledger.clock) },
      )
      switch (result.kind) {
        case 'executed':
        case 'replayed':
          return result.value
        case 'mismatch':
          throw new IdempotencyError(
            'FINGERPRINT_MISMATCH',
            `makeIdempotent: key "${key}" was already used with another payload, so this event was not run. Use a new key for a new event.`,
          )
        default:
          throw new IdempotencyError(
            'IN_PROGRESS',
            `makeIdempotent: key "${key}" is being run by another invocation; retry after ${Math.ceil(result.retryAfterMs / 1000)} s.`,
          )
      }
    })
  }
}

/**
 * The default scope: the function's. Every function shares a table's default scope otherwise, and the
 * second function an event reaches (one EventBridge rule, two targets) replayed the first one's result.
 */
function functionScope(context: LambdaContextLike): string | undefined {
  const name = context.functionName
  return typeof name === 'string' && name !== '' ? `lambda:${name}` : undefined
}
