/**
 * Sequelize transactions for `PostgresStore` and `MySqlStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work Sequelize's own `Transaction`, and the record completes inside it.
 *
 * @example
 * import { sequelizeTransactions } from 'idemkey/sequelize'
 * const ledger = new Ledger({ store: new PostgresStore({ pool, transactions: sequelizeTransactions(sequelize) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   await Order.create(order, { transaction: tx })
 *   return { orderId: order.id }
 * })
 */
import type { Sequelize, Transaction, TransactionOptions } from 'sequelize'
import { asPgClient, type SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'

/** Options of {@link sequelizeTransactions}. */
export interface SequelizeTransactionsOptions {
  /** Passed to `sequelize.transaction` (`isolationLevel`, …). */
  config?: TransactionOptions
}

/**
 * Transactions of a Sequelize instance on PostgreSQL, MySQL or MariaDB (managed transactions): each
 * statement of the store runs as `sequelize.query(sql, { transaction })`, its values bound (PostgreSQL)
 * or escaped by Sequelize as replacements (MySQL).
 *
 * @example new MySqlStore({ pool, transactions: sequelizeTransactions(sequelize) })
 */
export function sequelizeTransactions(sequelize: Sequelize, options: SequelizeTransactionsOptions = {}): SqlTransactions<Transaction> {
  // Anything but a Sequelize instance has no getDialect(): the refusal below names it.
  const name = typeof sequelize?.getDialect === 'function' ? sequelize.getDialect() : undefined
  const dialect = name === 'postgres' ? 'postgres' : name === 'mysql' || name === 'mariadb' ? 'mysql' : undefined
  if (!dialect) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `sequelizeTransactions needs Sequelize on 'postgres', 'mysql' or 'mariadb', got ${JSON.stringify(name)}.`,
    )
  }
  return {
    tool: 'sequelize',
    dialect,
    transaction: (fn) => sequelize.transaction(options.config ?? {}, fn),
    // A Sequelize transaction holds its pg client: the store prepares its statements there.
    pgClient: (transaction) =>
      dialect === 'postgres' ? asPgClient((transaction as unknown as { connection?: unknown }).connection) : undefined,
    async execute(transaction, sql, values) {
      const [rows, meta] = (await sequelize.query(sql, {
        transaction,
        raw: true,
        ...(dialect === 'postgres' ? { bind: [...values] } : { replacements: [...values] }),
      })) as [unknown, unknown]
      if (dialect === 'postgres') return { count: Array.isArray(rows) ? rows.length : 0 }
      // A statement that starts with `INSERT INTO` is answered [insertId, affectedRows] by Sequelize.
      if (typeof meta === 'number') return { count: meta }
      const header = (rows && typeof rows === 'object' && 'affectedRows' in rows ? rows : meta) as { affectedRows?: number }
      return { count: Number(header?.affectedRows ?? 0) }
    },
  }
}
