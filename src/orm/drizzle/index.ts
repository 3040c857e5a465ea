/**
 * Drizzle ORM transactions for `PostgresStore` and `MySqlStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work Drizzle's own `tx`, and the record completes inside that transaction.
 *
 * @example
 * import { drizzle } from 'drizzle-orm/node-postgres'
 * import { drizzleTransactions } from 'idemkey/drizzle'
 * const db = drizzle(pool)
 * const ledger = new Ledger({ store: new PostgresStore({ pool, transactions: drizzleTransactions(db) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   await tx.insert(orders).values(order)
 *   return { orderId: order.id }
 * })
 */
import { is, type SQL, sql } from 'drizzle-orm'
import { MySqlDatabase } from 'drizzle-orm/mysql-core'
import { PgDatabase } from 'drizzle-orm/pg-core'
import { asPgClient, fragments, type SqlTransactions, type SqlValue } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'

/** Any Drizzle database: what its `transaction(fn)` hands `fn` is the `tx` the work gets. */
export interface DrizzleDatabaseLike {
  // biome-ignore lint/suspicious/noExplicitAny: Drizzle's transaction callbacks are generic over the schema; any keeps them assignable.
  transaction(fn: (tx: any) => Promise<any>, config?: any): Promise<any>
}

/** The transaction object of a Drizzle database (`PgTransaction`, `MySqlTransaction`, …). */
export type DrizzleTransactionOf<Db extends DrizzleDatabaseLike> = Parameters<Parameters<Db['transaction']>[0]>[0]

/** What a Drizzle `execute` needs of a transaction. */
interface Executes {
  execute(query: SQL): Promise<unknown>
}

/**
 * Transactions of a Drizzle database on PostgreSQL (node-postgres, postgres.js, or any `PgDatabase`)
 * or MySQL/MariaDB (mysql2). Each statement of the store goes through `tx.execute(sql…)` with its values
 * as bound parameters.
 *
 * @example new PostgresStore({ pool, transactions: drizzleTransactions(db) })
 */
export function drizzleTransactions<Db extends DrizzleDatabaseLike>(
  db: Db,
  options: { config?: Parameters<Db['transaction']>[1] } = {},
): SqlTransactions<DrizzleTransactionOf<Db>> {
  const dialect = is(db, PgDatabase) ? 'postgres' : is(db, MySqlDatabase) ? 'mysql' : undefined
  if (!dialect) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'drizzleTransactions needs a Drizzle database on PostgreSQL or MySQL (drizzle(pool) from drizzle-orm/node-postgres, drizzle-orm/postgres-js or drizzle-orm/mysql2).',
    )
  }
  return {
    tool: 'drizzle',
    dialect,
    transaction: (fn) => db.transaction(fn, options.config),
    // On node-postgres, the transaction's session keeps its pg client: the store prepares its statements there.
    pgClient: (tx) => (dialect === 'postgres' ? asPgClient((tx as { session?: { client?: unknown } }).session?.client) : undefined),
    async execute(tx, text, values) {
      const result = await (tx as Executes).execute(toSql(dialect, text, values))
      return { count: countOf(dialect, result) }
    },
  }
}

/** The statement as Drizzle SQL: its text as raw pieces, its values as parameters. */
function toSql(dialect: 'postgres' | 'mysql', text: string, values: readonly SqlValue[]): SQL {
  const pieces = dialect === 'postgres' ? fragments(text, values) : { strings: text.split('?'), params: [...values] }
  const chunks: SQL[] = []
  pieces.strings.forEach((piece, i) => {
    chunks.push(sql.raw(piece))
    if (i < pieces.params.length) chunks.push(sql`${pieces.params[i]}`)
  })
  return sql.join(chunks)
}

/** Rows returned (PostgreSQL drivers answer a pg result or a row list), or rows changed (mysql2's header). */
function countOf(dialect: 'postgres' | 'mysql', result: unknown): number {
  if (dialect === 'mysql') {
    const header = (Array.isArray(result) ? result[0] : result) as { affectedRows?: number }
    return Number(header?.affectedRows ?? 0)
  }
  if (Array.isArray(result)) return result.length
  const { rows, rowCount } = (result ?? {}) as { rows?: unknown[]; rowCount?: number | null }
  return rows ? rows.length : Number(rowCount ?? 0)
}
