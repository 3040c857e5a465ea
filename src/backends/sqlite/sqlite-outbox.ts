import { type Duration, parseDuration } from '../../core/duration.js'
import { IdempotencyError, storeUnavailable } from '../../errors.js'
import { type OutboxMessage, purgeBatchSize, quoteName } from '../../messaging/message.js'
import {
  type AddResult,
  DEFAULT_MAX_PAYLOAD_BYTES,
  encodeEvent,
  type OutboxEventInput,
  type RelayStorage,
  type RowFailure,
} from '../../messaging/outbox/storage.js'
import { connect, type SqliteConnection, type SqliteDatabase } from './driver.js'

/** Options of {@link SqliteOutbox}. */
export interface SqliteOutboxOptions {
  /**
   * An open database (WAL mode recommended): a node:sqlite `DatabaseSync` or a better-sqlite3 `Database`.
   * Relays in other processes open the same file.
   */
  database: SqliteDatabase
  /** Table name. @default 'idemkey_outbox' */
  table?: string
  /** Largest payload `add()` accepts, in bytes. @default 1048576 */
  maxPayloadBytes?: number
  /** Time source for leases and backoff (epoch ms). @default Date.now */
  now?: () => number
}

interface Row {
  seq: number
  id: string
  topic: string
  partition_key: string | null
  payload: Uint8Array
  content_type: string
  headers: string
  attempts: number
  created_at: number
}

/**
 * The transactional outbox on SQLite (node:sqlite or better-sqlite3). `add()` is synchronous and must
 * run inside the caller's transaction (`sqliteTransaction(db, fn)`, or better-sqlite3's
 * `db.transaction(fn)`), next to the state change. There is no NOTIFY: the relay
 * polls (call `relay.wake()` after a commit in the same process). Claims run under `BEGIN
 * IMMEDIATE`, so relays in several processes never claim the same row; partition order is kept.
 *
 * @example
 * const outbox = new SqliteOutbox({ database: db })
 * outbox.migrate()
 * sqliteTransaction(db, () => {
 *   db.prepare('INSERT INTO orders (id) VALUES (?)').run(orderId)
 *   outbox.add(db, { topic: 'orders.created', payload: { orderId }, idempotencyKey })
 * })
 */
export class SqliteOutbox {
  readonly #db: SqliteConnection
  readonly #table: string
  readonly #maxPayloadBytes: number
  readonly #now: () => number

  constructor(options: SqliteOutboxOptions) {
    this.#db = connect(options?.database, 'SqliteOutbox { database }')
    this.#table = quoteName(options.table ?? 'idemkey_outbox', 'SqliteOutbox table')
    this.#maxPayloadBytes = options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES
    this.#now = options.now ?? Date.now
  }

