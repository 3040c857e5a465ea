/**
 * Shared by the PostgreSQL benchmarks that need large tables (postgres.bench.ts `--rows`, scale.bench.ts):
 * filling a records table with completed records in one INSERT … SELECT generate_series, keys a
 * benchmark can name again from JavaScript, latency samples taken in alternating blocks, and the WAL
 * an operation writes.
 */
import { createHash } from 'node:crypto'
import type pg from 'pg'

/** The SQL of row `i`'s key: a UUID-shaped md5, as random over the key space as real UUID keys. */
export const KEY_SQL = `md5('k' || i)::uuid::text`

/** Row `i`'s key, as {@link KEY_SQL} makes it: so a benchmark can replay any row it filled. */
export function keyOf(i: number): string {
  const hex = createHash('md5').update(`k${i}`).digest('hex')
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`
}

/** Row `i`'s scope: a thousand tenants. */
export const SCOPE_SQL = `'tenant-' || (i % 1000)`

export function scopeOf(i: number): string {
  return `tenant-${i % 1000}`
}

export interface CompletedRows {
  /** First and last row number (inclusive): `i` in the SQL expressions. */
  from: number
  to: number
  fingerprint: string
  headers: string
  /** A fixed body for every row, or a size in bytes: a JSON body of that length, different per row. */
  body: Uint8Array | number
  /** SQL of `created_at` (epoch ms) in terms of `i`; `updated_at` is 5 ms later. */
  createdAt: string
  /** SQL of `expires_at` in terms of `i` and `created_at`'s expression. */
  expiresAt: string
}

/**
 * Inserts completed records, shaped as the store writes them (a UUID key, a 64-character
 * fingerprint, JSON headers and body, a resource id), with one statement. Rows of a partitioned
 * table go to their partitions through the parent. Returns the seconds it took.
 */
export async function fillCompleted(pool: pg.Pool, qualifiedTable: string, rows: CompletedRows): Promise<number> {
  const body =
    typeof rows.body === 'number'
      ? // The id, then md5 hex padding: little for TOAST to compress, like real short bodies.
        `convert_to(rpad('{"id":"ch_' || i || '","amount":100,"currency":"eur","status":"succeeded","note":"', ${rows.body - 2}, md5(i::text)) || '"}', 'UTF8')`
      : '$5::bytea'
  const started = performance.now()
  await pool.query(
    `INSERT INTO ${qualifiedTable} (scope, "key", fingerprint, status, token, locked_until, response_status, response_headers,
      response_body, resource_id, attempts, created_at, updated_at, expires_at)
     SELECT ${SCOPE_SQL}, ${KEY_SQL}, $1, 'completed', 1, NULL, 201, $2, ${body}, 'ch_' || i, 1,
       ${rows.createdAt}, ${rows.createdAt} + 5, ${rows.expiresAt}
     FROM generate_series($3::bigint, $4::bigint) i`,
    [rows.fingerprint, rows.headers, rows.from, rows.to, ...(typeof rows.body === 'number' ? [] : [Buffer.from(rows.body)])],
  )
  return (performance.now() - started) / 1_000
}

const DAY_MS = 86_400_000

/**
 * A fill of `rows` rows (i from 0) over `days` daily partitions ending with today, as SQL of
 * `created_at` and `expires_at` in terms of `i`: row i falls on day p = floor(i * days / rows) from
 * `firstDay` (epoch ms of the oldest day's start), within the part of that day that has elapsed
 * (`elapsedMs`, so no record is created in the future), and expires (days - 1) days after creation.
 * So the oldest day has wholly expired (exactly one partition droppable, exactly its rows purgeable)
 * and every later record is live until today ends.
 */
export function dayTimeline(rows: number, days: number, firstDay: number, elapsedMs: number): { createdAt: string; expiresAt: string } {
  const createdAt = `(${firstDay}::bigint + (i * ${days} / ${rows}) * ${DAY_MS} + ((i * ${days}) % ${rows}) * ${elapsedMs} / ${rows})`
  return { createdAt, expiresAt: `${createdAt} + ${(days - 1) * DAY_MS}` }
}

/** The first row of day p in {@link dayTimeline}'s fill. */
export function firstRowOfDay(p: number, rows: number, days: number): number {
  return Math.ceil((p * rows) / days)
}

/** `samples` sequential calls of `op`, each timed (ms). */
export async function latencies(samples: number, op: (i: number) => Promise<unknown>): Promise<number[]> {
  const out: number[] = []
  for (let i = 0; i < samples; i++) {
    const start = performance.now()
    await op(i)
    out.push(performance.now() - start)
  }
  return out
}

/**
 * Runs each named measure once per block, in turn, for `blocks` blocks (which goes first rotates),
 * and gathers each one's samples: whatever else the machine does then falls on all of them alike.
 */
export async function alternatingBlocks<K extends string>(
  blocks: number,
  measures: Record<K, (block: number) => Promise<number[]>>,
): Promise<Record<K, number[]>> {
  const names = Object.keys(measures) as K[]
  const out = Object.fromEntries(names.map((name) => [name, [] as number[]])) as Record<K, number[]>
  for (let block = 0; block < blocks; block++) {
    for (let k = 0; k < names.length; k++) {
      const name = names[(k + block) % names.length] as K
      out[name].push(...(await measures[name](block)))
    }
  }
  return out
}

/**
 * The WAL the server wrote while `fn` ran (bytes between two `pg_current_wal_insert_lsn()`), and its
 * seconds. Server-wide: on a shared server it includes other sessions' writes in that interval.
 */
export async function walDuring<R>(pool: pg.Pool, fn: () => Promise<R>): Promise<{ result: R; walBytes: number; seconds: number }> {
  const lsn = async () => String((await pool.query('SELECT pg_current_wal_insert_lsn() AS lsn')).rows[0].lsn)
  const before = await lsn()
  const started = performance.now()
  const result = await fn()
  const seconds = (performance.now() - started) / 1_000
  const after = await lsn()
  const { rows } = await pool.query('SELECT pg_wal_lsn_diff($1, $2)::bigint AS bytes', [after, before])
  return { result, walBytes: Number(rows[0].bytes), seconds }
}
