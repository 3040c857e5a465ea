/**
 * Converting a records table between the plain and the partitioned layout, both ways, records kept.
 * Not part of the public API.
 */
import { IdempotencyError } from '../../errors.js'
import { RECORD_COLUMNS } from './partitioned-statements.js'
import {
  assertPartitionedName,
  createPartitions,
  layoutComment,
  PARTITIONS_AHEAD,
  type PostgresLayout,
  partitionedTableDdl,
  serverNow,
  slotOf,
  tableLayout,
} from './partitions.js'
import type { PgPoolLike, PgQueryable } from './pool.js'
import { toStoreError } from './postgres-errors.js'
import { inTransaction } from './rotation.js'
import { type LayoutChoice, migrate, plainTableDdl, SCHEMA_VERSION } from './schema.js'
import { qualified } from './statements.js'

/** What a conversion did. */
export interface LayoutConversion {
  from: PostgresLayout
  to: PostgresLayout
  /** Records copied into the new layout (0 when the table had the layout already). */
  records: number
}

/** Renames the indexes (and so the constraints) of `relation`, so the new table can take their names. */
async function setIndexesAside(tx: PgQueryable, schema: string, relation: string): Promise<void> {
  const indexes = await tx.query(
    `SELECT c.relname AS name, c.oid::text AS oid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     WHERE i.indrelid = $1::regclass`,
    [qualified(schema, relation)],
  )
  for (const { name, oid } of indexes.rows as Array<{ name: string; oid: string }>) {
    await tx.query(`ALTER INDEX ${qualified(schema, name)} RENAME TO "idemkey_old_${oid}"`)
  }
}

/**
 * Rewrites the table in the layout `to`, in one transaction under an ACCESS EXCLUSIVE lock (every
 * store on the table waits until it commits; plan a quiet moment for a large table): the table is
 * renamed aside, the new one created under its name (with the partitions its records need, and
 * those ahead), every record copied, the old one dropped. Brings the schema up to date first.
 * Privileges granted on the old table are not carried over: grant them again.
 */
export async function convertLayout(pool: PgPoolLike, schema: string, table: string, to: LayoutChoice): Promise<LayoutConversion> {
  const found = await tableLayout(pool, schema, table).catch((error: unknown) => {
    throw toStoreError('convertLayout', error, schema, table)
  })
  if (found === undefined) {
    await migrate(pool, schema, table, to)
    return { from: to.layout, to: to.layout, records: 0 }
  }
  const from: PostgresLayout = found.layout
  await migrate(pool, schema, table, { layout: from, intervalMs: to.intervalMs })
  if (from === to.layout) return { from, to: to.layout, records: 0 }
  // The partitions' names, and the name the old table is set aside under, must fit 63 characters.
  assertPartitionedName(table)
  if (to.layout === 'partitioned' && !(to.intervalMs > 0)) {
    throw new IdempotencyError('INVALID_OPTION', 'postgres: converting to the partitioned layout needs a partition interval.')
  }
  const t = qualified(schema, table)
  const aside = `${table}_idemkey_old`
  try {
    return await inTransaction(pool, async (tx) => {
      await tx.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`idemkey:migrate:${schema}.${table}`])
      await tx.query(`LOCK TABLE ${t} IN ACCESS EXCLUSIVE MODE`)
      await tx.query(`ALTER TABLE ${t} RENAME TO "${aside}"`)
      await setIndexesAside(tx, schema, aside)
      const ddl = to.layout === 'partitioned' ? partitionedTableDdl(schema, table) : plainTableDdl(schema, table)
      for (const sql of ddl) await tx.query(sql)
      await tx.query(`COMMENT ON TABLE ${t} IS '${layoutComment(SCHEMA_VERSION, to.layout, to.intervalMs)}'`)
      if (to.layout === 'partitioned') {
        const interval = to.intervalMs
        const used = await tx.query(`SELECT DISTINCT (created_at / $1::bigint) * $1::bigint AS slot FROM ${qualified(schema, aside)}`, [
          interval,
        ])
        const current = slotOf(await serverNow(tx), interval)
        const slots = (used.rows as Array<{ slot: string | number }>).map((row) => Number(row.slot))
        for (let i = 0; i <= PARTITIONS_AHEAD; i++) slots.push(current + i * interval)
        await createPartitions(tx, schema, table, interval, slots)
      }
      const copied = await tx.query(`INSERT INTO ${t} (${RECORD_COLUMNS}) SELECT ${RECORD_COLUMNS} FROM ${qualified(schema, aside)}`)
      await tx.query(`DROP TABLE ${qualified(schema, aside)}`)
      return { from, to: to.layout, records: copied.rowCount ?? 0 }
    })
  } catch (error) {
    throw toStoreError('convertLayout', error, schema, table)
  }
}
