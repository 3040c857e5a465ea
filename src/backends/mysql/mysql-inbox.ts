import { type Duration, parsePositiveDuration } from '../../core/duration.js'
import { assertSqlTransactions, type SqlTransactions } from '../../core/sql-transactions.js'
import { assertFunctions, assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import type {
  Inbox,
  InboxBatchResult,
  InboxEvent,
  InboxFailure,
  InboxMessage,
  InboxOldestRecord,
  InboxResult,
} from '../../messaging/inbox/types.js'
import { InboxMismatchError, isMissingTable, purgeBatchSize, RolledBack } from '../../messaging/message.js'
import { payloadHash } from '../postgres/postgres-inbox.js'
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
 * payload, takes the bump back (see `#record`): each statement changes the row it matches, so
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
  if (typeof message?.id !== 'string' || message.id.length === 0) {
    throw new IdempotencyError('INVALID_ARGUMENT', 'inbox: the message has no ID. Producers must set one (the outbox always does).')
  }
  if (Buffer.byteLength(message.id) > MAX_ID_BYTES) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `inbox: message ID "${message.id.slice(0, 40)}…" is ${Buffer.byteLength(message.id)} bytes; MySqlInbox keeps IDs of at most ${MAX_ID_BYTES}. Have the producer use shorter IDs (the outbox's are at most 255 characters).`,
    )
  }
}

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
 */
export class MySqlInbox<Tx = MySqlConnectionLike> implements Inbox<Tx> {
  readonly consumer: string
  readonly #pool: MySqlPoolLike
  readonly #tool: SqlTransactions<Tx> | undefined
  readonly #table: MySqlTableName
  /** Failed attempts by message (`recordFailure`), for `maxAttempts` across processes. */
  readonly #failures: string
  readonly #retentionMs: number
  readonly #onEvent: (event: InboxEvent) => void
  readonly #consumerBytes: Buffer
  readonly #insert: string
  readonly #settle: string

