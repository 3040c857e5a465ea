/**
 * Type-level tests, checked by `tsc` (npm run typecheck): an adapter for a tool idemkey does not ship is
 * written against the `SqlTransactions` type from `idemkey` (docs/orm.md, "Another tool"), and the stores
 * take it, handing the work that tool's own transaction type. Nothing here runs.
 */
import { expectTypeOf } from 'vitest'
import { MySqlStore } from '../src/backends/mysql/index.js'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger, type SqlExecuteOptions, type SqlOutcome, type SqlTransactions, type SqlValue } from '../src/index.js'

/** A made-up tool: its transaction runs raw SQL with `$n` placeholders. */
interface MyToolTx {
  raw(sql: string, values: readonly SqlValue[]): Promise<{ rows: unknown[] }>
}
declare const myTool: { transaction<R>(fn: (tx: MyToolTx) => Promise<R>): Promise<R> }

const myToolTransactions: SqlTransactions<MyToolTx> = {
  tool: 'my-tool',
  dialect: 'postgres',
  transaction: (fn) => myTool.transaction(fn),
  async execute(tx, sql, values, options?: SqlExecuteOptions): Promise<SqlOutcome> {
    expectTypeOf(options?.prepare).toEqualTypeOf<boolean | undefined>()
    return { count: (await tx.raw(sql, values)).rows.length }
  },
}

const store = new PostgresStore({ connectionString: 'postgres://localhost/app', transactions: myToolTransactions })
void new Ledger({ store }).runInTransaction({ key: 'k', payload: 1 }, async ({ tx }) => {
  expectTypeOf(tx).toEqualTypeOf<MyToolTx>()
  return 'done'
})

// The same adapter on MySQL declares its dialect.
const onMySql: SqlTransactions<MyToolTx> = { ...myToolTransactions, dialect: 'mysql' }
void new MySqlStore({ uri: 'mysql://localhost/app', transactions: onMySql })
