/**
 * Knex transactions for `PostgresStore` and `MySqlStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work Knex's own `trx`, and the record completes inside that transaction.
 *
 * @example
 * import { knexTransactions } from 'idemkey/knex'
 * const ledger = new Ledger({ store: new PostgresStore({ pool, transactions: knexTransactions(knex) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   await tx('orders').insert(order)
 *   return { orderId: order.id }
 * })
 */
import type { Knex } from 'knex'
import { preparedName } from '../../backends/sql/prepared-names.js'
import { positional, type SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'

/** Options of {@link knexTransactions}. */
export interface KnexTransactionsOptions {
  /** Passed to `knex.transaction` (`isolationLevel`, …). */
  config?: Knex.TransactionConfig
}

/**
 * Transactions of a Knex instance on PostgreSQL (`pg`) or MySQL/MariaDB (`mysql2`): each statement of
 * the store runs as `trx.raw(sql, values)` with positional `?` bindings.
 *
 * @example new MySqlStore({ pool, transactions: knexTransactions(knex) })
 */
export function knexTransactions(knex: Knex, options: KnexTransactionsOptions = {}): SqlTransactions<Knex.Transaction> {
  // Anything but a Knex instance (a pg Pool, a Prisma client) has no client: the refusal below names it.
  const client = String(
    (knex?.client as { config?: { client?: unknown } } | undefined)?.config?.client ??
      (knex?.client as { dialect?: string } | undefined)?.dialect,
  )
  const dialect = /^(pg|postgres|postgresql|pgnative|cockroachdb)$/.test(client)
    ? 'postgres'
    : /^(mysql|mysql2|mariadb)$/.test(client)
      ? 'mysql'
      : undefined
  if (!dialect) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `knexTransactions needs a Knex instance on PostgreSQL (client 'pg') or MySQL (client 'mysql2'), got client ${JSON.stringify(client)}.`,
    )
  }
  return {
    tool: 'knex',
    dialect,
    transaction: (fn) => knex.transaction(fn, options.config),
    async execute(trx, sql, values, options) {
      const bound = dialect === 'postgres' ? positional(sql, values) : { sql, values: [...values] }
      const query = trx.raw(bound.sql, bound.values as Knex.ValueDict[keyof Knex.ValueDict][])
      // Knex hands query options to pg: with a name, pg prepares the statement once per connection, as
      // the raw path does (parsing and planning it on every transaction costs more than running it).
      const prepare = dialect === 'postgres' && options?.prepare !== false
      const result = (await (prepare ? query.options({ name: preparedName('knex', bound.sql) }) : query)) as unknown
      if (dialect === 'postgres') return { count: ((result as { rows?: unknown[] }).rows ?? []).length }
      const header = (Array.isArray(result) ? result[0] : result) as { affectedRows?: number }
      return { count: Number(header?.affectedRows ?? 0) }
    },
  }
}
