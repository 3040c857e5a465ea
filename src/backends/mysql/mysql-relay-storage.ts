import { setTimeout as sleep } from 'node:timers/promises'
import type { OutboxMessage } from '../../messaging/message.js'
import type { RelayStorage, RowFailure } from '../../messaging/outbox/storage.js'
import {
  type MySqlConnectionLike,
  type MySqlPoolLike,
  type MySqlTableName,
  mysqlMessagingError,
  NOW_MS,
  placeholders,
} from './messaging.js'
import { isRetryable } from './mysql-errors.js'

interface Row {
  seq: number | string
  id: Buffer
  topic: string
  partition_key: Buffer | null
  payload: Buffer
  content_type: string
  headers: string
  attempts: number | string
  created_at: number | string
}

function toMessage(row: Row): OutboxMessage {
  return {
    seq: Number(row.seq),
    id: row.id.toString('utf8'),
    topic: row.topic,
    partitionKey: row.partition_key === null ? null : row.partition_key.toString('utf8'),
    payload: row.payload,
    contentType: row.content_type,
    headers: JSON.parse(row.headers) as Record<string, string>,
    // The claim counts this attempt in the same transaction as it reads the row.
    attempts: Number(row.attempts) + 1,
    createdAtMs: Number(row.created_at),
  }
}

/** How many times a mark is retried after a deadlock or lock wait timeout before the relay hears of it. */
const LOCK_RETRIES = 3

/**
 * The relay's view of a MySQL/MariaDB outbox table: leased claims and marks. There is no LISTEN on
 * MySQL, so the relay polls (its `pollInterval`).
 *
 * A claim is one short transaction at READ COMMITTED (so its locking read takes no gap locks that
 * would hold up the application's inserts): under `ordering: 'partition'` it first locks the
 * `claim_lock` row of `<table>_meta` (claims take turns, as PostgreSQL's advisory lock makes them),
 * reads the partitions that are blocked (a row leased or backing off), then
 * `SELECT … ORDER BY seq LIMIT n FOR UPDATE SKIP LOCKED` and one UPDATE that leases what it read.
 */
export class MySqlRelayStorage implements RelayStorage {
  #readCommitted = true

  constructor(
    private readonly pool: MySqlPoolLike,
    private readonly table: MySqlTableName,
    private readonly ordered: boolean,
  ) {}

