/**
 * The acquire of the partitioned layout: a lock-free read answers the callers whose key has a live
 * record, the others go on under the keys' advisory locks; an insert that finds no partition for now
 * (a missed rotation) creates the partitions and runs again.
 */
import type { PartitionedStatements } from './partitioned-statements.js'
import type { PgClientLike, PgPoolLike, PgQueryResult } from './pool.js'
import { lockNotGranted, toStoreError } from './postgres-errors.js'
import { ensurePartitions, inTransaction } from './rotation.js'
import type { Statement } from './statements.js'

export interface PartitionedAcquireOptions<Client extends PgClientLike> {
  schema: string
  table: string
  intervalMs: number
  prepared: boolean
  queryTimeoutMs: number
  sql: PartitionedStatements
  /** The store's pool, opened if needed. */
  ready(operation: string): Promise<PgPoolLike<Client>>
  /** A statement on the store's pool. */
  query(operation: string, statement: Statement, values: unknown[]): Promise<PgQueryResult>
}

export class PartitionedAcquire<Client extends PgClientLike> {
  readonly #options: PartitionedAcquireOptions<Client>

  constructor(options: PartitionedAcquireOptions<Client>) {
    this.#options = options
  }

  /**
   * Creates the partition of now and those ahead. For an acquire whose insert found its partition
   * missing (a missed rotation), a lock not granted in time is no failure: another transaction holds
   * it, one creating the same partitions for other callers, or a rotation, and the acquire's next
   * attempt finds the partition, or asks again.
   */
  async ensurePartitions(operation: 'migrate' | 'acquire'): Promise<void> {
    const { schema, table, intervalMs } = this.#options
    try {
      await ensurePartitions(await this.#options.ready(operation), schema, table, intervalMs)
    } catch (error) {
      if (operation === 'acquire' && lockNotGranted(error)) return
      throw toStoreError(operation, error, schema, table)
    }
  }

  /**
   * The partitioned acquire (partitioned-statements.ts), in the batch statement's shape: a lock-free
   * read answers the callers whose key has a live record (replays, duplicates in flight, mismatches);
   * the others go on under the key locks.
   */
  async acquire(values: unknown[]): Promise<PgQueryResult> {
    const [scopes, keys, fingerprints, leases, watched] = values as [string[], string[], string[], number[], string[]]
    const peeked = (await this.#options.query('acquire', this.#options.sql.peek, [scopes, keys, fingerprints])).rows as Array<{
      n: string | number
    }>
    if (peeked.length === scopes.length) return { rows: peeked, rowCount: peeked.length }
    // The callers the read left unanswered go on under the key locks, numbered again from 1 (and
    // the first of each key among them may write); their rows are numbered back as the caller's.
    const answered = new Set(peeked.map((row) => Number(row.n)))
    const rest = scopes.map((_, i) => i).filter((i) => !answered.has(i + 1))
    const pick = <T>(column: T[]) => rest.map((i) => column[i] as T)
    const first = rest.map((i, j) => j === 0 || scopes[i] !== scopes[rest[j - 1] as number] || keys[i] !== keys[rest[j - 1] as number])
    const locked = await this.#underKeyLocks([
      pick(scopes),
      pick(keys),
      pick(fingerprints),
      pick(leases),
      pick(watched),
      first.map((flag) => (flag ? 't' : 'f')),
      values[6],
    ])
    const rows = [
      ...peeked,
      ...(locked.rows as Array<{ n: string | number }>).map((row) => ({ ...row, n: (rest[Number(row.n) - 1] as number) + 1 })),
    ]
    return { rows, rowCount: rows.length }
  }

  /**
   * The keys' advisory locks, then the acquire statement, in one READ COMMITTED transaction, so the
   * statement's snapshot comes after the locks. An insert that found no partition for now (a
   * rotation was missed) creates the partitions and runs again.
   */
  async #underKeyLocks(values: unknown[]): Promise<PgQueryResult> {
    const { schema, table, sql, prepared, queryTimeoutMs } = this.#options
    const pool = await this.#options.ready('acquire')
    const named = (statement: Statement, params: unknown[]) =>
      prepared
        ? { name: statement.name, text: statement.text, values: params, query_timeout: queryTimeoutMs }
        : { text: statement.text, values: params, query_timeout: queryTimeoutMs }
    for (let attempt = 0; ; attempt++) {
      try {
        return await inTransaction(pool, async (tx) => {
          await tx.query(named(sql.lock, [values[0], values[1], `${schema}.${table}`]))
          return tx.query(named(sql.acquire, values))
        })
      } catch (error) {
        if (attempt < 3 && noPartition(error)) {
          await this.ensurePartitions('acquire')
          continue
        }
        throw toStoreError('acquire', error, schema, table)
      }
    }
  }
}

/** An insert that found no partition for its `created_at` (SQLSTATE 23514, "no partition of relation … found for row"). */
function noPartition(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: string; message?: string }
  return code === '23514' && /no partition/.test(message ?? '')
}
