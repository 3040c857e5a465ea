import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import { PostgresStore } from './postgres-store.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)

/** A store on its own table, on a pool of several connections (so races are real), dropped after. */
function tableStore(table: string) {
  const pool = new pg.Pool({ connectionString: URL, max: 6 })
  return {
    create: async () => {
      const store = new PostgresStore({ pool, table })
      await store.migrate()
      return store
    },
    teardown: async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`)
      await pool.end()
    },
  }
}

const contract = tableStore(`idemkey_contract_${suffix}`)
describeStore('postgres', contract.create, { skip, teardown: contract.teardown })

const model = tableStore(`idemkey_model_${suffix}`)
describeStoreModel('postgres', model.create, { skip, numRuns: 1_000, teardown: model.teardown })

const url = tableStore(`idemkey_url_${suffix}`)
describeStore(
  'postgres (connection string, no notifications, no prepared statements)',
  async () => {
    const store = new PostgresStore({
      connectionString: URL,
      table: `idemkey_url_${suffix}`,
      notifications: false,
      preparedStatements: false,
      max: 4,
    })
    await store.migrate()
    return store
  },
  { skip, teardown: url.teardown },
)
