/**
 * `preparedStatements: false` (docs/postgres.md: behind a pooler that cannot keep prepared statements,
 * and always on `layout: 'partitioned'`) holds through a data-layer tool too: the adapters that can
 * prepare the store's statements on the tool's connection (Knex, Kysely, MikroORM, postgres.js) send
 * them unnamed then, so none is left on the connection for a pooler to lose.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { PG_URL, type ToolName, toolHarness } from './helpers/orm-tools.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = await serviceSkipReason('PostgreSQL', 5432)
const tools: ToolName[] = ['knex', 'kysely', 'mikro-orm', 'postgres.js']

describe.skipIf(skip !== undefined).each(tools)('%s on PostgreSQL with preparedStatements: false', (tool) => {
  const suffix = randomUUID().slice(0, 8)
  const table = `idemkey_orm_unprep_${suffix}`
  const tables = { orders: `idemkey_orm_unprep_orders_${suffix}`, accounts: `idemkey_orm_unprep_accounts_${suffix}` }
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 })
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}", "${tables.orders}"`)
    await pool.end()
  })

  it("sends the store's statements unprepared through the tool: none is left on the tool's connection", async () => {
    // One connection in the tool's pool: the probe below runs where the completion ran.
    const harness = await toolHarness(tool, 'postgres', tables, 1)
    const store = new PostgresStore({ pool, table, preparedStatements: false, transactions: harness.transactions })
    try {
      await store.migrate()
      await pool.query(`CREATE TABLE "${tables.orders}" (intent text NOT NULL, who text NOT NULL)`)
      const key = `order-${randomUUID()}`
      const result = await new Ledger({ store }).runInTransaction({ key, payload: 1 }, async ({ tx }) => {
        await harness.insertOrder(tx, key, 'first')
        return 'placed'
      })
      expect(result).toMatchObject({ kind: 'executed', outcome: 'completed' })
      const { transactions } = harness
      // Statements of the store name its table; the probe's own text does not.
      const kept = await transactions.transaction((tx) =>
        transactions.execute(tx, 'SELECT name FROM pg_prepared_statements WHERE strpos(statement, $1) > 0', [table]),
      )
      expect(kept.count).toBe(0)
    } finally {
      await store.close()
      await harness.close()
    }
  })
})
