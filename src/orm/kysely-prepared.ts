/**
 * Named prepared statements on Kysely's own PostgreSQL driver, for the adapters whose transaction is a
 * Kysely transaction: Kysely itself, and MikroORM 7 (which runs on Kysely). Kept free of a `kysely`
 * import, so that MikroORM users need not install Kysely beside it.
 */
import { preparedName } from '../backends/sql/prepared-names.js'
import type { SqlValue } from '../core/sql-transactions.js'

/** The part of a Kysely `Transaction` (or `ControlledTransaction`) this uses; `getExecutor` is Kysely-internal. */
export interface KyselyTransactionLike {
  getExecutor?: () => { provideConnection<T>(consumer: (connection: unknown) => Promise<T>): Promise<T> }
}

/** What Kysely's PostgresConnection answers. */
export interface KyselyQueryResult {
  rows: unknown[]
  numAffectedRows?: bigint
}

/** A pg query config, passed where Kysely's pg connection passes its SQL text on to `client.query`. */
interface NamedQuery {
  name: string
  text: string
  toString(): string
}

/**
 * On Kysely's own PostgreSQL driver, sends the statement (with `$n` placeholders) to the transaction's
 * connection as a named prepared statement: that connection hands its SQL straight to node-postgres's
 * `client.query`, which takes a `{ name, text }` config in place of the text. Parsing and planning the
 * store's statements on every transaction costs more than running them. Any other driver (or a Kysely
 * that stops passing the text through unchanged, which the prepared-statement tests of
 * test/orm-kysely.test.ts and test/orm-mikro-orm.test.ts would show) gets `undefined`, and the caller
 * runs the plain statement.
 */
export async function preparedOnKyselyPg(
  trx: KyselyTransactionLike,
  tool: string,
  sql: string,
  values: readonly SqlValue[],
): Promise<KyselyQueryResult | undefined> {
  const executor = trx.getExecutor?.()
  if (!executor) return undefined
  return executor.provideConnection(async (connection) => {
    if ((connection as object | null)?.constructor?.name !== 'PostgresConnection') return undefined
    const named: NamedQuery = { name: preparedName(tool, sql), text: sql, toString: () => sql }
    // The shape of Kysely's CompiledQuery; PostgresConnection reads `sql` and `parameters`.
    const query = {
      sql: named,
      parameters: [...values],
      query: { kind: 'RawNode', sqlFragments: [sql], parameters: [] },
      queryId: { queryId: tool },
    }
    return (connection as { executeQuery(query: unknown): Promise<KyselyQueryResult> }).executeQuery(query)
  })
}
