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
import { CompiledQuery, type Kysely, MysqlAdapter, PostgresAdapter, type Transaction } from 'kysely'
import { preparedName, type SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'

/** Options of {@link kyselyTransactions}. */
export interface KyselyTransactionsOptions {
  /** The database's SQL dialect; read from the Kysely instance's adapter when left out. */
  dialect?: 'postgres' | 'mysql'
  /** Isolation level of each transaction (Kysely's `setIsolationLevel`). @default the database's */
  isolationLevel?: 'read uncommitted' | 'read committed' | 'repeatable read' | 'serializable'
}

/**
 * Transactions of a Kysely instance (PostgresDialect or MysqlDialect): each statement of the store runs
 * as `trx.executeQuery(CompiledQuery.raw(sql, values))`.
 *
 * @example new MySqlStore({ pool, transactions: kyselyTransactions(db) })
 */
export function kyselyTransactions<DB>(db: Kysely<DB>, options: KyselyTransactionsOptions = {}): SqlTransactions<Transaction<DB>> {
  const dialect = options.dialect ?? dialectOf(db)
  return {
    tool: 'kysely',
    dialect,
    transaction: (fn) => {
      const builder = db.transaction()
      return (options.isolationLevel ? builder.setIsolationLevel(options.isolationLevel) : builder).execute(fn)
    },
    async execute(trx, sql, values) {
      const compiled = CompiledQuery.raw(sql, [...values])
      const prepared = dialect === 'postgres' ? await preparedOnPg(trx, compiled) : undefined
      const result = prepared ?? (await trx.executeQuery(compiled))
      return { count: dialect === 'postgres' ? result.rows.length : Number(result.numAffectedRows ?? 0n) }
    },
  }
}

/** A pg query config, passed where Kysely's pg connection passes its SQL text on to `client.query`. */
interface NamedQuery {
  name: string
  text: string
  toString(): string
}

/**
 * On Kysely's own PostgreSQL driver, sends the statement to the transaction's connection as a named
 * prepared statement: that connection hands its SQL straight to node-postgres's `client.query`, which
 * takes a `{ name, text }` config in place of the text. Parsing and planning the store's statements on
 * every transaction costs more than running them. Any other driver (or a Kysely that stops passing the
 * text through unchanged, which test/orm-kysely.test.ts would show) gets the plain statement.
 */
async function preparedOnPg(
  trx: { getExecutor?: () => { provideConnection<T>(consumer: (connection: unknown) => Promise<T>): Promise<T> } },
  compiled: CompiledQuery,
): Promise<{ rows: unknown[]; numAffectedRows?: bigint } | undefined> {
  const executor = trx.getExecutor?.()
  if (!executor) return undefined
  return executor.provideConnection(async (connection) => {
    if ((connection as object | null)?.constructor?.name !== 'PostgresConnection') return undefined
    const text = compiled.sql
    const named: NamedQuery = { name: preparedName('kysely', text), text, toString: () => text }
    const query = { ...compiled, sql: named as unknown as string }
    return (connection as { executeQuery(query: CompiledQuery): Promise<{ rows: unknown[] }> }).executeQuery(query)
  })
}

function dialectOf(db: object): 'postgres' | 'mysql' {
  // getExecutor() is marked internal by Kysely; when it is not there, the option says it.
  const adapter = (db as unknown as { getExecutor?: () => { adapter: unknown } }).getExecutor?.().adapter
  if (adapter instanceof PostgresAdapter) return 'postgres'
  if (adapter instanceof MysqlAdapter) return 'mysql'
  throw new IdempotencyError(
    'INVALID_OPTION',
    "kyselyTransactions could not tell the database's dialect: pass { dialect: 'postgres' } or { dialect: 'mysql' }.",
  )
}
