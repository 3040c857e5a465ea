import type { Ledger } from '../core/ledger.js'
import { assertFunctions } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'
import { assertLedger, inInvocation, invocationDeadline } from './invocation.js'
import type { LambdaContextLike, SqsBatchResponse, SqsEventLike, SqsRecordLike } from './types.js'

/** Options of {@link sqsBatchHandler}. */
export interface SqsBatchOptions<R extends SqsRecordLike = SqsRecordLike> {
  /**
   * The record's idempotency key: a function, or `{ attribute }` to read a message attribute (a producer's
   * own message ID, which survives a re-send that SQS gives a new `messageId`). A record without one fails
   * (it is reported in `batchItemFailures`, and lands in the dead-letter queue after its retries). @default record.messageId
   */
  key?: ((record: R) => string | undefined) | { attribute: string }
  /** The scope of the keys. @default the queue's ARN (`eventSourceARN`) */
  scope?: string | ((record: R) => string)
  /** What is fingerprinted: a key reused with another payload is not applied (and is reported failed). @default record.body */
  payload?: (record: R) => unknown
  /** Called for each record that failed (thrown, key reused with another payload, held by another invocation, no key). @default console.error */
  onRecordError?: (error: unknown, record: R) => void
}

/**
 * Wraps an SQS record handler for a batch event source with partial batch responses
 * (`ReportBatchItemFailures`): each record is applied once, however often SQS delivers it, and the
 * result lists exactly the records that failed, so only those come back. Records of a FIFO queue stop
 * at the first failure: it and every record after it are reported, to keep each group's order.
 *
 * @example
 * export const handler = sqsBatchHandler(ledger, async (record) => { await fulfil(JSON.parse(record.body)) })
 */
export function sqsBatchHandler<R extends SqsRecordLike, C extends LambdaContextLike>(
  ledger: Ledger,
  handler: (record: R, context: C) => unknown,
  options: SqsBatchOptions<R> = {},
): (event: { Records: R[] }, context: C) => Promise<SqsBatchResponse> {
  assertLedger(ledger, 'sqsBatchHandler (idemkey/lambda)')
  assertFunctions(
    'sqsBatchHandler()',
    { handler, scope: options.scope, payload: options.payload, onRecordError: options.onRecordError },
    { required: ['handler'], orString: ['scope'] },
  )
  const keyOf = recordKey(options.key)
  const scopeOf =
    typeof options.scope === 'function'
      ? options.scope
      : (record: R) => (options.scope as string | undefined) ?? record.eventSourceARN ?? 'sqs'
  const payloadOf = options.payload ?? ((record: R) => record.body)
  const onError =
    options.onRecordError ??
    ((error: unknown, record: R) => console.error(`idemkey: SQS record ${record.messageId} failed and will be delivered again:`, error))
  return function idempotentBatch(event: { Records: R[] }, context: C): Promise<SqsBatchResponse> {
    return inInvocation(context, async () => {
      const failures: { itemIdentifier: string }[] = []
      const records = (event as SqsEventLike).Records as R[]
      for (let i = 0; i < records.length; i++) {
        const record = records[i] as R
        const ok = await applyOnce(record)
        if (ok) continue
        if (record.eventSourceARN?.endsWith('.fifo')) {
          for (const rest of records.slice(i)) failures.push({ itemIdentifier: rest.messageId })
          break
        }
        failures.push({ itemIdentifier: record.messageId })
      }
      return { batchItemFailures: failures }
    })

    async function applyOnce(record: R): Promise<boolean> {
      try {
        const key = keyOf(record)
        const scope = scopeOf(record)
        const result = await ledger.run(
          { key, scope, payload: payloadOf(record) ?? null },
          // The handler's value goes nowhere (a batch answers only with its failures), so none is stored:
          // one JSON cannot hold (a BigInt, a circular object) failed the record after its effect had run.
          async () => {
            await handler(record, context)
            return null
          },
          // No lease outlives the invocation: a timed-out one frees its record when it ends.
          { deadlineMs: invocationDeadline(ledger.clock) },
        )
        // The handler ran, whatever became of its outcome: reported failed, the record would be delivered
        // again and, its record not completed, run a second time. An outcome the store did not take
        // (`unrecorded`) is reported loudly by the ledger (its `unrecorded` event), not by the batch.
        if (result.kind === 'executed' || result.kind === 'replayed') return true
        if (result.kind === 'mismatch') {
          throw new IdempotencyError(
            'FINGERPRINT_MISMATCH',
            `SQS record ${record.messageId}: key "${key}" was already applied with another payload, so this record was not applied. Give each distinct message its own key.`,
          )
        }
        throw new IdempotencyError(
          'IN_PROGRESS',
          `SQS record ${record.messageId}: key "${key}" is being applied by another invocation right now; reported failed so SQS delivers it again after its visibility timeout.`,
        )
      } catch (error) {
        try {
          onError(error, record)
        } catch {
          // A broken hook must not lose the other records' results.
        }
        return false
      }
    }
  }
}

function recordKey<R extends SqsRecordLike>(key: SqsBatchOptions<R>['key']): (record: R) => string {
  if (key === undefined) return (record) => record.messageId
  if (typeof key !== 'function' && (typeof key?.attribute !== 'string' || key.attribute === '')) {
    // A bare attribute name ('orderId') read as no attribute: every record failed with KEY_MISSING.
    throw new IdempotencyError(
      'INVALID_OPTION',
      `sqsBatchHandler(): key must be a function (record) => key, or { attribute: 'name' } for a message attribute, got ${JSON.stringify(key)}.`,
    )
  }
  const read =
    typeof key === 'function'
      ? key
      : (record: R) => {
          const value = record.messageAttributes?.[key.attribute]?.stringValue
          return value === undefined || value === '' ? undefined : value
        }
  return (record) => {
    const value = read(record)
    if (typeof value !== 'string' || value === '') {
      throw new IdempotencyError(
        'KEY_MISSING',
        `SQS record ${record.messageId} has no idempotency key${typeof key === 'object' ? ` (message attribute "${key.attribute}")` : ''}, so it was not applied. Send the attribute with every message, or key on messageId.`,
      )
    }
    return value
  }
}
