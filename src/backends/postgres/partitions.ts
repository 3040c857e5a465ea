/**
 * The partitioned layout of PostgresStore (docs/postgres.md, "Time partitions"): the records table
 * range-partitioned by `created_at`, one partition per interval, named `<table>_p<start ms>`.
 * Expiry drops whole partitions instead of deleting rows. Not part of the public API.
 */
import { IdempotencyError } from '../../errors.js'
import type { PgQueryable } from './pool.js'
import { NOW_MS, qualified, RECORD_COLUMNS_V1 } from './statements.js'

/** How records are laid out: one plain table, or range partitions by creation time. */
export type PostgresLayout = 'plain' | 'partitioned'

/** Partitions created ahead of the present, so that inserts never wait for one. */
export const PARTITIONS_AHEAD = 2

/** `_p` and up to 14 digits of epoch ms (and a sign): the suffix of a partition's name. */
const PARTITION_SUFFIX_MAX = 16

/** The longest table name whose partition names still fit PostgreSQL's 63-byte identifiers. */
export const PARTITIONED_TABLE_MAX = 63 - PARTITION_SUFFIX_MAX

/** What a table's comment says of its layout: `idemkey schema 2 partitioned 86400000: …`. */
const LAYOUT_COMMENT = /^idemkey schema \d+ partitioned (\d+)/

export function layoutComment(version: number, layout: PostgresLayout, intervalMs: number): string {
  return layout === 'partitioned'
    ? `idemkey schema ${version} partitioned ${intervalMs}: idempotency records (scope, key) in time partitions of ${intervalMs} ms`
    : `idemkey schema ${version}: idempotency records (scope, key)`
}

/** The interval a partitioned table was created with, from its comment. */
export function intervalOf(comment: string | null): number | undefined {
  const found = LAYOUT_COMMENT.exec(comment ?? '')
  return found ? Number(found[1]) : undefined
}

/** What an existing table is: its layout, and a partitioned table's interval (from its comment). */
export interface TableLayout {
  layout: PostgresLayout
  /** The partition span a partitioned table was created with; undefined on a plain table or a table without idemkey's comment. */
  intervalMs: number | undefined
}

/**
 * The layout of the table `schema.table`, or undefined when there is none. The one place that reads
 * it: `convertLayout`, the rotation and the CLI (which opens a store in the table's own layout).
 */
export async function tableLayout(db: PgQueryable, schema: string, table: string): Promise<TableLayout | undefined> {
  const found = await db.query(
    `SELECT c.relkind AS kind, obj_description(c.oid, 'pg_class') AS comment
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
    [schema, table],
  )
  const row = found.rows[0] as { kind: string; comment: string | null } | undefined
  if (row === undefined) return undefined
  return row.kind === 'p' ? { layout: 'partitioned', intervalMs: intervalOf(row.comment) } : { layout: 'plain', intervalMs: undefined }
}

export function partitionName(table: string, startMs: number): string {
  return `${table}_p${startMs}`
}

/**
 * The partitioned table at the current schema version (the plain one's columns, steps included).
 * Its primary key must contain the partition key, so it is (scope, key, created_at): one record per
 * (scope, key) across partitions comes from the acquire's advisory lock (statements in
 * partitioned-statements.ts), not from a constraint. The indexes are declared on the parent, so
 * every partition gets its own.
 */
export function partitionedTableDdl(schema: string, table: string): string[] {
  const t = qualified(schema, table)
  return [
    `CREATE TABLE ${t} (
      ${RECORD_COLUMNS_V1},
      steps jsonb NULL,
      CONSTRAINT "${table}_pkey" PRIMARY KEY (scope, "key", created_at)
    ) PARTITION BY RANGE (created_at)`,
    `CREATE INDEX "${table}_expires_at" ON ${t} (expires_at)`,
    `CREATE INDEX "${table}_in_progress" ON ${t} (locked_until) WHERE status = 'in_progress'`,
  ]
}

export function assertPartitionedName(table: string): void {
  if (table.length > PARTITIONED_TABLE_MAX) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `PostgresStore table "${table}" is too long for layout 'partitioned': its partitions are named <table>_p<ms>, so the table may have up to ${PARTITIONED_TABLE_MAX} characters.`,
    )
  }
}

/** One partition of the table: its name and the [from, to) range of `created_at` it holds. */
export interface Partition {
  name: string
  fromMs: number
  toMs: number
}

const BOUND = /FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)/

/** The table's partitions, oldest first. */
export async function listPartitions(db: PgQueryable, schema: string, table: string): Promise<Partition[]> {
  const result = await db.query(
    `SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
     JOIN pg_namespace n ON n.oid = p.relnamespace WHERE n.nspname = $1 AND p.relname = $2`,
    [schema, table],
  )
  const partitions: Partition[] = []
  for (const row of result.rows as Array<{ name: string; bound: string }>) {
    const found = BOUND.exec(row.bound)
    if (found) partitions.push({ name: row.name, fromMs: Number(found[1]), toMs: Number(found[2]) })
  }
  return partitions.sort((a, b) => a.fromMs - b.fromMs)
}

/** The server's clock, in epoch ms: partitions are cut by the clock that stamps `created_at`. */
export async function serverNow(db: PgQueryable): Promise<number> {
  return Number(((await db.query(`SELECT ${NOW_MS} AS ms`)).rows[0] as { ms: string | number }).ms)
}

/** The start of the interval that holds `ms`. */
export function slotOf(ms: number, intervalMs: number): number {
  return Math.floor(ms / intervalMs) * intervalMs
}

/**
 * Creates, in the transaction `tx` is in, the partitions for the given slots that do not exist yet.
 * Callers hold the table's partition lock (`lockPartitions`), so two processes never race to
 * create one. Each is made as a table of its own and then attached: `CREATE TABLE … PARTITION OF`
 * takes an ACCESS EXCLUSIVE lock on the parent, which waits for every transaction writing records
 * (a long `runInTransaction`) and stalls all traffic behind it, while `ATTACH PARTITION` takes a
 * SHARE UPDATE EXCLUSIVE lock, which lets reads and writes go on (the new table is empty, so its
 * range check and its indexes cost nothing). Returns the names created.
 */
export async function createPartitions(
  tx: PgQueryable,
  schema: string,
  table: string,
  intervalMs: number,
  slots: number[],
): Promise<string[]> {
  const existing = await listPartitions(tx, schema, table)
  const created: string[] = []
  for (const from of [...new Set(slots)].sort((a, b) => a - b)) {
    if (existing.some((p) => p.fromMs < from + intervalMs && p.toMs > from)) continue
    const name = partitionName(table, from)
    const p = qualified(schema, name)
    const t = qualified(schema, table)
    await tx.query(`CREATE TABLE ${p} (LIKE ${t} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
    await tx.query(`ALTER TABLE ${t} ATTACH PARTITION ${p} FOR VALUES FROM (${from}) TO (${from + intervalMs})`)
    created.push(name)
  }
  return created
}

/** Serializes the processes that create or drop partitions of one table (transaction-scoped). */
export async function lockPartitions(tx: PgQueryable, schema: string, table: string): Promise<void> {
  await tx.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`idemkey:partitions:${schema}.${table}`])
}
