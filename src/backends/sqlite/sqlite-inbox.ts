import type { Duration } from '../../core/duration.js'
import { assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError, storeUnavailable } from '../../errors.js'
import type {
  Inbox,
  InboxBatchResult,
  InboxEvent,
  InboxFailure,
  InboxMessage,
  InboxOldestRecord,
  InboxResult,
} from '../../messaging/inbox/types.js'
import { besideTable, InboxMismatchError, isMissingTable, purgeBatchSize, quoteName } from '../../messaging/message.js'
import { assertMessageHasId, payloadHash, SqlInbox } from '../sql/inbox.js'
import { connect, type SqliteConnection, type SqliteDatabase } from './driver.js'

/** Options of {@link SqliteInbox}. */
export interface SqliteInboxOptions {
  /** An open database, the one your effect writes to: a node:sqlite `DatabaseSync` or a better-sqlite3 `Database`. */
  database: SqliteDatabase
  /** This consumer's name. */
  consumer: string
  /** Table name. @default 'idemkey_inbox' */
  table?: string
  /** How long {@link SqliteInbox.purge} keeps processed IDs. @default '7d' */
  retention?: Duration
  /** Time source (epoch ms). @default Date.now */
  now?: () => number
  onEvent?: (event: InboxEvent) => void
}

/**
 * The inbox on SQLite (node:sqlite or better-sqlite3). SQLite transactions are synchronous, so the effect must be too: it
 * runs inside `BEGIN IMMEDIATE` with the ID insert, and returning a promise is an error.
 *
 * @example
 * const inbox = new SqliteInbox({ database: db, consumer: 'billing' })
 * inbox.migrate()
 * await inbox.handle(message, (db) => db.prepare('UPDATE accounts SET n = n + 1').run())
 */
export class SqliteInbox extends SqlInbox implements Inbox<SqliteDatabase> {
  readonly #db: SqliteConnection
  readonly #table: string
  /** Failed attempts by message (`recordFailure`), for `maxAttempts` across processes. */
  readonly #failures: string
  readonly #now: () => number

  constructor(options: SqliteInboxOptions) {
    const db = connect(options?.database, 'SqliteInbox { database }')
    if (typeof options.consumer !== 'string' || options.consumer.length === 0) {
      throw new IdempotencyError('INVALID_OPTION', 'SqliteInbox needs { consumer }: a non-empty name for this consumer.')
    }
    const table = options.table ?? 'idemkey_inbox'
    const quoted = quoteName(table, 'SqliteInbox table')
    const failures = besideTable(table, 'failures', 'SqliteInbox table')
    super('SqliteInbox', options, { now: options.now })
    this.#db = db
    this.#table = quoted
    this.#failures = failures
    this.#now = options.now ?? Date.now
  }

