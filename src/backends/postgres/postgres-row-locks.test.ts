/**
 * PostgresStore, both layouts: a record whose row an open transaction holds (test/helpers/held-rows.ts).
 * The acquire statement bounds its own lock waits (100 ms) and answers `in_progress` (statements.ts).
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { describeHeldRows, HELD_ROWS_QUERY_TIMEOUT_MS } from '../../../test/helpers/held-rows.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { PostgresStore } from './postgres-store.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)

describe.skipIf(skip !== undefined)('PostgresStore: a record whose row an open transaction holds', () => {
  for (const layout of ['plain', 'partitioned'] as const) {
    describe(`${layout} layout`, () => {
      const pool = new pg.Pool({ connectionString: URL, max: 8 })
      const table = `idemkey_rowlock_${layout.slice(0, 4)}_${suffix}`
      const store = new PostgresStore<pg.PoolClient>({ pool, table, layout, queryTimeout: HELD_ROWS_QUERY_TIMEOUT_MS })

      beforeAll(async () => {
        await store.migrate()
      })
      afterAll(async () => {
        await store.close()
        await pool.query(`DROP TABLE IF EXISTS "${table}" CASCADE`)
        await pool.end()
      })

      describeHeldRows(() => store)
    })
  }
})
