/**
 * MikroORM transactions for `PostgresStore` and `MySqlStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work the transaction's own `EntityManager` (the fork of `em.transactional`), and the record
 * completes inside that transaction.
 *
 * @example
 * import { mikroOrmTransactions } from 'idemkey/mikro-orm'
 * const ledger = new Ledger({ store: new PostgresStore({ pool, transactions: mikroOrmTransactions(orm.em) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   tx.create(Order, order) // flushed before the commit, with the record
 *   return { orderId: order.id }
 * })
 */
import { positional, type SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'
import { type KyselyTransactionLike, preparedOnKyselyPg } from '../kysely-prepared.js'

/** What idemkey needs of a MikroORM SQL `EntityManager` (`@mikro-orm/postgresql`, `@mikro-orm/mysql`, `@mikro-orm/mariadb`). */
export interface MikroOrmEntityManagerLike {
  // biome-ignore lint/suspicious/noExplicitAny: MikroORM's transactional is generic over the manager itself.
  transactional<T>(cb: (em: any) => T | Promise<T>, options?: any): Promise<T>
  // biome-ignore lint/suspicious/noExplicitAny: raw results are rows or a result header.
  execute(query: string, params?: any[], method?: 'all' | 'get' | 'run'): Promise<any>
  getPlatform(): object
  /** The transaction inside `transactional`: a Kysely transaction in MikroORM 7. */
  getTransactionContext?(): unknown
}

/** Options of {@link mikroOrmTransactions}. */
export interface MikroOrmTransactionsOptions {
  /** The database's SQL dialect; read from the EntityManager's platform when left out. */
  dialect?: 'postgres' | 'mysql'
  /**
   * Passed to `em.transactional` (`isolationLevel`, …). `propagation` defaults to `'requires_new'`: a
   * top-level transaction of its own even when called inside an open `em.transactional` (MikroORM's own
   * default nests a savepoint in it, and the record's completion would then commit, or roll back, with
   * the outer transaction, after the ledger answered). @default { propagation: 'requires_new' }
   */
  // biome-ignore lint/suspicious/noExplicitAny: MikroORM's TransactionOptions.
  config?: any
}

/**
 * Transactions of a MikroORM `EntityManager` on PostgreSQL, MySQL or MariaDB: `em.transactional`, with
 * each statement of the store run as `em.execute(sql, values)` on the transaction's fork (on PostgreSQL
 * with MikroORM's pg driver: as a named prepared statement on the transaction's connection). MikroORM
 * flushes the fork's unit of work before it commits, so entities the work persisted commit with the record.
 *
 * @example new MySqlStore({ pool, transactions: mikroOrmTransactions(orm.em) })
 */
export function mikroOrmTransactions<Em extends MikroOrmEntityManagerLike>(
  em: Em,
  options: MikroOrmTransactionsOptions = {},
): SqlTransactions<Em> {
  if (typeof em?.transactional !== 'function' || typeof em.execute !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'mikroOrmTransactions needs a MikroORM EntityManager (orm.em) on PostgreSQL or MySQL: one with transactional() and execute().',
    )
  }
  const dialect = options.dialect ?? dialectOf(em)
  // MikroORM finds a transaction already open in the async context (an outer em.transactional, a
  // @Transactional() method) and by default nests in it; runInTransaction's is a transaction of its own
  // (docs/orm.md, "Nesting"), so its writes and the record commit when the ledger says they did.
  const config = { propagation: 'requires_new', ...options.config }
  return {
    tool: 'mikro-orm',
    dialect,
    transaction: (fn) => em.transactional((fork: Em) => fn(fork), config),
    async execute(fork, sql, values, options) {
      if (dialect === 'postgres' && options?.prepare !== false) {
        // On MikroORM's pg driver (Kysely's PostgresConnection), the statement goes to the transaction's
        // connection as a named prepared statement: parsed and planned once per connection, not formatted
        // into a new text on every transaction.
        const context = fork.getTransactionContext?.() as KyselyTransactionLike | undefined
        const prepared = context ? await preparedOnKyselyPg(context, 'mikro-orm', sql, values) : undefined
        if (prepared) return { count: prepared.rows.length }
      }
      // Elsewhere MikroORM binds `?` placeholders (it formats them into the statement, escaped by the platform).
      const bound = dialect === 'postgres' ? positional(sql, values) : { sql, values: [...values] }
      const result = await fork.execute(bound.sql, bound.values, dialect === 'postgres' ? 'all' : 'run')
      if (dialect === 'postgres') return { count: Array.isArray(result) ? result.length : 0 }
      return { count: Number((result as { affectedRows?: number })?.affectedRows ?? 0) }
    },
  }
}

function dialectOf(em: MikroOrmEntityManagerLike): 'postgres' | 'mysql' {
  const name = em.getPlatform().constructor.name.toLowerCase()
  if (name.includes('postgre')) return 'postgres'
  if (name.includes('mysql') || name.includes('mariadb')) return 'mysql'
  throw new IdempotencyError(
    'INVALID_OPTION',
    `mikroOrmTransactions could not tell the database of platform ${em.getPlatform().constructor.name}: pass { dialect: 'postgres' } or { dialect: 'mysql' }.`,
  )
}
