/** What the three broker consumer helpers share. */
import { isIdempotencyError } from '../../errors.js'
import type { Inbox, InboxMessage } from '../inbox/types.js'

/** Options every consumer helper takes. */
export interface ConsumeOptions<Tx> {
  inbox: Inbox<Tx>
  /** The effect: runs in the inbox's transaction, with the message. */
  handler: (tx: Tx, message: InboxMessage) => Promise<unknown> | unknown
  /** Called when a message fails (it comes back later) or is refused for good (mismatch, no ID). */
  onError?: (error: unknown, message: InboxMessage) => void
}

/** A running consumer. */
export interface RunningConsumer {
  /** Stops taking messages and waits for the ones in hand. */
  stop(): Promise<void>
  /** Resolves when the consumer has stopped. */
  readonly done: Promise<void>
}

/**
 * Handles one message through the inbox. `ack`: applied now or before (a duplicate). `retry`: the
 * effect or the database failed; leave it to the broker. `reject`: redelivery cannot help (same ID,
 * other payload; no ID): drop it and report.
 */
export async function processMessage<Tx>(options: ConsumeOptions<Tx>, message: InboxMessage): Promise<'ack' | 'retry' | 'reject'> {
  try {
    await options.inbox.handle(message, (tx) => options.handler(tx, message))
    return 'ack'
  } catch (error) {
    options.onError?.(error, message)
    if (isIdempotencyError(error) && (error.code === 'FINGERPRINT_MISMATCH' || error.code === 'INVALID_ARGUMENT')) return 'reject'
    return 'retry'
  }
}
