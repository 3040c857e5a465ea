/**
 * MySqlStore (MariaDB here): a record whose row an open transaction holds (test/helpers/held-rows.ts).
 * A takeover asks first with a locking read that does not wait (`FOR UPDATE NOWAIT`, statements.ts);
 * InnoDB would otherwise make the upsert wait up to `innodb_lock_wait_timeout` (50 s by default).
 */
import mysql from 'mysql2/promise'
import { describeHeldRows, HELD_ROWS_QUERY_TIMEOUT_MS } from '../../../test/helpers/held-rows.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { MySqlStore } from './mysql-store.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
if (skip) console.warn(`\n!!! SKIPPED: MySqlStore row locks: ${skip}\n`)
const table = `idemkey_rowlock_${process.pid}_${Date.now().toString(36)}`

describe.skipIf(skip !== undefined)('MySqlStore: a record whose row an open transaction holds', () => {
  const pool = mysql.createPool({ uri: URI, connectionLimit: 8 })
  const store = new MySqlStore({ pool, table, queryTimeout: HELD_ROWS_QUERY_TIMEOUT_MS })

  beforeAll(async () => {
    await store.migrate()
  })
  afterAll(async () => {
    await store.close()
    await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
    await pool.end()
  })

  describeHeldRows(() => store)
})
