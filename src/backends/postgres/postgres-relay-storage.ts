import { storeUnavailable } from '../../errors.js'
import type { OutboxMessage } from '../../messaging/message.js'
import type { RelayStorage, RowFailure } from '../../messaging/outbox/storage.js'
import { type PgClientLike, type PgPoolLike, rowsOf, withPoolClient } from './messaging.js'

interface Row {
  seq: string
  id: string
  topic: string
  partition_key: string | null
  payload: Buffer
  content_type: string
  headers: string
  attempts: number
  created_at: Date
}

function toMessage(row: Row): OutboxMessage {
  return {
    seq: Number(row.seq),
    id: row.id,
    topic: row.topic,
    partitionKey: row.partition_key,
    payload: row.payload,
    contentType: row.content_type,
    headers: JSON.parse(row.headers) as Record<string, string>,
    attempts: row.attempts,
    createdAtMs: row.created_at.getTime(),
  }
}

/** The relay's view of a PostgreSQL outbox table: leased claims, marks, LISTEN. */
export class PgRelayStorage implements RelayStorage {
  constructor(
    private readonly pool: PgPoolLike,
    private readonly table: string,
    private readonly channel: string,
    private readonly lockKey: string | null,
  ) {}

  async claim(relayId: string, limit: number, leaseMs: number): Promise<OutboxMessage[]> {
    const t = this.table
    // With ordering, a partition is blocked while any of its pending rows is leased or backing off,
    // and none of its rows is claimable then. The blocked set is computed once per claim from two
    // small partial indexes (leased rows, future available_at): a per-row NOT EXISTS probe made a
    // claim behind a leased batch cost a probe per pending row (seconds on a 20k backlog). The check
    // is only sound if claims do not overlap, hence the lock.
    const blocked = this.lockKey
      ? `WITH blocked AS (
           SELECT partition_key FROM ${t} WHERE status = 'pending' AND locked_until IS NOT NULL AND locked_until > now() AND partition_key IS NOT NULL
           UNION SELECT partition_key FROM ${t} WHERE status = 'pending' AND available_at > now() AND partition_key IS NOT NULL), `
      : 'WITH '
    const orderGuard = this.lockKey ? 'AND (o.partition_key IS NULL OR o.partition_key NOT IN (SELECT partition_key FROM blocked))' : ''
    const sql = `${blocked}picked AS (
        SELECT seq FROM ${t} o
        WHERE status = 'pending' AND available_at <= now() AND (locked_until IS NULL OR locked_until <= now()) ${orderGuard}
        ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
      UPDATE ${t} o SET locked_by = $2, locked_until = clock_timestamp() + $3 * interval '1 millisecond', attempts = o.attempts + 1
      FROM picked WHERE o.seq = picked.seq
      RETURNING o.seq, o.id, o.topic, o.partition_key, o.payload, o.content_type, o.headers, o.attempts, o.created_at`
    try {
      if (!this.lockKey) {
        const rows = rowsOf<Row>(await this.pool.query(sql, [limit, relayId, leaseMs]))
        return rows.map(toMessage).sort((a, b) => a.seq - b.seq)
      }
      return await withPoolClient(this.pool, async (client) => {
        try {
          await client.query('BEGIN')
          await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [this.lockKey])
          const rows = rowsOf<Row>(await client.query(sql, [limit, relayId, leaseMs]))
          await client.query('COMMIT')
          return rows.map(toMessage).sort((a, b) => a.seq - b.seq)
        } catch (error) {
          await client.query('ROLLBACK').catch(() => {})
          throw error
        }
      })
    } catch (error) {
      throw storeUnavailable('OutboxRelay', 'claim', error)
    }
  }

  async markSent(seqs: readonly number[]): Promise<void> {
    if (seqs.length === 0) return
    await this.#run(
      'markSent',
      `UPDATE ${this.table} SET status = 'sent', sent_at = now(), locked_by = NULL, locked_until = NULL, last_error = NULL
       WHERE seq = ANY($1::bigint[]) AND status = 'pending'`,
      [seqs],
    )
  }

  async markFailed(relayId: string, failures: readonly RowFailure[]): Promise<void> {
    if (failures.length === 0) return
    await this.#run(
      'markFailed',
      `UPDATE ${this.table} o SET
         status = CASE WHEN f.dead THEN 'dead' ELSE 'pending' END,
         available_at = clock_timestamp() + f.retry_ms * interval '1 millisecond',
         last_error = f.error, locked_by = NULL, locked_until = NULL
       FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::boolean[]) AS f(seq, error, retry_ms, dead)
       WHERE o.seq = f.seq AND o.status = 'pending' AND o.locked_by = $5`,
      [
        failures.map((f) => f.seq),
        failures.map((f) => f.error.slice(0, 2000)),
        failures.map((f) => f.retryInMs),
        failures.map((f) => f.dead),
        relayId,
      ],
    )
  }

  async release(relayId: string, seqs: readonly number[]): Promise<void> {
    if (seqs.length === 0) return
    await this.#run(
      'release',
      `UPDATE ${this.table} SET locked_by = NULL, locked_until = NULL, attempts = greatest(attempts - 1, 0)
       WHERE seq = ANY($1::bigint[]) AND status = 'pending' AND locked_by = $2`,
      [seqs, relayId],
    )
  }

  async #run(operation: string, sql: string, values: unknown[]): Promise<void> {
    try {
      await this.pool.query(sql, values)
    } catch (error) {
      throw storeUnavailable('OutboxRelay', operation, error)
    }
  }

  // One dedicated client LISTENs. If its connection breaks (database restart), it is thrown away
  // and a new one LISTENs after a pause; meanwhile, and on the way back, the relay's poll covers
  // every row (a wake on reconnect catches what was committed while nobody listened).
  async listen(wake: () => void): Promise<() => Promise<void>> {
    let stopped = false
    // The client and its error listener: pool clients are reused, so the listener must go with it.
    let current: { client: Listening; onError: (error: Error) => void } | undefined
    const onNotification = (message: { channel: string }) => {
      if (message.channel === this.channel) wake()
    }
    const connect = async (): Promise<void> => {
      const pooled = await this.pool.connect()
      if (!listens(pooled)) {
        // Not a node-postgres client (a wrapper without events): no wake-ups, the relay's poll covers every row.
        pooled.release()
        stopped = true
        return
      }
      const client = pooled
      let broken = false
      const onError = (error: Error) => {
        if (broken) return
        broken = true
        client.removeListener('notification', onNotification)
        if (current?.client === client) current = undefined
        client.release(error)
        if (!stopped) setTimeout(() => void reconnect(), 1_000)
      }
      client.on('notification', onNotification)
      client.on('error', onError)
      try {
        await client.query(`LISTEN "${this.channel}"`)
      } catch (error) {
        client.removeListener('error', onError)
        client.removeListener('notification', onNotification)
        client.release(error as Error)
        throw error
      }
      current = { client, onError }
    }
    let reconnecting = false
    const reconnect = async (): Promise<void> => {
      if (reconnecting) return
      reconnecting = true
      while (!stopped && current === undefined) {
        try {
          await connect()
          wake()
        } catch {
          await new Promise((resolve) => setTimeout(resolve, 1_000))
        }
      }
      reconnecting = false
    }
    await connect()
    return async () => {
      stopped = true
      const held = current
      current = undefined
      if (!held) return
      held.client.removeListener('notification', onNotification)
      await held.client.query(`UNLISTEN "${this.channel}"`).catch(() => {})
      held.client.removeListener('error', held.onError)
      held.client.release()
    }
  }
}

/** A pool client that emits events (a node-postgres one): what LISTEN needs. */
type Listening = PgClientLike & Required<Pick<PgClientLike, 'on' | 'removeListener'>>

function listens(client: PgClientLike): client is Listening {
  return typeof client.on === 'function' && typeof client.removeListener === 'function'
}
