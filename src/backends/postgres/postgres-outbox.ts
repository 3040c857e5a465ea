import { type Duration, parseDuration } from '../../core/duration.js'
import { assertSqlTransactions, type SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError, storeUnavailable } from '../../errors.js'
import { besideTable, fitPgName, purgeBatchSize, quoteName } from '../../messaging/message.js'
import {
  type AddResult,
  DEFAULT_MAX_PAYLOAD_BYTES,
  encodeEvent,
  type OutboxEventInput,
  type RelayStorage,
} from '../../messaging/outbox/storage.js'
import { type PgPoolLike, type PgQueryable, rowsOf, withPoolClient } from './messaging.js'
import { isServerError } from './postgres-errors.js'
import { PgRelayStorage } from './postgres-relay-storage.js'

/** Options of {@link PgOutbox}. */
export interface PgOutboxOptions<Tx = PgQueryable> {
  /** The user's `pg.Pool`: the relay claims and marks rows with it and LISTENs on one of its clients. */
  pool: PgPoolLike
  /** Table name, optionally `schema.table`. @default 'idemkey_outbox' */
  table?: string
  /**
   * `partition`: rows sharing a partition key are published in order, one claim at a time across
   * relays (claims take a transaction-level advisory lock). `none`: no order at all, claims never
   * wait for each other. @default 'partition'
   */
  ordering?: 'partition' | 'none'
  /** Largest payload `add()` accepts, in bytes. @default 1048576 */
  maxPayloadBytes?: number
  /**
   * Your data layer (docs/orm.md): `add(tx, …)` then takes the tool's own transaction object
   * (Drizzle's `tx`, Prisma's transaction client, …). @example new PgOutbox({ pool, transactions: drizzleTransactions(db) })
   */
  transactions?: SqlTransactions<Tx>
}

/**
 * The transactional outbox on PostgreSQL. `add()` writes an event row with the caller's
 * transaction client, so the event commits or rolls back with the state change; a relay
 * ({@link OutboxRelay}) publishes committed rows. The table has a unique message ID, so a replayed
 * request that adds the same event again adds nothing.
 *
 * @example
 * const outbox = new PgOutbox({ pool })
 * await outbox.migrate()
 * await client.query('BEGIN')
 * await client.query('INSERT INTO orders ...')
 * await outbox.add(client, { topic: 'orders.created', payload: order, idempotencyKey })
 * await client.query('COMMIT')
 */
export class PgOutbox<Tx = PgQueryable> {
  readonly #pool: PgPoolLike
  readonly #tool: SqlTransactions<Tx> | undefined
  readonly #table: string
  readonly #name: string
  readonly #channel: string
  readonly #notifyFunction: string
  readonly #indexName: (suffix: string) => string
  readonly #ordered: boolean
  readonly #maxPayloadBytes: number
  readonly #lockKey: string

