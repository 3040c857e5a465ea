/**
 * postgres.js (`postgres`) transactions for `PostgresStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work the `sql` of `sql.begin`, and the record completes inside that transaction.
 *
 * @example
 * import postgres from 'postgres'
 * import { postgresJsTransactions } from 'idemkey/postgres-js'
 * const sql = postgres(process.env.DATABASE_URL)
 * const ledger = new Ledger({ store: new PostgresStore({ connectionString, transactions: postgresJsTransactions(sql) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   await tx`INSERT INTO orders ${tx(order)}`
 *   return { orderId: order.id }
 * })
 */
import type { Sql, TransactionSql } from 'postgres'
import type { SqlTransactions } from '../../core/sql-transactions.js'

/** Options of {@link postgresJsTransactions}. */
export interface PostgresJsTransactionsOptions {
  /** What `sql.begin(options, fn)` adds to BEGIN, such as `'isolation level serializable'`. */
  begin?: string
}

/**
 * Transactions of a postgres.js `Sql` (`sql.begin`): each statement of the store runs as
 * `tx.unsafe(text, values)`.
 *
 * @example new PostgresStore({ connectionString, transactions: postgresJsTransactions(sql) })
 */
// biome-ignore lint/complexity/noBannedTypes: postgres.js defaults its custom types to {}; the same default keeps a plain postgres() assignable.
export function postgresJsTransactions<Types extends Record<string, unknown> = {}>(
  sql: Sql<Types>,
  options: PostgresJsTransactionsOptions = {},
): SqlTransactions<TransactionSql<Types>> {
  return {
    tool: 'postgres.js',
    dialect: 'postgres',
    transaction: async (fn) => {
      const run = (tx: TransactionSql<Types>) => fn(tx)
      return (await (options.begin ? sql.begin(options.begin, run) : sql.begin(run))) as Awaited<ReturnType<typeof fn>>
    },
    async execute(tx, text, values) {
      const rows = await tx.unsafe(text, values as never[])
      return { count: rows.length }
    },
  }
}
