import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import type { PostgresStoreCommonOptions } from './options.js'
import { PostgresStore } from './postgres-store.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)

/**
 * Each suite runs on both layouts. The partitioned one gets 2 s partitions, so a run crosses many
 * partition boundaries and outruns the partitions `migrate()` made ahead: inserts then create theirs.
 */
const LAYOUTS: Array<{ name: string; options: Pick<PostgresStoreCommonOptions, 'layout' | 'partitionInterval'>; prefix: string }> = [
  { name: 'postgres', options: {}, prefix: 'idemkey' },
  { name: 'postgres (partitioned, 2 s partitions)', options: { layout: 'partitioned', partitionInterval: '2s' }, prefix: 'h3_part' },
]

/** A store on its own table, on a pool of several connections (so races are real), dropped after. */
function tableStore(table: string, layout: Pick<PostgresStoreCommonOptions, 'layout' | 'partitionInterval'>) {
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

for (const { name, options, prefix } of LAYOUTS) {
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
