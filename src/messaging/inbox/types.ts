/** A message as the inbox sees it, whatever broker it came from. */
export interface InboxMessage {
  /** The producer's stable message ID (the outbox row's `id`). */
  id: string
  /** The payload bytes; the inbox hashes them to flag the same ID with another payload. */
  payload: Uint8Array | string
  topic?: string
  headers?: Record<string, string>
}

/** `applied`: the effect ran and committed. `duplicate`: seen before with the same payload, skipped. */
export type InboxResult<T> = { status: 'applied'; value: T } | { status: 'duplicate' }

/** What the inbox reports, for metrics. */
export type InboxEvent =
  | { type: 'applied'; consumer: string; messageId: string }
  /** `record()` took a new ID in the caller's transaction: applied once that commits. */
  | { type: 'recorded'; consumer: string; messageId: string }
  | { type: 'duplicate'; consumer: string; messageId: string }
  | { type: 'mismatch'; consumer: string; messageId: string }

/**
 * Any inbox: the broker consumer helpers take one. `Tx` is what the effect receives (a `pg`
 * client inside the transaction, or the better-sqlite3 database).
 */
export interface Inbox<Tx> {
  readonly consumer: string
  handle<T>(message: InboxMessage, effect: (tx: Tx, message: InboxMessage) => Promise<T> | T): Promise<InboxResult<T>>
}
