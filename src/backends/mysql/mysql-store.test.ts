import mysql from 'mysql2/promise'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import { MySqlStore } from './mysql-store.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
const suffix = `${process.pid}_${Date.now().toString(36)}`

/** A store on its own table, on a pool of several connections (so races are real), dropped after. */
function tableStore(table: string) {
  const pool = mysql.createPool({ uri: URI, connectionLimit: 8 })
  return {
    create: async () => {
      const store = new MySqlStore({ pool, table })
      await store.migrate()
      return store
    },
    teardown: async () => {
      await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
      await pool.end()
    },
  }
}

const contract = tableStore(`idemkey_contract_${suffix}`)
describeStore('mysql', contract.create, { skip, teardown: contract.teardown })

const model = tableStore(`idemkey_model_${suffix}`)
describeStoreModel('mysql', model.create, { skip, numRuns: 1_000, teardown: model.teardown })
