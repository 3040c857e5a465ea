import type { Duration } from '../../core/duration.js'
import { assertSqlTransactions, type SqlTransactions } from '../../core/sql-transactions.js'
import { assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import type { InboxEvent, InboxFailure, InboxMessage, InboxOldestRecord } from '../../messaging/inbox/types.js'
import { isMissingTable, purgeBatchSize } from '../../messaging/message.js'
import { assertMessageHasId, type Seen, TransactionalSqlInbox, type TransactionWork, trackEffects } from '../sql/inbox.js'
import {
  executeIn,
  type MySqlConnectionLike,
  type MySqlPoolLike,
  type MySqlTableName,
  migrateMySql,
  mysqlBesideTable,
  mysqlMessagingError,
  mysqlTableName,
  NOW_MS,
} from './messaging.js'

/** Options of {@link MySqlInbox}. */
export interface MySqlInboxOptions<Tx = MySqlConnectionLike> {
  /** The user's mysql2 promise pool; each message runs in a transaction on one of its connections. */
  pool: MySqlPoolLike
  /** This consumer's name (at most 255 bytes): the same message ID is processed once per consumer name. */
  consumer: string
  /** Table name, optionally `database.table`. @default 'idemkey_inbox' */
  table?: string
  /**
   * How long a processed ID is remembered by {@link MySqlInbox.purge}. Must exceed the longest time
   * after which a broker (or a relay) may still deliver a copy: see docs/messaging.md. @default '7d'
   */
  retention?: Duration
  onEvent?: (event: InboxEvent) => void
  /**
   * Your data layer (docs/orm.md): `record(tx, …)` then takes the tool's own transaction object of a
   * MySQL connection. @example new MySqlInbox({ pool, consumer: 'billing', transactions: knexTransactions(db) })
   */
  transactions?: SqlTransactions<Tx>
}

/** Longest message ID and consumer name, in UTF-8 bytes (the key columns are VARBINARY). */
const MAX_ID_BYTES = 1020
const MAX_CONSUMER_BYTES = 255

/** ER_LOCK_DEADLOCK, and how many transactions `handle` and `handleBatch` try before reporting one. */
const DEADLOCK = 1213
const DEADLOCK_ATTEMPTS = 5

/**
 * Identity columns are VARBINARY (every text collation folds case or pads spaces). `mismatches` counts
 * copies of an ID that came with another payload; recording a known ID bumps it and, for the same
 * payload, takes the bump back (see `recordId`): each statement changes the row it matches, so
 * `affectedRows` tells the answer with or without CLIENT_FOUND_ROWS, and through any data-layer tool
 * (which reports only affected rows on MySQL).
 */
const MIGRATIONS = (t: MySqlTableName): string[][] => [
  [
    `CREATE TABLE IF NOT EXISTS ${t.sql} (
      consumer VARBINARY(255) NOT NULL,
      message_id VARBINARY(1020) NOT NULL,
      payload_hash CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      processed_at BIGINT NOT NULL,
      mismatches INT NOT NULL DEFAULT 0,
      PRIMARY KEY (consumer, message_id),
      KEY inbox_processed_at (consumer, processed_at)
    ) ENGINE = InnoDB`,
  ],
]

/**
 * Failed attempts by message (`recordFailure`), for `maxAttempts` across a consumer's processes. Created
 * beside the versioned schema rather than as a version of it: an older idemkey that migrates the same
 * inbox (a rolling upgrade) neither knows nor minds it, where a version it does not know would stop it.
 */
const FAILURES_TABLE = (failures: string): string => `CREATE TABLE IF NOT EXISTS ${failures} (
      consumer VARBINARY(255) NOT NULL,
      message_id VARBINARY(1020) NOT NULL,
      failures INT NOT NULL,
      failed_at BIGINT NOT NULL,
      PRIMARY KEY (consumer, message_id),
      KEY inbox_failed_at (consumer, failed_at)
    ) ENGINE = InnoDB`

function assertMessageId(message: InboxMessage): void {
  assertMessageHasId(message)
  if (Buffer.byteLength(message.id) > MAX_ID_BYTES) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `inbox: message ID "${message.id.slice(0, 40)}…" is ${Buffer.byteLength(message.id)} bytes; MySqlInbox keeps IDs of at most ${MAX_ID_BYTES}. Have the producer use shorter IDs (the outbox's are at most 255 characters).`,
    )
  }
}