  /** Creates the tables (processed IDs, and failed attempts for `maxAttempts`). Idempotent. */
  migrate(): void {
    this.#db.exec(`CREATE TABLE IF NOT EXISTS ${this.#table} (
      consumer TEXT NOT NULL, message_id TEXT NOT NULL, payload_hash TEXT NOT NULL, processed_at INTEGER NOT NULL,
      PRIMARY KEY (consumer, message_id))`)
    this.#db.exec(`CREATE TABLE IF NOT EXISTS ${this.#failures} (
      consumer TEXT NOT NULL, message_id TEXT NOT NULL, failures INTEGER NOT NULL, failed_at INTEGER NOT NULL,
      PRIMARY KEY (consumer, message_id))`)
  }

  /** Records one failed attempt of `message` by this consumer and answers how many are recorded. */
  async recordFailure(message: InboxMessage): Promise<number> {
    try {
      const row = this.#db
        .prepare(
          `INSERT INTO ${this.#failures} (consumer, message_id, failures, failed_at) VALUES (?, ?, 1, ?)
           ON CONFLICT (consumer, message_id) DO UPDATE SET failures = failures + 1, failed_at = excluded.failed_at
           RETURNING failures`,
        )
        .get(this.consumer, String(message?.id), this.#now()) as { failures: number | bigint }
      return Number(row.failures)
    } catch (error) {
      throw storeUnavailable('SqliteInbox', `recordFailure ${message?.id} (run migrate() if ${this.#failures} is missing)`, error)
    }
  }

  /** Forgets the failed attempts recorded for `messageId`. */
  async forgetFailures(messageId: string): Promise<void> {
    try {
      this.#db.prepare(`DELETE FROM ${this.#failures} WHERE consumer = ? AND message_id = ?`).run(this.consumer, String(messageId))
    } catch (error) {
      throw storeUnavailable('SqliteInbox', `forgetFailures ${messageId}`, error)
    }
  }

  /** This consumer's messages with attempts recorded, most first (see {@link Inbox.failing}). */
  async failing(limit = 10): Promise<InboxFailure[]> {
    assertPositiveInteger(limit, 'SqliteInbox.failing limit')
    try {
      const rows = this.#db
        .prepare(
          `SELECT message_id, failures, failed_at FROM ${this.#failures} WHERE consumer = ? ORDER BY failures DESC, failed_at DESC LIMIT ?`,
        )
        .all(this.consumer, limit) as Array<{ message_id: string; failures: number | bigint; failed_at: number | bigint }>
      return rows.map((row) => ({ messageId: row.message_id, attempts: Number(row.failures), lastAttemptAtMs: Number(row.failed_at) }))
    } catch (error) {
      // Not migrated since failures were first recorded: none recorded.
      if (isMissingTable(error)) return []
      throw storeUnavailable('SqliteInbox', 'failing', error)
    }
  }

  /** Runs the synchronous `effect` and records the ID in one transaction, unless the ID was processed already. */
  async handle<T>(message: InboxMessage, effect: (db: SqliteDatabase, message: InboxMessage) => Promise<T> | T): Promise<InboxResult<T>> {
    const [result] = this.#inTransaction(`handle ${message?.id}`, [message], effect)
    if (result?.status === 'mismatch') throw result.error
    return result as InboxResult<T>
  }

  /**
   * Handles several messages in one `BEGIN IMMEDIATE` transaction: each new ID is recorded and its
   * synchronous effect runs, in order; duplicates are skipped and a reused ID with another payload is
   * answered `mismatch`. If an effect or the database fails, the whole batch rolls back and the error
   * is thrown (the consumer helpers then handle each message alone).
   */
  async handleBatch<T>(
    messages: readonly InboxMessage[],
    effect: (db: SqliteDatabase, message: InboxMessage) => Promise<T> | T,
  ): Promise<Array<InboxBatchResult<T>>> {
    return this.#inTransaction(`handleBatch of ${messages.length}`, messages, effect)
  }

  #inTransaction<T>(
    label: string,
    messages: readonly InboxMessage[],
    effect: (db: SqliteDatabase, message: InboxMessage) => Promise<T> | T,
  ): Array<InboxBatchResult<T>> {
    for (const message of messages) assertMessageHasId(message, 'inbox.handle')
    const hashes = messages.map((m) => payloadHash(m.payload))
    const insert = this.#db.prepare(
      `INSERT INTO ${this.#table} (consumer, message_id, payload_hash, processed_at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
    )
    const known = this.#db.prepare(`SELECT payload_hash FROM ${this.#table} WHERE consumer = ? AND message_id = ?`)
    let inEffect = false
    const run = (): Array<InboxBatchResult<T>> => {
      const now = this.#now()
      return messages.map((message, i): InboxBatchResult<T> => {
        const hash = hashes[i] as string
        if (Number(insert.run(this.consumer, message.id, hash, now).changes) === 0) {
          const row = known.get(this.consumer, message.id) as { payload_hash: string } | undefined
          return row && row.payload_hash !== hash
            ? { status: 'mismatch', error: new InboxMismatchError(this.consumer, message.id) }
            : { status: 'duplicate' }
        }
        inEffect = true
        const value = effect(this.#db.database, message)
        inEffect = false
        if (value instanceof Promise) {
          value.catch(() => {})
          throw new IdempotencyError(
            'INVALID_ARGUMENT',
            'SqliteInbox effects must be synchronous (a SQLite transaction cannot span an await).',
          )
        }
        return { status: 'applied', value }
      })
    }
    let results: Array<InboxBatchResult<T>>
    try {
      results = this.#db.immediate(run)
    } catch (error) {
      if (inEffect || error instanceof IdempotencyError) throw error
      throw storeUnavailable('SqliteInbox', label, error)
    }
    for (const [i, result] of results.entries()) {
      this.emit({ type: result.status, consumer: this.consumer, messageId: (messages[i] as InboxMessage).id })
    }
    return results
  }

  /** This consumer's oldest kept ID (`null`: none). */
  async oldest(): Promise<InboxOldestRecord | null> {
    const row = this.#db
      .prepare(`SELECT message_id, processed_at FROM ${this.#table} WHERE consumer = ? ORDER BY processed_at LIMIT 1`)
      .get(this.consumer) as { message_id: string; processed_at: number | bigint } | undefined
    return row ? { messageId: String(row.message_id), processedAtMs: Number(row.processed_at) } : null
  }

  /**
   * Deletes this consumer's IDs processed longer ago than the retention, in batches of `batchSize`
   * rows (10,000 by default), each its own short statement and transaction, so a writer waits for
   * one batch at most, then its failed attempts last recorded that long ago. Returns how many IDs.
   * Run it periodically.
   */
  purge(options: { batchSize?: number } = {}): number {
    const batchSize = purgeBatchSize(options)
    const cutoff = this.#now() - this.retentionMs
    const older = (table: string, column: string): number => {
      const purge = this.#db.prepare(
        `DELETE FROM ${table} WHERE rowid IN (SELECT rowid FROM ${table} WHERE consumer = ? AND ${column} < ? LIMIT ?)`,
      )
      let total = 0
      for (;;) {
        const deleted = Number(purge.run(this.consumer, cutoff, batchSize).changes)
        total += deleted
        if (deleted < batchSize) return total
      }
    }
    const total = older(this.#table, 'processed_at')
    try {
      older(this.#failures, 'failed_at')
    } catch (error) {
      // Not migrated since failures were recorded: nothing of theirs to purge.
      if (!isMissingTable(error)) throw error
    }
    return total
  }
}