  /** How long processed IDs are kept (the dedup window). */
  get retentionMs(): number {
    return this.#retentionMs
  }

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
    this.#pool = options.pool
    if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'MySqlInbox', 'mysql')
    this.#tool = options.transactions
    this.consumer = options.consumer
    this.#consumerBytes = Buffer.from(options.consumer, 'utf8')
    this.#table = mysqlTableName(options.table ?? 'idemkey_inbox', 'MySqlInbox table')
    // Fitted to 63 bytes, within MySQL's 64.
    this.#failures = mysqlBesideTable(this.#table, 'failures')
    // A retention of 0 forgets each ID at the next purge: a redelivered copy would be applied again.
    this.#retentionMs = parsePositiveDuration(options.retention ?? '7d', 'retention')
    assertFunctions('MySqlInbox', { onEvent: options.onEvent })
    this.#onEvent = options.onEvent ?? (() => {})
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

  /**
   * Runs `effect` in a transaction that also records the message ID, unless the ID was processed
   * already. The effect gets the transaction's mysql2 connection, or with the `transactions` option
   * the tool's own transaction. An error from `effect` rolls both
   * back and is rethrown (do not ack: let the broker redeliver). Database errors become `STORE_UNAVAILABLE`.
   */
  async handle<T>(message: InboxMessage, effect: (tx: Tx, message: InboxMessage) => Promise<T> | T): Promise<InboxResult<T>> {
    assertMessageId(message)
    const hash = payloadHash(message.payload)
    type Outcome = { seen: 'duplicate' | 'mismatch' } | { applied: Awaited<T> }
    const outcome = await this.#transaction<Outcome>(`handle ${message.id}`, async (run, tx, runEffect) => {
      const seen = await this.#record(run, message.id, hash)
      if (seen !== 'new') return { rollback: true, value: { seen } }
      return { value: { applied: await runEffect(() => effect(tx, message)) } }
    })
    if ('seen' in outcome) return this.#seenBefore(outcome.seen, message.id)
    this.#emit({ type: 'applied', consumer: this.consumer, messageId: message.id })
    return { status: 'applied', value: outcome.applied }
  }

  /**
   * Several messages in one transaction (what the consumer helpers use under load): each ID recorded
   * (in sorted order, so concurrent batches lock alike), then each new message's effect in the given
   * order, then one COMMIT. A message seen before
   * is `duplicate`, or `mismatch` with another payload (reported, not thrown); an ID twice in the
   * batch is applied once. Any error rolls the whole batch back and is thrown (retry the messages one
   * by one with {@link MySqlInbox.handle}). Events are reported after the commit.
   */
  async handleBatch<T>(
    messages: readonly InboxMessage[],
    effect: (tx: Tx, message: InboxMessage) => Promise<T> | T,
  ): Promise<Array<InboxBatchResult<T>>> {
    for (const message of messages) assertMessageId(message)
    const hashes = messages.map((m) => payloadHash(m.payload))
    const { results, events } = await this.#transaction(`handleBatch of ${messages.length}`, async (run, tx, runEffect) => {
      // Each ID's first copy is recorded first, in one order whatever the batch's, so two consumers'
      // batches take their row locks in the same order and cannot deadlock on each other.
      const firstIndex = new Map<string, number>()
      for (const [i, message] of messages.entries()) if (!firstIndex.has(message.id)) firstIndex.set(message.id, i)
      const verdicts: Array<'apply' | 'duplicate' | 'mismatch' | undefined> = messages.map(() => undefined)
      // The hash each new ID was taken under by its first copy; its other copies compare with it.
      const taken = new Map<string, string>()
      for (const id of [...firstIndex.keys()].sort()) {
        const i = firstIndex.get(id) as number
        const verdict = await this.#record(run, id, hashes[i] as string)
        if (verdict === 'new') taken.set(id, hashes[i] as string)
        verdicts[i] = verdict === 'new' ? 'apply' : verdict
      }
      for (const [i, message] of messages.entries()) {
        if (verdicts[i] !== undefined) continue
        const first = taken.get(message.id)
        const hash = hashes[i] as string
        if (first !== undefined) verdicts[i] = first === hash ? 'duplicate' : 'mismatch'
        else {
          // Its first copy was known before the batch: this copy's own payload decides.
          const verdict = await this.#record(run, message.id, hash)
          if (verdict === 'new') taken.set(message.id, hash)
          verdicts[i] = verdict === 'new' ? 'apply' : verdict
        }
      }
      const results: Array<InboxBatchResult<T>> = []
      const events: InboxEvent[] = []
      for (const [i, message] of messages.entries()) {
        const verdict = verdicts[i]
        if (verdict === 'apply') {
          results.push({ status: 'applied', value: await runEffect(() => effect(tx, message)) })
          events.push({ type: 'applied', consumer: this.consumer, messageId: message.id })
        } else if (verdict === 'mismatch') {
          results.push({ status: 'mismatch', error: new InboxMismatchError(this.consumer, message.id) })
          events.push({ type: 'mismatch', consumer: this.consumer, messageId: message.id })
        } else {
          results.push({ status: 'duplicate' })
          events.push({ type: 'duplicate', consumer: this.consumer, messageId: message.id })
        }
      }
      return { value: { results, events } }
    })
    for (const event of events) this.#emit(event)
    return results
  }

  /**
   * Records the message ID inside a transaction *you* run (your `START TRANSACTION`, your effect, your
   * `COMMIT`): pass its mysql2 connection, or your tool's transaction object with the `transactions`
   * option. Returns `new` (apply the effect, then commit) or `duplicate` (skip the effect; rolling back
   * or committing is the same). Throws {@link InboxMismatchError} for the same ID with another payload.
   *
   * @example
   * await conn.query('START TRANSACTION')
   * if ((await inbox.record(conn, message)) === 'new') await applyEffect(conn)
   * await conn.query('COMMIT')
   */
  async record(tx: Tx, message: InboxMessage): Promise<'new' | 'duplicate'> {
    assertMessageId(message)
    const hash = payloadHash(message.payload)
    let seen: 'new' | 'duplicate' | 'mismatch'
    try {
      seen = await this.#record((sql, values) => executeIn(this.#tool, tx, sql, values), message.id, hash)
    } catch (error) {
      const through = this.#tool ? ` (through ${this.#tool.tool})` : ''
      throw mysqlMessagingError('MySqlInbox', `record ${message.id}${through}`, error, this.#table)
    }
    if (seen === 'new') {
      this.#emit({ type: 'recorded', consumer: this.consumer, messageId: message.id })
      return 'new'
    }
    this.#seenBefore(seen, message.id)
    return 'duplicate'
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
  async #record(
    run: (sql: string, values: readonly (string | Buffer)[]) => Promise<number>,
    messageId: string,
    hash: string,
  ): Promise<'new' | 'duplicate' | 'mismatch'> {
    const id = Buffer.from(messageId, 'utf8')
    if ((await run(this.#insert, [this.#consumerBytes, id, hash])) === 1) return 'new'
    return (await run(this.#settle, [this.#consumerBytes, id, hash])) > 0 ? 'duplicate' : 'mismatch'
  }

  /**
   * One transaction on a pooled connection, or the tool's with the `transactions` option, shared by
   * `handle` and `handleBatch`: `work` gets how the inbox's statements run and the effect's `tx`. The
   * caller's effects run through `runEffect`, so their errors are rethrown as they are, while the
   * database's become `STORE_UNAVAILABLE`; either rolls back. `rollback: true` ends it without a commit.
   *
   * A deadlock before any effect ran is retried in a new transaction (InnoDB rolled the whole one
   * back, and nothing of it had happened yet: as a redelivery would). It happens when the copy that
   * inserted an ID rolls back (its effect failed) while others wait on the row: InnoDB hands each
   * waiter a gap lock where the row was, and each one's insert then waits on the others' gap locks.
   */
  async #transaction<R>(
    label: string,
    work: (
      run: (sql: string, values: readonly (string | Buffer)[]) => Promise<number>,
      tx: Tx,
      runEffect: <T>(effect: () => Promise<T> | T) => Promise<T>,
    ) => Promise<{ value: R; rollback?: boolean }>,
  ): Promise<R> {
    const tool = this.#tool
    if (tool) {
      let inToolEffect = false
      const runToolEffect = async <T>(effect: () => Promise<T> | T): Promise<T> => {
        inToolEffect = true
        const value = await effect()
        inToolEffect = false
        return value
      }
      try {
        return await tool.transaction(async (tx) => {
          const { value, rollback } = await work((sql, values) => executeIn(tool, tx, sql, values), tx, runToolEffect)
          // A tool rolls back when its function throws: this carries the value out.
          if (rollback) throw new RolledBack(value)
          return value
        })
      } catch (error) {
        if (error instanceof RolledBack) return error.value as R
        if (inToolEffect || error instanceof IdempotencyError) throw error
        throw mysqlMessagingError('MySqlInbox', label, error, this.#table)
      }
    }
    let connection: MySqlConnectionLike
    try {
      connection = await this.#pool.getConnection()
    } catch (error) {
      throw mysqlMessagingError('MySqlInbox', 'connect', error, this.#table)
    }
    try {
      for (let attempt = 1; ; attempt++) {
        let inTransaction = false
        let inEffect = false
        let effectRan = false
        const runEffect = async <T>(effect: () => Promise<T> | T): Promise<T> => {
          inEffect = true
          effectRan = true
          const value = await effect()
          inEffect = false
          return value
        }
        try {
          await connection.query('START TRANSACTION')
          inTransaction = true
          const { value, rollback } = await work(
            (sql, values) => executeIn(undefined, connection, sql, values),
            connection as unknown as Tx,
            runEffect,
          )
          await connection.query(rollback ? 'ROLLBACK' : 'COMMIT')
          inTransaction = false
          return value
        } catch (error) {
          if (inTransaction) await connection.query('ROLLBACK').catch(() => {})
          // The effect's own errors are the caller's; ours mean the database is in trouble.
          if (inEffect || error instanceof IdempotencyError) throw error
          if (!effectRan && (error as { errno?: unknown } | null)?.errno === DEADLOCK && attempt < DEADLOCK_ATTEMPTS) continue
          throw mysqlMessagingError('MySqlInbox', label, error, this.#table)
        }
      }
    } finally {
      connection.release()
    }
  }

  /** Reports a known ID: `duplicate`, or throws for a mismatch. */
  #seenBefore(seen: 'duplicate' | 'mismatch', messageId: string): { status: 'duplicate' } {
    if (seen === 'mismatch') {
      this.#emit({ type: 'mismatch', consumer: this.consumer, messageId })
      throw new InboxMismatchError(this.consumer, messageId)
    }
    this.#emit({ type: 'duplicate', consumer: this.consumer, messageId })
    return { status: 'duplicate' }
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
    const older = async (table: string, column: string): Promise<number> => {
      let total = 0
      for (;;) {
        const [result] = await this.#pool.query(
          `DELETE FROM ${table} WHERE consumer = ? AND ${column} < ${NOW_MS} - ? ORDER BY ${column} LIMIT ${batchSize}`,
          [this.#consumerBytes, this.#retentionMs],
        )
        const deleted = (result as { affectedRows: number }).affectedRows
        total += deleted
        if (deleted < batchSize) return total
      }
    }
    try {
      const total = await older(this.#table.sql, 'processed_at')
      // Not migrated since failures were recorded: nothing of theirs to purge.
      await older(this.#failures, 'failed_at').catch((error: unknown) => {
        if (!isMissingTable(error)) throw error
      })
      return total
    } catch (error) {
      throw mysqlMessagingError('MySqlInbox', 'purge', error, this.#table)
    }
  }

  #emit(event: InboxEvent): void {
    try {
      this.#onEvent(event)
    } catch {
      // A throwing metrics hook must not change the outcome.
    }
  }
}