/** How the inbox's statements run in a transaction: the SQL and its values in, the number of affected rows out. */
type Run = (sql: string, values: readonly (string | Buffer)[]) => Promise<number>

/**
 * The inbox on MySQL 8 or MariaDB 10.6+: records each message ID in the same transaction as the
 * effect, so the effect is applied once however often the broker redelivers. A redelivered ID is
 * reported as `duplicate` (acknowledge it); the same ID with another payload throws
 * {@link InboxMismatchError}. Two consumers handling the same ID at once: the second waits on the
 * row lock and then sees a duplicate.
 *
 * @example
 * const inbox = new MySqlInbox({ pool, consumer: 'billing' })
 * await inbox.migrate()
 * const result = await inbox.handle({ id, payload }, async (tx) => {
 *   await tx.execute('UPDATE accounts SET balance = balance + ? WHERE id = ?', [amount, account])
 * })
 * ack() // applied or duplicate: either way the broker may forget it
 *
 * @example
 * // In a transaction you run: pass its mysql2 connection, or your tool's transaction object with `transactions`.
 * await conn.query('START TRANSACTION')
 * if ((await inbox.record(conn, message)) === 'new') await applyEffect(conn)
 * await conn.query('COMMIT')
 */
export class MySqlInbox<Tx = MySqlConnectionLike> extends TransactionalSqlInbox<Tx, Run> {
  readonly #pool: MySqlPoolLike
  readonly #table: MySqlTableName
  /** Failed attempts by message (`recordFailure`), for `maxAttempts` across processes. */
  readonly #failures: string
  readonly #consumerBytes: Buffer
  readonly #insert: string
  readonly #settle: string