  async claim(relayId: string, limit: number, leaseMs: number): Promise<OutboxMessage[]> {
    try {
      return await this.#claim(relayId, limit, leaseMs)
    } catch (error) {
      // A server logging statements (binlog_format = STATEMENT) refuses writes at READ COMMITTED (1665):
      // claims then run at the session's level, where their short range locks may briefly hold inserts.
      if ((error as { cause?: { errno?: number } }).cause?.errno !== 1665 || !this.#readCommitted) throw error
      this.#readCommitted = false
      return this.#claim(relayId, limit, leaseMs)
    }
  }

  async #claim(relayId: string, limit: number, leaseMs: number): Promise<OutboxMessage[]> {
    const t = this.table.sql
    let connection: MySqlConnectionLike
    try {
      connection = await this.pool.getConnection()
    } catch (error) {
      throw mysqlMessagingError('OutboxRelay', 'claim', error, this.table)
    }
    try {
      // Applies to the next transaction only: the pool's connection keeps its own default.
      if (this.#readCommitted) await connection.query('SET TRANSACTION ISOLATION LEVEL READ COMMITTED')
      await connection.query('START TRANSACTION')
      try {
        let blocked: Buffer[] = []
        if (this.ordered) {
          const [lock] = await connection.query(`SELECT value FROM ${this.table.meta} WHERE name = 'claim_lock' FOR UPDATE`)
          if ((lock as unknown[]).length === 0) {
            throw Object.assign(new Error(`the claim_lock row of ${this.table.meta} is missing`), { errno: 1146 })
          }
          const [rows] = await connection.query(
            `SELECT partition_key FROM ${t} WHERE status = 'pending' AND locked_until > ${NOW_MS} AND partition_key IS NOT NULL
             UNION SELECT partition_key FROM ${t} WHERE status = 'pending' AND available_at > ${NOW_MS} AND partition_key IS NOT NULL`,
          )
          blocked = (rows as Array<{ partition_key: Buffer }>).map((r) => r.partition_key)
        }
        const guard = blocked.length > 0 ? `AND (partition_key IS NULL OR partition_key NOT IN (${placeholders(blocked.length)}))` : ''
        const [picked] = await connection.query(
          `SELECT seq, id, topic, partition_key, payload, content_type, headers, attempts, created_at FROM ${t}
           WHERE status = 'pending' AND available_at <= ${NOW_MS} AND (locked_until IS NULL OR locked_until <= ${NOW_MS}) ${guard}
           ORDER BY seq LIMIT ${Math.trunc(limit)} FOR UPDATE SKIP LOCKED`,
          blocked,
        )
        const rows = picked as Row[]
        if (rows.length > 0) {
          await connection.query(
            `UPDATE ${t} SET locked_by = ?, locked_until = ${NOW_MS} + ?, attempts = attempts + 1 WHERE seq IN (${placeholders(rows.length)})`,
            [relayId, Math.trunc(leaseMs), ...rows.map((r) => Number(r.seq))],
          )
        }
        await connection.query('COMMIT')
        return rows.map(toMessage).sort((a, b) => a.seq - b.seq)
      } catch (error) {
        await connection.query('ROLLBACK').catch(() => {})
        throw error
      }
    } catch (error) {
      throw mysqlMessagingError('OutboxRelay', 'claim', error, this.table)
    } finally {
      connection.release()
    }
  }

  async markSent(seqs: readonly number[]): Promise<void> {
    if (seqs.length === 0) return
    await this.#run(
      'markSent',
      `UPDATE ${this.table.sql} SET status = 'sent', sent_at = ${NOW_MS}, locked_by = NULL, locked_until = NULL, last_error = NULL
       WHERE seq IN (${placeholders(seqs.length)}) AND status = 'pending'`,
      [...seqs],
    )
  }

  async markFailed(relayId: string, failures: readonly RowFailure[]): Promise<void> {
    if (failures.length === 0) return
    // One UPDATE joined with the failures as a derived table: each row gets its own delay and error.
    const derived = failures.map((_, i) => (i === 0 ? 'SELECT ? AS seq, ? AS error, ? AS retry_ms, ? AS dead' : 'SELECT ?, ?, ?, ?'))
    await this.#run(
      'markFailed',
      `UPDATE ${this.table.sql} o JOIN (${derived.join(' UNION ALL ')}) f ON o.seq = f.seq SET
         o.status = IF(f.dead = 1, 'dead', 'pending'), o.available_at = ${NOW_MS} + f.retry_ms,
         o.last_error = f.error, o.locked_by = NULL, o.locked_until = NULL
       WHERE o.status = 'pending' AND o.locked_by = ?`,
      [...failures.flatMap((f) => [f.seq, f.error.slice(0, 2000), Math.max(0, Math.trunc(f.retryInMs)), f.dead ? 1 : 0]), relayId],
    )
  }

  async release(relayId: string, seqs: readonly number[]): Promise<void> {
    if (seqs.length === 0) return
    await this.#run(
      'release',
      `UPDATE ${this.table.sql} SET locked_by = NULL, locked_until = NULL, attempts = GREATEST(attempts - 1, 0)
       WHERE seq IN (${placeholders(seqs.length)}) AND status = 'pending' AND locked_by = ?`,
      [...seqs, relayId],
    )
  }

  /** One autocommit statement; retried a few times after a deadlock or lock wait timeout (InnoDB rolled it back). */
  async #run(operation: string, sql: string, values: Array<string | number>): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.pool.query(sql, values)
        return
      } catch (error) {
        if (!isRetryable(error) || attempt >= LOCK_RETRIES) throw mysqlMessagingError('OutboxRelay', operation, error, this.table)
        await sleep(Math.random() * 10 * (attempt + 1))
      }
    }
  }
}
