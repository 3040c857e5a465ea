import { type Duration, parseDuration } from '../../core/duration.js'
import { assertSqlTransactions, type SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'
import { purgeBatchSize } from '../../messaging/message.js'
import {
  type AddResult,
  DEFAULT_MAX_PAYLOAD_BYTES,
  encodeEvent,
  type OutboxEventInput,
  type RelayStorage,
} from '../../messaging/outbox/storage.js'
import {
  assertSkipLocked,
  executeIn,
  type MySqlConnectionLike,
  type MySqlPoolLike,
  type MySqlTableName,
  type MySqlValue,
  migrateMySql,
  mysqlMessagingError,
  mysqlTableName,
  NOW_MS,
  placeholders,
} from './messaging.js'
import { MySqlRelayStorage } from './mysql-relay-storage.js'

/** Options of {@link MySqlOutbox}. */
export interface MySqlOutboxOptions<Tx = MySqlConnectionLike> {
  /** The user's mysql2 promise pool (`mysql2/promise` `createPool`): the relay claims and marks rows with it. */
  pool: MySqlPoolLike
  /** Table name, optionally `database.table`; `<table>_meta` holds the schema version and the claim lock. @default 'idemkey_outbox' */
  table?: string
  /**
   * `partition`: rows sharing a partition key are published in order, one claim at a time across
   * relays (claims lock one row of `<table>_meta`). `none`: no order at all, claims never wait for
   * each other. @default 'partition'
   */
  ordering?: 'partition' | 'none'
  /** Largest payload `add()` accepts, in bytes. Keep it under the server's `max_allowed_packet`. @default 1048576 */
  maxPayloadBytes?: number
  /**
   * Your data layer (docs/orm.md): `add(tx, …)` then takes the tool's own transaction object
   * (Drizzle's `tx`, Knex's `trx`, …) of a MySQL connection.
   * @example new MySqlOutbox({ pool, transactions: drizzleTransactions(db) })
   */
  transactions?: SqlTransactions<Tx>
}

/**
 * Each entry takes the schema one version up. Message IDs and partition keys are VARBINARY (their
 * UTF-8 bytes): every MySQL text collation folds case or pads spaces, and `A` and `a` are two IDs.
 * Times are integer epoch milliseconds of the server's clock, as in MySqlStore. The `claim_lock` row
 * of `<table>_meta` is what claims under partition ordering lock, one at a time.
 */
const MIGRATIONS = (t: MySqlTableName): string[][] => [
  [
    `CREATE TABLE IF NOT EXISTS ${t.sql} (
      seq BIGINT NOT NULL AUTO_INCREMENT,
      id VARBINARY(1020) NOT NULL,
      topic VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
      partition_key VARBINARY(1020) NULL,
      payload LONGBLOB NOT NULL,
      content_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
      headers MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
      status ENUM('pending', 'sent', 'dead') NOT NULL DEFAULT 'pending',
      attempts INT NOT NULL DEFAULT 0,
      available_at BIGINT NOT NULL,
      locked_by TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
      locked_until BIGINT NULL,
      last_error TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
      created_at BIGINT NOT NULL,
      sent_at BIGINT NULL,
      PRIMARY KEY (seq),
      UNIQUE KEY outbox_id (id),
      KEY outbox_pending (status, seq),
      KEY outbox_leased (status, locked_until, partition_key),
      KEY outbox_waiting (status, available_at, partition_key),
      KEY outbox_sent (status, sent_at)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`,
    `INSERT IGNORE INTO ${t.meta} (name, value) VALUES ('claim_lock', '')`,
  ],
]

/** Longest partition key, in UTF-8 bytes (the column is VARBINARY(1020)). */
const MAX_PARTITION_KEY_BYTES = 1020

/**
 * The transactional outbox on MySQL 8 or MariaDB 10.6+ (InnoDB; both have `FOR UPDATE SKIP LOCKED`).
 * `add()` writes an event row in the caller's transaction, so the event commits or rolls back with
 * the state change; a relay ({@link OutboxRelay}) publishes committed rows. MySQL has no LISTEN/NOTIFY:
 * the relay polls (set its `pollInterval`, e.g. `'100ms'`). The table has a unique message ID, so a
 * replayed request that adds the same event again adds nothing.
 *
 * @example
 * import mysql from 'mysql2/promise'
 * const pool = mysql.createPool('mysql://app@127.0.0.1/app')
 * const outbox = new MySqlOutbox({ pool })
 * await outbox.migrate()
 * const conn = await pool.getConnection()
 * await conn.query('START TRANSACTION')
 * await conn.execute('INSERT INTO orders (id) VALUES (?)', [orderId])
 * await outbox.add(conn, { topic: 'orders.created', payload: order, idempotencyKey })
 * await conn.query('COMMIT')
 * conn.release()
 */
export class MySqlOutbox<Tx = MySqlConnectionLike> {
  readonly #pool: MySqlPoolLike
  readonly #tool: SqlTransactions<Tx> | undefined
  readonly #table: MySqlTableName
  readonly #ordered: boolean
  readonly #maxPayloadBytes: number
  readonly #insert: string

  constructor(options: MySqlOutboxOptions<Tx>) {
    if (typeof options?.pool?.query !== 'function' || typeof options.pool.getConnection !== 'function') {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'MySqlOutbox needs { pool }: a mysql2/promise pool (mysql.createPool(...) from "mysql2/promise"), or anything with query(), execute() and getConnection().',
      )
    }
    this.#pool = options.pool
    if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'MySqlOutbox', 'mysql')
    this.#tool = options.transactions
    this.#table = mysqlTableName(options.table ?? 'idemkey_outbox', 'MySqlOutbox table')
    const ordering = options.ordering ?? 'partition'
    if (ordering !== 'partition' && ordering !== 'none') {
      throw new IdempotencyError('INVALID_OPTION', `MySqlOutbox ordering must be 'partition' or 'none', got ${JSON.stringify(ordering)}.`)
    }
    this.#ordered = ordering === 'partition'
    this.#maxPayloadBytes = options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES
    // INSERT IGNORE answers 0 rows for an ID that exists, whatever CLIENT_FOUND_ROWS says; every value
    // is checked before (lengths, types), so IGNORE has nothing else to hide.
    this.#insert = `INSERT IGNORE INTO ${this.#table.sql} (id, topic, partition_key, payload, content_type, headers, available_at, created_at)
      VALUES (?, ?, ?, ?, ?, ?, ${NOW_MS}, ${NOW_MS})`
  }

  /**
   * Creates the table, its indexes and `<table>_meta`. Idempotent; safe to run from several processes at
   * once. Refuses (`STORE_SCHEMA`) a server older than MySQL 8.0.1 or MariaDB 10.6, which cannot skip locked rows.
   */
  async migrate(): Promise<void> {
    await assertSkipLocked(this.#pool, 'MySqlOutbox')
    await migrateMySql(this.#pool, 'MySqlOutbox', this.#table, MIGRATIONS(this.#table))
  }

  /**
   * Adds an event in the caller's transaction. Pass the mysql2 connection your transaction runs on
   * (after `START TRANSACTION`), or your tool's transaction object with the `transactions` option: the
   * row is visible to relays only when that transaction commits. Returns the message ID and whether a
   * row was created (`false`: an event with this ID exists, e.g. a replayed request).
   * Throws `INVALID_ARGUMENT` (not serializable, partition key over 1020 bytes), `BODY_TOO_LARGE`,
   * `STORE_SCHEMA` (no table: run `migrate()`) or `STORE_UNAVAILABLE`.
   */
  async add(tx: Tx, event: OutboxEventInput): Promise<AddResult> {
    const row = encodeEvent(event, this.#maxPayloadBytes)
    if (row.partitionKey !== null && Buffer.byteLength(row.partitionKey) > MAX_PARTITION_KEY_BYTES) {
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        `outbox.add: the partition key of "${row.topic}" is ${Buffer.byteLength(row.partitionKey)} bytes; MySqlOutbox keeps at most ${MAX_PARTITION_KEY_BYTES}. Use a shorter key (an entity ID, or a hash of a long one). Nothing was written.`,
      )
    }
    const values: MySqlValue[] = [
      Buffer.from(row.id, 'utf8'),
      row.topic,
      row.partitionKey === null ? null : Buffer.from(row.partitionKey, 'utf8'),
      row.payload,
      row.contentType,
      row.headers,
    ]
    try {
      const added = await executeIn(this.#tool, tx, this.#insert, values)
      return { id: row.id, created: added === 1 }
    } catch (error) {
      const through = this.#tool ? ` (through ${this.#tool.tool})` : ''
      throw mysqlMessagingError('MySqlOutbox', `add${through}`, error, this.#table)
    }
  }

  /** Counts rows by status: what a dashboard or a test wants. */
  async stats(): Promise<{ pending: number; sent: number; dead: number }> {
    const rows = await this.#query<{ status: string; n: number | string }>(
      'stats',
      `SELECT status, COUNT(*) AS n FROM ${this.#table.sql} GROUP BY status`,
    )
    const out = { pending: 0, sent: 0, dead: 0 }
    for (const r of rows) out[r.status as keyof typeof out] = Number(r.n)
    return out
  }

  /**
   * Deletes sent rows older than `olderThan`, in batches of `batchSize` rows, each its own short
   * statement. Returns how many. Keep them at least as long as your idempotency keys live: a request
   * replayed after its event row is gone would add the event again.
   */
  async purgeSent(olderThan: Duration, options: { batchSize?: number } = {}): Promise<number> {
    const olderThanMs = parseDuration(olderThan, 'olderThan')
    const batchSize = purgeBatchSize(options)
    let total = 0
    for (;;) {
      const result = await this.#query<never>(
        'purgeSent',
        `DELETE FROM ${this.#table.sql} WHERE status = 'sent' AND sent_at < ${NOW_MS} - ? ORDER BY sent_at, seq LIMIT ${batchSize}`,
        [olderThanMs],
      )
      const deleted = (result as unknown as { affectedRows: number }).affectedRows
      total += deleted
      if (deleted < batchSize) return total
    }
  }

  /** Puts dead-lettered rows back to pending (after fixing the cause), all or those of `ids`. Returns how many. */
  async retryDead(ids?: readonly string[]): Promise<number> {
    if (ids !== undefined && ids.length === 0) return 0
    const only = ids === undefined ? '' : `AND id IN (${placeholders(ids.length)})`
    const result = await this.#query<never>(
      'retryDead',
      `UPDATE ${this.#table.sql} SET status = 'pending', attempts = 0, available_at = ${NOW_MS}, last_error = NULL WHERE status = 'dead' ${only}`,
      (ids ?? []).map((id) => Buffer.from(id, 'utf8')),
    )
    return (result as unknown as { affectedRows: number }).affectedRows
  }

  async #query<R>(operation: string, sql: string, values: MySqlValue[] = []): Promise<R[]> {
    try {
      const [rows] = await this.#pool.query(sql, values)
      return rows as R[]
    } catch (error) {
      throw mysqlMessagingError('MySqlOutbox', operation, error, this.#table)
    }
  }

  /** The relay's view of this table. */
  storage(): RelayStorage {
    return new MySqlRelayStorage(this.#pool, this.#table, this.#ordered)
  }
}
