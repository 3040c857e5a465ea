import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { PostgresStore } from '../src/stores/postgres/index.js'
import { describeLedgerProcesses } from './helpers/ledger-processes.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const table = `idemkey_crash_${randomUUID().slice(0, 8)}`

describe.skipIf(skip !== undefined)('PostgresStore across crashing processes', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 2 })
  const store = new PostgresStore({ pool, table })
  beforeAll(() => store.migrate())
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`)
    await pool.end()
  })
  describeLedgerProcesses({ url: () => `${URL}?table=${table}`, store: () => store })
})
