/**
 * `PostgresStore({ isolationLevel })` is the isolation of `ledger.runInTransaction` (docs/postgres.md),
 * with the `transactions` option too: the tool's transaction runs at that level, so business writes a
 * user asked to run serializable are not silently run at the tool's default (read committed).
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { PRISMA_TABLES } from './helpers/orm-prisma.js'
import { PG_URL, type ToolName, toolHarness } from './helpers/orm-tools.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = await serviceSkipReason('PostgreSQL', 5432)
const tools: ToolName[] = ['drizzle', 'kysely', 'knex', 'typeorm', 'sequelize', 'postgres.js', 'mikro-orm', 'prisma']

describe.skipIf(skip !== undefined).each(tools)('%s on PostgreSQL with the store isolationLevel', (tool) => {
  const suffix = randomUUID().slice(0, 8)
  const table = `idemkey_orm_iso_${suffix}`
  const tables =
    tool === 'prisma' ? PRISMA_TABLES : { orders: `idemkey_orm_iso_orders_${suffix}`, accounts: `idemkey_orm_iso_accounts_${suffix}` }
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 })
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`)
    await pool.end()
  })

  it.each(['serializable', 'repeatable read'] as const)("runs the work in the tool's transaction at %s", async (isolationLevel) => {
    const harness = await toolHarness(tool, 'postgres', tables, 2)
    const store = new PostgresStore({ pool, table, isolationLevel, transactions: harness.transactions })
    try {
      await store.migrate()
      const { transactions } = harness
      const result = await new Ledger({ store }).runInTransaction({ key: `k-${randomUUID()}`, payload: 1 }, async ({ tx }) => {
        const probe = "SELECT 1 AS one WHERE current_setting('transaction_isolation') = $1"
        return (await transactions.execute(tx, probe, [isolationLevel])).count
      })
      expect(result).toMatchObject({ kind: 'executed', outcome: 'completed', value: 1 })
    } finally {
      await store.close()
      await harness.close()
    }
  })
})
