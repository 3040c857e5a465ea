import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { describeLedgerProcesses } from './helpers/ledger-processes.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)

/** Both layouts; the partitioned one with 1 s partitions, so the workers' records straddle boundaries. */
const LAYOUTS = [
  { name: 'plain', table: `idemkey_crash_${randomUUID().slice(0, 8)}`, query: '', options: {} },
  {
    name: 'partitioned',
    table: `h3_crash_${randomUUID().slice(0, 8)}`,
    query: '&layout=partitioned&partitionInterval=1s',
    options: { layout: 'partitioned', partitionInterval: '1s' } as const,
  },
]

for (const { name, table, query, options } of LAYOUTS) {
  describe.skipIf(skip !== undefined)(`PostgresStore (${name}) across crashing processes`, () => {
    const pool = new pg.Pool({ connectionString: URL, max: 2 })
    const store = new PostgresStore({ pool, table, ...options })
    beforeAll(() => store.migrate())
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`)
      await pool.end()
    })
    describeLedgerProcesses({ url: () => `${URL}?table=${table}${query}`, store: () => store })
  })
}
