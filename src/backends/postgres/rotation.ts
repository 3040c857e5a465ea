/**
 * Partition upkeep of the partitioned layout: partitions created ahead of the clock, and partitions
 * whose every record has expired detached and dropped. Not part of the public API.
 */

import { holding } from './connect.js'
import { createPartitions, listPartitions, lockPartitions, PARTITIONS_AHEAD, serverNow, slotOf, tableLayout } from './partitions.js'
import type { PgClientLike, PgPoolLike, PgQueryable } from './pool.js'
import { isServerError, lockNotGranted } from './postgres-errors.js'
import { qualified } from './statements.js'

/**
 * How long a drop (or an attach) may wait for the locks it needs. A waiting ACCESS EXCLUSIVE lock queues every
 * later statement on the table behind it, so a drop that cannot have its locks at once gives up
 * and the next round tries again, rather than stall traffic behind a long transaction.
 */
const DROP_LOCK_TIMEOUT = '500ms'

/** What one rotation did. */
export interface Rotation {
  /** Partitions created (the current one if it was missing, and those ahead). */
  created: string[]
  /** Partitions detached and dropped, every record in them expired. */
  dropped: string[]
}

/**
 * Runs `fn` in a READ COMMITTED transaction on one connection of the pool (explicitly: a server
 * default of REPEATABLE READ would take the snapshot at the first statement, before the key locks).
 */
export async function inTransaction<R>(pool: PgPoolLike, fn: (tx: PgClientLike) => Promise<R>): Promise<R> {
  const client = await pool.connect()
  return holding(client, async (held) => {
    try {
      await client.query('BEGIN ISOLATION LEVEL READ COMMITTED')
      const result = await fn(client)
      await client.query('COMMIT')
      return result
    } catch (error) {
      // A statement that timed out (query_timeout) or a broken connection may still be running on
      // the server, holding its locks: destroy the connection (which ends the transaction), never pool it.
      if (!isServerError(error)) held.discard()
      else await client.query('ROLLBACK').catch(held.discard)
      throw error
    }
  })
}

/** The table's partition interval, from its comment (the one it was created with), else `fallbackMs`. */
async function tableInterval(db: PgQueryable, schema: string, table: string, fallbackMs: number): Promise<number> {
  return (await tableLayout(db, schema, table))?.intervalMs ?? fallbackMs
}

/**
 * Creates the partition of now and the {@link PARTITIONS_AHEAD} after it, those missing. Also the
 * repair of a missed rotation: an insert that found no partition for its time calls it, then runs again.
 */
export async function ensurePartitions(pool: PgPoolLike, schema: string, table: string, fallbackIntervalMs: number): Promise<string[]> {
  return inTransaction(pool, async (tx) => {
    // Attaching waits for no writer, but would for an ALTER or a drop: never queue traffic behind that.
    await tx.query(`SET LOCAL lock_timeout = '${DROP_LOCK_TIMEOUT}'`)
    await lockPartitions(tx, schema, table)
    const intervalMs = await tableInterval(tx, schema, table, fallbackIntervalMs)
    const current = slotOf(await serverNow(tx), intervalMs)
    const slots = Array.from({ length: PARTITIONS_AHEAD + 1 }, (_, i) => current + i * intervalMs)
    return createPartitions(tx, schema, table, intervalMs, slots)
  })
}

/**
 * Detaches and drops, oldest first, each partition that ended (no insert can land in it) and holds
 * no record that has not expired. The check runs under ACCESS EXCLUSIVE locks on the table and the
 * partition, so no renewal or completion can extend a record between the check and the drop: a
 * record is never dropped before its expiry. A partition still holding a live record, or whose locks
 * are busy, is kept (the next round looks again), and the newer ones are still considered.
 */
export async function dropExpiredPartitions(pool: PgPoolLike, schema: string, table: string): Promise<string[]> {
  const now = await serverNow(pool)
  const ended = (await listPartitions(pool, schema, table)).filter((p) => p.toMs <= now)
  const dropped: string[] = []
  for (const partition of ended) {
    const gone = await inTransaction(pool, async (tx) => {
      await tx.query(`SET LOCAL lock_timeout = '${DROP_LOCK_TIMEOUT}'`)
      await lockPartitions(tx, schema, table)
      const p = qualified(schema, partition.name)
      await tx.query(`LOCK TABLE ONLY ${qualified(schema, table)} IN ACCESS EXCLUSIVE MODE`)
      await tx.query(`LOCK TABLE ${p} IN ACCESS EXCLUSIVE MODE`)
      const live = await tx.query(
        `SELECT 1 FROM ${p} WHERE expires_at > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint LIMIT 1`,
      )
      if (live.rows.length > 0) return false
      await tx.query(`ALTER TABLE ${qualified(schema, table)} DETACH PARTITION ${p}`)
      await tx.query(`DROP TABLE ${p}`)
      return true
    }).catch((error: unknown) => {
      // Busy now; the next round drops it.
      if (lockNotGranted(error)) return false
      throw error
    })
    if (gone) dropped.push(partition.name)
  }
  return dropped
}

/** One rotation: partitions ahead created, expired ones dropped. */
export async function rotate(pool: PgPoolLike, schema: string, table: string, fallbackIntervalMs: number): Promise<Rotation> {
  const created = await ensurePartitions(pool, schema, table, fallbackIntervalMs)
  const dropped = await dropExpiredPartitions(pool, schema, table)
  return { created, dropped }
}
