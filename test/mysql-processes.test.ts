import mysql from 'mysql2/promise'
import { MySqlStore } from '../src/backends/mysql/index.js'
import { describeLedgerProcesses } from './helpers/ledger-processes.js'
import { serviceSkipReason } from './helpers/services.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
const table = `idemkey_procs_${process.pid}_${Date.now().toString(36)}`

describe.skipIf(skip !== undefined)('MySqlStore across processes', () => {
  const pool = mysql.createPool({ uri: URI, connectionLimit: 2 })
  const store = new MySqlStore({ pool, table })
  beforeAll(() => store.migrate())
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
    await pool.end()
  })
  describeLedgerProcesses({ url: () => `${URI}?table=${table}`, store: () => store, race: { processes: 4, keys: 300 } })
})
