/**
 * The store contract, model and connection-string suites of PostgresStore for one layout. Each layout has
 * its own test file (src/backends/postgres/postgres-store*.test.ts), so vitest runs the two side by side.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import type { PostgresStoreCommonOptions } from '../../src/backends/postgres/options.js'
import { PostgresStore } from '../../src/backends/postgres/postgres-store.js'
import { describeStore, describeStoreModel } from '../../src/testing/index.js'
import { serviceSkipReason } from './services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'

type Layout = Pick<PostgresStoreCommonOptions, 'layout' | 'partitionInterval'>

/** A store on its own table, on a pool of several connections (so races are real), dropped after. */
function tableStore(table: string, layout: Layout) {
  const pool = new pg.Pool({ connectionString: URL, max: 6 })
  return {
    create: async () => {
      const store = new PostgresStore({ pool, table, ...layout })
      await store.migrate()
      return store
    },
    teardown: async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`)
      await pool.end()
    },
  }
}

export async function describePostgresLayout(name: string, options: Layout, prefix: string): Promise<void> {
  const skip = await serviceSkipReason('PostgreSQL', 5432)
  const suffix = randomUUID().slice(0, 8)
  const contract = tableStore(`${prefix}_contract_${suffix}`, options)
  describeStore(name, contract.create, { skip, teardown: contract.teardown })

  const model = tableStore(`${prefix}_model_${suffix}`, options)
  describeStoreModel(name, model.create, { skip, numRuns: 1_000, teardown: model.teardown })

  const url = tableStore(`${prefix}_url_${suffix}`, options)
  describeStore(
    `${name} (connection string, no notifications, no prepared statements)`,
    async () => {
      const store = new PostgresStore({
        connectionString: URL,
        table: `${prefix}_url_${suffix}`,
        notifications: false,
        preparedStatements: false,
        max: 4,
        ...options,
      })
      await store.migrate()
      return store
    },
    { skip, teardown: url.teardown },
  )
}