  constructor(options: PgOutboxOptions<Tx>) {
    if (typeof options?.pool?.query !== 'function') {
      throw new IdempotencyError('INVALID_OPTION', 'PgOutbox needs { pool }: a pg.Pool (or anything with query() and connect()).')
    }
    this.#pool = options.pool
    if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'PgOutbox', 'postgres')
    this.#tool = options.transactions
    this.#name = options.table ?? 'idemkey_outbox'
    this.#table = quoteName(this.#name, 'PgOutbox table')
    // Every name derived from the table fits PostgreSQL's 63-byte limit (a hash replaces the tail
    // of a long one), so any valid schema.table works; short names keep their historical form.
    this.#channel = fitPgName(this.#name.replace('.', '_'), 'added', this.#name)
    const tableOnly = this.#name.slice(this.#name.lastIndexOf('.') + 1)
    this.#notifyFunction = besideTable(this.#name, 'notify', 'PgOutbox table')
    this.#indexName = (suffix) => quoteName(fitPgName(tableOnly, suffix, this.#name), 'PgOutbox table')
    this.#ordered = (options.ordering ?? 'partition') === 'partition'
    this.#maxPayloadBytes = options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES
    this.#lockKey = `idemkey_outbox:${this.#name}`
  }

  /**
   * The channel the insert trigger NOTIFYs, which the relay LISTENs on: `<schema>_<table>_added`
   * (`<table>_added` without a schema), or, when that passes 63 bytes, a prefix of it, a 12-hex hash
   * of `schema.table` and `_added`.
   */
  get channel(): string {
    return this.#channel
  }

  /** Creates the table, its indexes and the NOTIFY trigger. Idempotent; safe to run from several processes at once. */
  async migrate(): Promise<void> {
    const t = this.#table
    const fn = this.#notifyFunction
    await withPoolClient(this.#pool, async (client) => {
      try {
        await client.query('BEGIN')
        await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`${this.#lockKey}:migrate`])
        await client.query(`CREATE TABLE IF NOT EXISTS ${t} (
          seq bigserial PRIMARY KEY,
          id text NOT NULL UNIQUE,
          topic text NOT NULL,
          partition_key text,
          payload bytea NOT NULL,
          content_type text NOT NULL,
          headers text NOT NULL DEFAULT '{}',
          status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
          attempts integer NOT NULL DEFAULT 0,
          available_at timestamptz NOT NULL DEFAULT now(),
          locked_by text,
          locked_until timestamptz,
          last_error text,
          created_at timestamptz NOT NULL DEFAULT now(),
          sent_at timestamptz
        )`)
        const idx = this.#indexName
        await client.query(`CREATE INDEX IF NOT EXISTS ${idx('pending')} ON ${t} (seq) WHERE status = 'pending'`)
        await client.query(`CREATE INDEX IF NOT EXISTS ${idx('partition')} ON ${t} (partition_key, seq) WHERE status = 'pending'`)
        // The relay's blocked-partition set under `ordering: 'partition'`: leased rows, rows backing off.
        await client.query(
          `CREATE INDEX IF NOT EXISTS ${idx('leased')} ON ${t} (partition_key) WHERE status = 'pending' AND locked_until IS NOT NULL`,
        )
        await client.query(`CREATE INDEX IF NOT EXISTS ${idx('waiting')} ON ${t} (available_at) WHERE status = 'pending'`)
        await client.query(`CREATE OR REPLACE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN PERFORM pg_notify('${this.#channel}', ''); RETURN NULL; END $$`)
        await client.query(`DROP TRIGGER IF EXISTS idemkey_outbox_notify ON ${t}`)
        await client.query(`CREATE TRIGGER idemkey_outbox_notify AFTER INSERT ON ${t} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}()`)
        await client.query('COMMIT')
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {})
        // The server refused a statement (a SQLSTATE: permissions, a clashing object): the schema's problem.
        // Anything else (a lost connection) is an outage, to retry.
        if (!isServerError(error)) throw storeUnavailable('PgOutbox', 'migrate', error)
        throw new IdempotencyError('STORE_SCHEMA', `PgOutbox.migrate on ${this.#name} failed: ${(error as Error).message}.`, {
          cause: error,
        })
      }
    })
  }

  /**
   * Adds an event in the caller's transaction. Pass the transaction's client (after `BEGIN`), or your
   * tool's transaction object with the `transactions` option: the
   * row is visible to relays only when that transaction commits. Returns the message ID and
   * whether a row was created (`false`: an event with this ID exists, e.g. a replayed request).
   * Throws `INVALID_ARGUMENT` (not serializable), `BODY_TOO_LARGE` or `STORE_UNAVAILABLE`.
   */
  async add(tx: Tx, event: OutboxEventInput): Promise<AddResult> {
    const row = encodeEvent(event, this.#maxPayloadBytes)
    const text = `INSERT INTO ${this.#table} (id, topic, partition_key, payload, content_type, headers) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (id) DO NOTHING RETURNING seq`
    const values = [row.id, row.topic, row.partitionKey, row.payload, row.contentType, row.headers]
    try {
      const added = this.#tool
        ? (await this.#tool.execute(tx, text, values)).count
        : (await (tx as PgQueryable).query(text, values)).rows.length
      return { id: row.id, created: added === 1 }
    } catch (error) {
      throw storeUnavailable('PgOutbox', `add to ${this.#name}`, error)
    }
  }

  /** Counts rows by status: what a dashboard or a test wants. */
  async stats(): Promise<{ pending: number; sent: number; dead: number }> {
    const rows = rowsOf<{ status: string; n: string }>(
      await this.#query('stats', `SELECT status, count(*) AS n FROM ${this.#table} GROUP BY status`),
    )
    const out = { pending: 0, sent: 0, dead: 0 }
    for (const r of rows) out[r.status as keyof typeof out] = Number(r.n)
    return out
  }

  /**
   * Deletes sent rows older than `olderThan`, in batches of `batchSize` rows, each its own short
   * statement (rows a relay holds are skipped, never waited for). Returns how many. Keep them at least
   * as long as your idempotency keys live: a request replayed after its event row is gone would add
   * the event again.
   */
  async purgeSent(olderThan: Duration, options: { batchSize?: number } = {}): Promise<number> {
    const olderThanMs = parseDuration(olderThan, 'olderThan')
    const batchSize = purgeBatchSize(options)
    let total = 0
    for (;;) {
      const result = await this.#query(
        'purgeSent',
        `DELETE FROM ${this.#table} WHERE ctid IN (
           SELECT ctid FROM ${this.#table} WHERE status = 'sent' AND sent_at < now() - $1 * interval '1 millisecond'
           LIMIT $2 FOR UPDATE SKIP LOCKED)`,
        [olderThanMs, batchSize],
      )
      const deleted = result.rowCount ?? 0
      total += deleted
      if (deleted < batchSize) return total
    }
  }

  /** Puts dead-lettered rows back to pending (after fixing the cause). Returns how many. */
  async retryDead(ids?: readonly string[]): Promise<number> {
    const result = await this.#query(
      'retryDead',
      `UPDATE ${this.#table} SET status = 'pending', attempts = 0, available_at = now(), last_error = NULL
       WHERE status = 'dead' AND ($1::text[] IS NULL OR id = ANY($1))`,
      [ids ?? null],
    )
    return result.rowCount ?? 0
  }

  async #query(operation: string, sql: string, values?: unknown[]) {
    try {
      return await this.#pool.query(sql, values)
    } catch (error) {
      throw storeUnavailable('PgOutbox', `${operation} on ${this.#name}`, error)
    }
  }

  /** The relay's view of this table. */
  storage(): RelayStorage {
    return new PgRelayStorage(this.#pool, this.#table, this.#channel, this.#ordered ? this.#lockKey : null)
  }
}
