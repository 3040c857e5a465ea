/**
 * Kysely transactions for `PostgresStore` and `MySqlStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work Kysely's own `trx`, and the record completes inside that transaction.
 *
 * @example
 * import { kyselyTransactions } from 'idemkey/kysely'
 * const ledger = new Ledger({ store: new PostgresStore({ pool, transactions: kyselyTransactions(db) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   await tx.insertInto('orders').values(order).execute()
 *   return { orderId: order.id }
 * })
 */
import { CompiledQuery, type Kysely, type Transaction } from 'kysely'
import type { SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'
import { preparedOnKyselyPg } from '../kysely-prepared.js'

/** Options of {@link kyselyTransactions}. */
export interface KyselyTransactionsOptions {
  /** The database's SQL dialect; read from the Kysely instance's adapter when left out. */
  dialect?: 'postgres' | 'mysql'
  /** Isolation level of each transaction (Kysely's `setIsolationLevel`). @default the database's */
  isolationLevel?: 'read uncommitted' | 'read committed' | 'repeatable read' | 'serializable'
}

/**
 * Transactions of a Kysely instance (PostgresDialect or MysqlDialect): each statement of the store runs
 * as `trx.executeQuery(CompiledQuery.raw(sql, values))`, or, on Kysely's own pg driver, as a named
 * prepared statement on the transaction's connection.
 *
 * @example new MySqlStore({ pool, transactions: kyselyTransactions(db) })
 */
export function kyselyTransactions<DB>(db: Kysely<DB>, options: KyselyTransactionsOptions = {}): SqlTransactions<Transaction<DB>> {
  if (typeof db?.transaction !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'kyselyTransactions needs a Kysely instance (new Kysely({ dialect })) on PostgreSQL or MySQL.',
    )
  }
  const dialect = options.dialect ?? dialectOf(db)
  return {
    tool: 'kysely',
    dialect,
    transaction: (fn) => {
      const builder = db.transaction()
      return (options.isolationLevel ? builder.setIsolationLevel(options.isolationLevel) : builder).execute(fn)
    },
    async execute(trx, sql, values, options) {
      const prepare = dialect === 'postgres' && options?.prepare !== false
      const prepared = prepare ? await preparedOnKyselyPg(trx, 'kysely', sql, values) : undefined
      const result = prepared ?? (await trx.executeQuery(CompiledQuery.raw(sql, [...values])))
      return { count: dialect === 'postgres' ? result.rows.length : Number(result.numAffectedRows ?? 0n) }
    },
  }
}

/**
 * The dialect, from what Kysely's adapter says it supports: PostgreSQL's has transactional DDL and
 * `RETURNING`, MySQL's neither (SQLite's and MSSQL's one of them). By its capabilities, not by
 * `instanceof`: a Kysely built from another copy of kysely (CommonJS code beside an ESM app, two
 * versions installed) has adapters of other classes, and so do dialects that extend Kysely's.
 */
function dialectOf(db: object): 'postgres' | 'mysql' {
  // getExecutor() is marked internal by Kysely; when it is not there, the option says it.
  const adapter = (db as unknown as { getExecutor?: () => { adapter?: AdapterCapabilities } }).getExecutor?.().adapter
  if (adapter?.supportsTransactionalDdl === true && adapter.supportsReturning === true) return 'postgres'
  if (adapter?.supportsTransactionalDdl === false && adapter.supportsReturning === false) return 'mysql'
  throw new IdempotencyError(
    'INVALID_OPTION',
    "kyselyTransactions could not tell the database's dialect: pass { dialect: 'postgres' } or { dialect: 'mysql' }.",
  )
}

/** What a Kysely `DialectAdapter` says it supports. */
interface AdapterCapabilities {
  supportsTransactionalDdl?: unknown
  supportsReturning?: unknown
}
