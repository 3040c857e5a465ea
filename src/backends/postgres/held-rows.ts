/** Which records' rows an open transaction holds: PostgresStore's `heldInTransaction`. Not part of the public API. */
import type { PgPoolLike } from './pool.js'
import { inTransaction } from './rotation.js'

/**
 * Per (scope, key), in the order given: whether the row exists and whether a share lock on it is free now.
 * `FOR SHARE` conflicts with the lock every UPDATE of the row takes (a step, a completion), and SKIP LOCKED
 * never waits for it: a row that exists but comes back without its lock is held by an open transaction.
 * The share locks it does take last this one statement.
 */
function probe(table: string): string {
  return `SELECT EXISTS (SELECT 1 FROM ${table} t WHERE t.scope = p.scope AND t."key" = p."key") AS present,
      (SELECT true FROM ${table} t WHERE t.scope = p.scope AND t."key" = p."key" FOR SHARE SKIP LOCKED) AS free
    FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS p(scope, "key", n)
    ORDER BY p.n`
}

/**
 * Whether an open transaction holds each record's row, in its own short transaction that waits for no lock:
 * the rows' locks are skipped, and the table's lock (busy only under DDL: a migration, a partition being
 * dropped) is waited for at most 100 ms, then the probe fails (55P03).
 */
export async function heldRows(
  pool: PgPoolLike,
  table: string,
  records: ReadonlyArray<{ scope: string; key: string }>,
  queryTimeoutMs: number,
): Promise<boolean[]> {
  const rows = await inTransaction(pool, async (tx) => {
    await tx.query("SET LOCAL lock_timeout = '100ms'")
    const values = [records.map((r) => r.scope), records.map((r) => r.key)]
    return (await tx.query({ text: probe(table), values, query_timeout: queryTimeoutMs })).rows as Array<{
      present: boolean
      free: boolean | null
    }>
  })
  return rows.map((row) => row.present && row.free !== true)
}