  /** Creates the table and its index. Idempotent. */
  migrate(): void {
    const t = this.#table
    const index = `"${t.replaceAll('"', '')}_pending"`
    this.#db.exec(`CREATE TABLE IF NOT EXISTS ${t} (
      seq INTEGER PRIMARY KEY AUTOINCREMENT,
      id TEXT NOT NULL UNIQUE,
      topic TEXT NOT NULL,
      partition_key TEXT,
      payload BLOB NOT NULL,
      content_type TEXT NOT NULL,
      headers TEXT NOT NULL DEFAULT '{}',
      status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
      attempts INTEGER NOT NULL DEFAULT 0,
      available_at INTEGER NOT NULL,
      locked_by TEXT,
      locked_until INTEGER,
      last_error TEXT,
      created_at INTEGER NOT NULL,
      sent_at INTEGER);
    CREATE INDEX IF NOT EXISTS ${index} ON ${t} (status, partition_key, seq);`)
  }

  /**
   * Adds an event; call it inside the transaction that changes the state. Throws
   * `INVALID_ARGUMENT` (not serializable), `BODY_TOO_LARGE`, or `INVALID_ARGUMENT` outside a transaction.
   */
  add(db: SqliteDatabase, event: OutboxEventInput): AddResult {
    const row = encodeEvent(event, this.#maxPayloadBytes)
    if (!(db === this.#db.database ? this.#db : connect(db, 'SqliteOutbox.add')).inTransaction) {
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        "SqliteOutbox.add must run inside the transaction that changes your state: sqliteTransaction(db, () => { ...; outbox.add(db, event) }), or better-sqlite3's db.transaction(() => { ... })().",
      )
    }
    const now = this.#now()
    try {
      const result = db
        .prepare(
          `INSERT INTO ${this.#table} (id, topic, partition_key, payload, content_type, headers, available_at, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
        )
        .run(row.id, row.topic, row.partitionKey, row.payload, row.contentType, row.headers, now, now)
      return { id: row.id, created: Number(result.changes) === 1 }
    } catch (error) {
      throw storeUnavailable('SqliteOutbox', 'add', error)
    }
  }

  /** Counts rows by status. */
  stats(): { pending: number; sent: number; dead: number } {
    const rows = this.#db.prepare(`SELECT status, count(*) AS n FROM ${this.#table} GROUP BY status`).all() as Array<{
      status: string
      n: number
    }>
    const out = { pending: 0, sent: 0, dead: 0 }
    for (const r of rows) out[r.status as keyof typeof out] = r.n
    return out
  }

  /**
   * Deletes sent rows older than `olderThan`, `batchSize` rows per write transaction so other writers
   * of the file wait at most one batch. Returns how many. Keep them at least as long as your
   * idempotency keys live: a request replayed after its event row is gone would add the event again.
   */
  purgeSent(olderThan: Duration, options: { batchSize?: number } = {}): number {
    const cutoff = this.#now() - parseDuration(olderThan, 'olderThan')
    const batchSize = purgeBatchSize(options)
    const purge = this.#db.prepare(
      `DELETE FROM ${this.#table} WHERE seq IN (SELECT seq FROM ${this.#table} WHERE status = 'sent' AND sent_at < ? LIMIT ?)`,
    )
    let total = 0
    for (;;) {
      const deleted = Number(purge.run(cutoff, batchSize).changes)
      total += deleted
      if (deleted < batchSize) return total
    }
  }

  /** Puts dead-lettered rows (all, or those with these IDs) back to pending after the cause is fixed. Returns how many. */
  retryDead(ids?: readonly string[]): number {
    const where = ids === undefined ? '' : ` AND id IN (SELECT value FROM json_each(?))`
    const retry = this.#db.prepare(
      `UPDATE ${this.#table} SET status = 'pending', attempts = 0, available_at = ?, last_error = NULL WHERE status = 'dead'${where}`,
    )
    const now = this.#now()
    return Number((ids === undefined ? retry.run(now) : retry.run(now, JSON.stringify(ids))).changes)
  }

  /** The relay's view of this table. */
  storage(): RelayStorage {
    const db = this.#db
    const t = this.#table
    const now = this.#now
    // A partition is blocked while any of its pending rows is leased or backing off; the set is
    // computed once per claim (one pass over the pending rows), not probed per candidate row.
    const pick = db.prepare(`WITH blocked AS (SELECT DISTINCT partition_key FROM ${t}
        WHERE status = 'pending' AND partition_key IS NOT NULL AND (available_at > @now OR locked_until > @now))
      SELECT seq FROM ${t} o
      WHERE status = 'pending' AND available_at <= @now AND (locked_until IS NULL OR locked_until <= @now)
        AND (o.partition_key IS NULL OR o.partition_key NOT IN (SELECT partition_key FROM blocked))
      ORDER BY seq LIMIT @limit`)
    const take = db.prepare(`UPDATE ${t} SET locked_by = ?, locked_until = ?, attempts = attempts + 1 WHERE seq = ?
      RETURNING seq, id, topic, partition_key, payload, content_type, headers, attempts, created_at`)
    const sent = db.prepare(
      `UPDATE ${t} SET status = 'sent', sent_at = ?, locked_by = NULL, locked_until = NULL WHERE seq = ? AND status = 'pending'`,
    )
    const fail = db.prepare(`UPDATE ${t} SET status = ?, available_at = ?, last_error = ?, locked_by = NULL, locked_until = NULL
      WHERE seq = ? AND status = 'pending' AND locked_by = ?`)
    const release = db.prepare(`UPDATE ${t} SET locked_by = NULL, locked_until = NULL, attempts = max(attempts - 1, 0)
      WHERE seq = ? AND status = 'pending' AND locked_by = ?`)
    const claim = (relayId: string, limit: number, leaseMs: number): OutboxMessage[] => {
      const at = now()
      const seqs = pick.all({ now: at, limit }) as Array<{ seq: number }>
      return seqs.map(({ seq }) => {
        const r = take.get(relayId, at + leaseMs, seq) as Row
        return {
          seq: r.seq,
          id: r.id,
          topic: r.topic,
          partitionKey: r.partition_key,
          // node:sqlite reads a BLOB as a Uint8Array, better-sqlite3 as a Buffer: publishers get a Buffer either way.
          payload: Buffer.from(r.payload.buffer, r.payload.byteOffset, r.payload.byteLength),
          contentType: r.content_type,
          headers: JSON.parse(r.headers) as Record<string, string>,
          attempts: r.attempts,
          createdAtMs: r.created_at,
        }
      })
    }
    const markSent = (seqs: readonly number[]) => {
      const at = now()
      for (const seq of seqs) sent.run(at, seq)
    }
    const markFailed = (relayId: string, failures: readonly RowFailure[]) => {
      const at = now()
      for (const f of failures) fail.run(f.dead ? 'dead' : 'pending', at + f.retryInMs, f.error.slice(0, 2000), f.seq, relayId)
    }
    const releaseAll = (relayId: string, seqs: readonly number[]) => {
      for (const seq of seqs) release.run(seq, relayId)
    }
    const wrap =
      <A extends unknown[], R>(operation: string, fn: (...args: A) => R) =>
      async (...args: A): Promise<R> => {
        try {
          return fn(...args)
        } catch (error) {
          throw storeUnavailable('SqliteOutbox', operation, error)
        }
      }
    return {
      claim: wrap('claim', (relayId: string, limit: number, leaseMs: number) => db.immediate(() => claim(relayId, limit, leaseMs))),
      markSent: wrap('markSent', (seqs: readonly number[]) => db.immediate(() => markSent(seqs))),
      markFailed: wrap('markFailed', (relayId: string, failures: readonly RowFailure[]) =>
        db.immediate(() => markFailed(relayId, failures)),
      ),
      release: wrap('release', (relayId: string, seqs: readonly number[]) => db.immediate(() => releaseAll(relayId, seqs))),
    }
  }
}