  constructor(options: MySqlInboxOptions<Tx>) {
    if (typeof options?.pool?.getConnection !== 'function' || typeof options.pool.query !== 'function') {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'MySqlInbox needs { pool }: a mysql2/promise pool (mysql.createPool(...) from "mysql2/promise"), or anything with query(), execute() and getConnection().',
      )
    }
    if (typeof options.consumer !== 'string' || options.consumer.length === 0 || Buffer.byteLength(options.consumer) > MAX_CONSUMER_BYTES) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `MySqlInbox needs { consumer }: a non-empty name for this consumer of at most ${MAX_CONSUMER_BYTES} bytes, e.g. "billing".`,
      )
    }
    if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'MySqlInbox', 'mysql')
    const table = mysqlTableName(options.table ?? 'idemkey_inbox', 'MySqlInbox table')
    // Fitted to 63 bytes, within MySQL's 64.
    const failures = mysqlBesideTable(table, 'failures')
    super('MySqlInbox', options)
    this.#pool = options.pool
    this.#consumerBytes = Buffer.from(options.consumer, 'utf8')
    this.#table = table
    this.#failures = failures
    // 1 row for a new ID; 2 for a known one, whose row it always changes (CLIENT_FOUND_ROWS or not).
    this.#insert = `INSERT INTO ${this.#table.sql} (consumer, message_id, payload_hash, processed_at) VALUES (?, ?, ?, ${NOW_MS})
      ON DUPLICATE KEY UPDATE mismatches = mismatches + 1`
    this.#settle = `UPDATE ${this.#table.sql} SET mismatches = mismatches - 1 WHERE consumer = ? AND message_id = ? AND payload_hash = ?`
  }

  /** Creates the table. Idempotent; safe to run from several processes at once. */
  async migrate(): Promise<void> {
    await migrateMySql(this.#pool, 'MySqlInbox', this.#table, MIGRATIONS(this.#table))
    try {
      await this.#pool.query(FAILURES_TABLE(this.#failures))
    } catch (error) {
      throw new IdempotencyError('STORE_SCHEMA', `MySqlInbox.migrate on ${this.#failures} failed: ${(error as Error).message}.`, {
        cause: error,
      })
    }
  }

  /**
   * Records one failed attempt of `message` by this consumer, in a statement of its own, and answers
   * how many are recorded (every process of this consumer, across restarts): `maxAttempts` counts them.
   */
  async recordFailure(message: InboxMessage): Promise<number> {
    assertMessageId(message)
    try {
      // One statement, atomic: an update hands the new count back as LAST_INSERT_ID (the OK packet's
      // insertId); a new row (1 row affected, 2 for an update) is the first failure.
      const [result] = await this.#pool.query(
        `INSERT INTO ${this.#failures} (consumer, message_id, failures, failed_at) VALUES (?, ?, 1, ${NOW_MS})
         ON DUPLICATE KEY UPDATE failures = LAST_INSERT_ID(failures + 1), failed_at = ${NOW_MS}`,
        [this.#consumerBytes, Buffer.from(message.id, 'utf8')],
      )
      const { affectedRows, insertId } = result as { affectedRows: number; insertId: number }
      return affectedRows === 1 ? 1 : Number(insertId)
    } catch (error) {
      throw mysqlMessagingError('MySqlInbox', `recordFailure ${message.id}`, error, this.#table)
    }
  }

  /** Forgets the failed attempts recorded for `messageId`. */
  async forgetFailures(messageId: string): Promise<void> {
    try {
      await this.#pool.query(`DELETE FROM ${this.#failures} WHERE consumer = ? AND message_id = ?`, [
        this.#consumerBytes,
        Buffer.from(String(messageId), 'utf8'),
      ])
    } catch (error) {
      throw mysqlMessagingError('MySqlInbox', `forgetFailures ${messageId}`, error, this.#table)
    }
  }

  /** This consumer's messages with attempts recorded, most first (see {@link Inbox.failing}). */
  async failing(limit = 10): Promise<InboxFailure[]> {
    assertPositiveInteger(limit, 'MySqlInbox.failing limit')
    try {
      const [rows] = await this.#pool.query(
        `SELECT message_id, failures, failed_at FROM ${this.#failures} WHERE consumer = ? ORDER BY failures DESC, failed_at DESC LIMIT ?`,
        [this.#consumerBytes, limit],
      )
      return (rows as Array<{ message_id: Buffer | string; failures: number; failed_at: number | string }>).map((row) => ({
        messageId: Buffer.isBuffer(row.message_id) ? row.message_id.toString('utf8') : String(row.message_id),
        attempts: Number(row.failures),
        lastAttemptAtMs: Number(row.failed_at),
      }))
    } catch (error) {
      // Not migrated since failures were first recorded: none recorded.
      if (isMissingTable(error)) return []
      throw mysqlMessagingError('MySqlInbox', 'failing', error, this.#table)
    }
  }

  protected assertMessage(message: InboxMessage): void {
    assertMessageId(message)
  }

  protected statementsIn(tx: Tx): Run {
    return (sql, values) => executeIn(this.tool, tx, sql, values)
  }

  protected failure(label: string, error: unknown): IdempotencyError {
    return mysqlMessagingError('MySqlInbox', label, error, this.#table)
  }

  protected override recordLabel(messageId: string): string {
    const through = this.tool ? ` (through ${this.tool.tool})` : ''
    return `record ${messageId}${through}`
  }

  /**
   * Each ID's first copy is recorded first, in one order whatever the batch's, so two consumers'
   * batches take their row locks in the same order and cannot deadlock on each other.
   */
  protected async recordBatch(run: Run, messages: readonly InboxMessage[], hashes: string[]): Promise<Seen[]> {
    const firstIndex = new Map<string, number>()
    for (const [i, message] of messages.entries()) if (!firstIndex.has(message.id)) firstIndex.set(message.id, i)
    const seen: Array<Seen | undefined> = messages.map(() => undefined)
    // The hash each new ID was taken under by its first copy; its other copies compare with it.
    const taken = new Map<string, string>()
    for (const id of [...firstIndex.keys()].sort()) {
      const i = firstIndex.get(id) as number
      seen[i] = await this.recordId(run, id, hashes[i] as string)
      if (seen[i] === 'new') taken.set(id, hashes[i] as string)
    }
    for (const [i, message] of messages.entries()) {
      if (seen[i] !== undefined) continue
      const first = taken.get(message.id)
      const hash = hashes[i] as string
      if (first !== undefined) seen[i] = first === hash ? 'duplicate' : 'mismatch'
      else {
        // Its first copy was known before the batch: this copy's own payload decides.
        seen[i] = await this.recordId(run, message.id, hash)
        if (seen[i] === 'new') taken.set(message.id, hash)
      }
    }
    return seen as Seen[]
  }

  /**
   * The ID's INSERT, then for a known ID the settling UPDATE: it takes back the INSERT's bump when the
   * payload is the same (a duplicate), and matches nothing for another payload (a mismatch, counted).
   * Both read the latest committed row, whatever snapshot the caller's transaction holds.
   *
   * Why copies arriving at once cannot deadlock: the INSERT's ON DUPLICATE KEY UPDATE takes the known
   * row's exclusive record lock at once (InnoDB, MySQL 8 and MariaDB alike; it waits on an uncommitted
   * insert of the same key by asking for that lock), so the copies queue for one lock and each holds
   * it alone until its transaction ends; the UPDATE then needs no lock it does not hold. An INSERT
   * IGNORE took a shared lock instead: every waiting copy held one, each then asked for the exclusive
   * lock to update the row, and waited on the others' shared locks (a deadlock, rolled back with
   * "Deadlock found" for all but one).
   *
   *     copy A: INSERT (new row, locked) ... effect ... COMMIT
   *     copy B: INSERT waits for the X lock ----------------> gets it: known; UPDATE; ROLLBACK
   *     copy C: INSERT waits for the X lock ----------------------------------------> gets it ...
   */
  protected async recordId(run: Run, messageId: string, hash: string): Promise<Seen> {
    const id = Buffer.from(messageId, 'utf8')
    if ((await run(this.#insert, [this.#consumerBytes, id, hash])) === 1) return 'new'
    return (await run(this.#settle, [this.#consumerBytes, id, hash])) > 0 ? 'duplicate' : 'mismatch'
  }

  /**
   * A transaction on a pooled connection (`START TRANSACTION` ... `COMMIT`).
   *
   * A deadlock before any effect ran is retried in a new transaction (InnoDB rolled the whole one
   * back, and nothing of it had happened yet: as a redelivery would). It happens when the copy that
   * inserted an ID rolls back (its effect failed) while others wait on the row: InnoDB hands each
   * waiter a gap lock where the row was, and each one's insert then waits on the others' gap locks.
   */
  protected async onPool<R>(label: string, work: TransactionWork<Run, Tx, R>): Promise<R> {
    let connection: MySqlConnectionLike
    try {
      connection = await this.#pool.getConnection()
    } catch (error) {
      throw this.failure('connect', error)
    }
    try {
      for (let attempt = 1; ; attempt++) {
        let inTransaction = false
        const effects = trackEffects()
        try {
          await connection.query('START TRANSACTION')
          inTransaction = true
          const { value, rollback } = await work(
            (sql, values) => executeIn(undefined, connection, sql, values),
            connection as unknown as Tx,
            effects.run,
          )
          await connection.query(rollback ? 'ROLLBACK' : 'COMMIT')
          inTransaction = false
          return value
        } catch (error) {
          if (inTransaction) await connection.query('ROLLBACK').catch(() => {})
          // The effect's own errors are the caller's; ours mean the database is in trouble.
          if (effects.inEffect || error instanceof IdempotencyError) throw error
          if (!effects.ran && (error as { errno?: unknown } | null)?.errno === DEADLOCK && attempt < DEADLOCK_ATTEMPTS) continue
          throw this.failure(label, error)
        }
      }
    } finally {
      connection.release()
    }
  }

  /** This consumer's oldest kept ID (`null`: none), by the (consumer, processed_at) index. */
  async oldest(): Promise<InboxOldestRecord | null> {
    try {
      const [rows] = await this.#pool.query(
        `SELECT message_id, processed_at FROM ${this.#table.sql} WHERE consumer = ? ORDER BY processed_at LIMIT 1`,
        [this.#consumerBytes],
      )
      const row = (rows as Array<{ message_id: Buffer | string; processed_at: number | string }>)[0]
      return row ? { messageId: String(row.message_id), processedAtMs: Number(row.processed_at) } : null
    } catch (error) {
      throw mysqlMessagingError('MySqlInbox', 'oldest', error, this.#table)
    }
  }

  /**
   * Deletes IDs processed longer ago than the retention, in batches of `batchSize` rows, each its own
   * short statement, then failed attempts last recorded that long ago. Returns how many IDs. Run it
   * periodically.
   */
  async purge(options: { batchSize?: number } = {}): Promise<number> {
    const batchSize = purgeBatchSize(options)
    try {
      return await this.purgeInBatches(batchSize, { ids: this.#table.sql, failures: this.#failures }, async (table, column) => {
        const [result] = await this.#pool.query(
          `DELETE FROM ${table} WHERE consumer = ? AND ${column} < ${NOW_MS} - ? ORDER BY ${column} LIMIT ${batchSize}`,
          [this.#consumerBytes, this.retentionMs],
        )
        return (result as { affectedRows: number }).affectedRows
      })
    } catch (error) {
      throw mysqlMessagingError('MySqlInbox', 'purge', error, this.#table)
    }
  }
}
