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
import type { ListenMeta, ReservedSql, Sql, TransactionSql } from 'postgres'
import type { PgClientLike, PgNotification, PgPoolLike, PgQueryConfig, PgQueryResult } from '../../backends/postgres/pool.js'
import type { SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'

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
  assertPostgresJs(sql, 'postgresJsTransactions')
  return {
    tool: 'postgres.js',
    dialect: 'postgres',
    transaction: async (fn) => {
      const run = (tx: TransactionSql<Types>) => fn(tx)
      return (await (options.begin ? sql.begin(options.begin, run) : sql.begin(run))) as Awaited<ReturnType<typeof fn>>
    },
    async execute(tx, text, values, options) {
      // Prepared: postgres.js parses and plans it once per connection, as the raw path does.
      const rows = await tx.unsafe(text, values as never[], { prepare: options?.prepare !== false })
      return { count: rows.length }
    },
  }
}

/**
 * A postgres.js `Sql` as the pool of a `PostgresStore` (or anything that takes a pg pool), so an
 * application on postgres.js needs no second driver: statements run as `sql.unsafe(text, values)`
 * (prepared, cached per connection by postgres.js), `connect()` reserves a connection
 * (`sql.reserve()`), and the store's LISTEN connection for waking waiters becomes `sql.listen`. The
 * store never ends your `sql`.
 *
 * @example
 * const sql = postgres(process.env.DATABASE_URL)
 * const store = new PostgresStore({ pool: postgresJsPool(sql), transactions: postgresJsTransactions(sql) })
 */
// biome-ignore lint/complexity/noBannedTypes: postgres.js defaults its custom types to {}; the same default keeps a plain postgres() assignable.
export function postgresJsPool<Types extends Record<string, unknown> = {}>(sql: Sql<Types>): PgPoolLike<PgClientLike> {
  assertPostgresJs(sql, 'postgresJsPool')
  const run = async (on: Sql<Types> | ReservedSql<Types>, text: string | PgQueryConfig, values?: unknown[]): Promise<PgQueryResult> => {
    const config = typeof text === 'string' ? { text, values } : text
    const rows = await on.unsafe(config.text, (config.values ?? []) as never[], { prepare: true })
    return { rows: [...rows], rowCount: rows.count ?? rows.length, command: rows.command }
  }
  return {
    query: ((text: string | PgQueryConfig, values?: unknown[]) => run(sql, text, values)) as PgPoolLike['query'],
    async connect(): Promise<PgClientLike> {
      let reserved: ReservedSql<Types> | undefined
      let listening: ListenMeta | undefined
      const notify = new Set<(message: PgNotification) => void>()
      const client = {
        async query(text: string | PgQueryConfig, values?: unknown[]): Promise<PgQueryResult> {
          const statement = typeof text === 'string' ? text : text.text
          const listen = /^LISTEN "([^"]+)"$/.exec(statement)
          if (listen) {
            // postgres.js keeps one connection for all its listeners and re-LISTENs after a reconnect.
            const channel = listen[1] as string
            listening = await sql.listen(channel, (payload) => {
              for (const deliver of notify) deliver({ channel, payload })
            })
            return { rows: [], rowCount: null }
          }
          reserved ??= await sql.reserve()
          return run(reserved, text, values)
        },
        release() {
          void listening?.unlisten().catch(() => {})
          reserved?.release()
          reserved = undefined
        },
        on(event: string, listener: (message: PgNotification) => void) {
          if (event === 'notification') notify.add(listener)
          return client
        },
        removeListener(event: string, listener: (message: PgNotification) => void) {
          if (event === 'notification') notify.delete(listener)
          return client
        },
      }
      return client as PgClientLike
    },
  }
}

/** Refuses what is not a postgres.js `sql` (a pg Pool, a Drizzle database), which failed only at the first statement. */
function assertPostgresJs(sql: unknown, where: string): void {
  const given = sql as { begin?: unknown; unsafe?: unknown; reserve?: unknown } | null | undefined
  if (typeof given?.begin !== 'function' || typeof given.unsafe !== 'function' || typeof given.reserve !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${where}(sql) needs a postgres.js instance: import postgres from 'postgres'; const sql = postgres(url). (For a pg Pool, give the store { pool } without it.)`,
    )
  }
}
