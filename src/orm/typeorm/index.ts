/**
 * TypeORM transactions for `PostgresStore` and `MySqlStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work the transaction's own `EntityManager`, and the record completes inside that
 * transaction.
 *
 * @example
 * import { typeormTransactions } from 'idemkey/typeorm'
 * const ledger = new Ledger({ store: new PostgresStore({ pool, transactions: typeormTransactions(dataSource) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   await tx.getRepository(Order).insert(order)
 *   return { orderId: order.id }
 * })
 */
import type { DataSource, EntityManager } from 'typeorm'
import type { IsolationLevel } from 'typeorm/driver/types/IsolationLevel.js'
import { asPgClient, type SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'

/** Options of {@link typeormTransactions}. */
export interface TypeormTransactionsOptions {
  /** Isolation level of each transaction. @default the database's */
  isolationLevel?: IsolationLevel
}

/**
 * Transactions of a TypeORM `DataSource` of type `postgres`, `mysql` or `mariadb`: each statement of
 * the store runs on the transaction's query runner.
 *
 * @example new MySqlStore({ pool, transactions: typeormTransactions(dataSource) })
 */
export function typeormTransactions(dataSource: DataSource, options: TypeormTransactionsOptions = {}): SqlTransactions<EntityManager> {
  // Anything but a DataSource (an EntityManager, a pg Pool) has no options.type: the refusal below names it.
  const type = String((dataSource as { options?: { type?: unknown } } | undefined)?.options?.type)
  const dialect = type === 'postgres' ? 'postgres' : type === 'mysql' || type === 'mariadb' ? 'mysql' : undefined
  if (!dialect) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `typeormTransactions needs a DataSource of type 'postgres', 'mysql' or 'mariadb', got ${JSON.stringify(type)}.`,
    )
  }
  const { isolationLevel } = options
  return {
    tool: 'typeorm',
    dialect,
    transaction: (fn) => (isolationLevel ? dataSource.transaction(isolationLevel, fn) : dataSource.transaction(fn)),
    // The query runner of a transaction holds its pg client: the store prepares its statements there.
    pgClient: (manager) =>
      dialect === 'postgres'
        ? asPgClient((manager.queryRunner as unknown as { databaseConnection?: unknown } | undefined)?.databaseConnection)
        : undefined,
    async execute(manager, sql, values) {
      const runner = manager.queryRunner
      if (!runner) {
        throw new IdempotencyError('INVALID_ARGUMENT', 'typeormTransactions: this EntityManager has no transaction (no query runner).')
      }
      const result = await runner.query(sql, [...values], true)
      return { count: dialect === 'postgres' ? result.records.length : Number(result.affected ?? 0) }
    },
  }
}
