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

/**
 * One message's outcome in {@link Inbox.handleBatch}: as in `handle`, or `mismatch` (the same ID was
 * processed with another payload; the error is what `handle` would have thrown).
 */
export type InboxBatchResult<T> = InboxResult<T> | { status: 'mismatch'; error: Error }

/** What the inbox reports, for metrics. */
export type InboxEvent =
  | { type: 'applied'; consumer: string; messageId: string }
  /** `record()` took a new ID in the caller's transaction: applied once that commits. */
  | { type: 'recorded'; consumer: string; messageId: string }
  | { type: 'duplicate'; consumer: string; messageId: string }
  | { type: 'mismatch'; consumer: string; messageId: string }

/** A message with attempts recorded against `maxAttempts` (see {@link Inbox.failing}). */
export interface InboxFailure {
  messageId: string
  /** Attempts recorded: failures, and redelivered runs counted before they ran. */
  attempts: number
  /** When the last one was recorded (epoch ms). */
  lastAttemptAtMs: number
}

/** The oldest processed ID an inbox still keeps (`idemkey inspect --inboxes`, the operator page). */
export interface InboxOldestRecord {
  messageId: string
  /** When it was processed (epoch ms, the database's clock). */
  processedAtMs: number
}

/**
 * Any inbox: the broker consumer helpers take one. `Tx` is what the effect receives (a `pg`
 * client inside the transaction, or the better-sqlite3 database).
 */
export interface Inbox<Tx> {
  readonly consumer: string
  /**
   * How long processed IDs are kept (the dedup window), when the inbox knows it. The consumer helpers
   * compare it with how long the broker can still redeliver a message, and warn when it is shorter.
   */
  readonly retentionMs?: number
  /**
   * Optional: this consumer's oldest kept ID, `null` when it keeps none. Older than the retention:
   * `purge()` is not running; much younger: the inbox is new or was emptied, and covers less than it says.
   */
  oldest?(): Promise<InboxOldestRecord | null>
  handle<T>(message: InboxMessage, effect: (tx: Tx, message: InboxMessage) => Promise<T> | T): Promise<InboxResult<T>>
  /**
   * Optional: records one failed attempt of `message` by this consumer, in a statement of its own (the
   * transaction that failed has rolled back), and answers how many are recorded: by every process of
   * this consumer, across restarts. The consumer helpers count `maxAttempts` with it (docs/messaging.md,
   * "A message that always fails"); without it, each process counts its own attempts.
   */
  recordFailure?(message: InboxMessage): Promise<number>
  /** Optional: forgets the failed attempts recorded for `messageId` (once it is given up on: moved back, it starts afresh). */
  forgetFailures?(messageId: string): Promise<void>
  /**
   * Optional: this consumer's messages with attempts recorded and not yet applied or given up on (failing,
   * or redelivered and running), most attempts first, then the latest; at most `limit` (default 10).
   * Empty when the failures table does not exist (an inbox not migrated since). `idemkey inspect
   * --inboxes` lists them.
   */
  failing?(limit?: number): Promise<InboxFailure[]>
  /**
   * Optional: several messages in one transaction, their effects run one after another in the given
   * order, one commit for all; one result per message, in order. Any error (an effect's, the
   * database's, a message without ID) rolls the whole batch back and is thrown: the consumer helpers
   * then handle each message alone with `handle`.
   */
  handleBatch?<T>(
    messages: readonly InboxMessage[],
    effect: (tx: Tx, message: InboxMessage) => Promise<T> | T,
  ): Promise<Array<InboxBatchResult<T>>>
}
