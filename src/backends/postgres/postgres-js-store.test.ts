/**
 * PostgresStore on postgres.js (`postgresJsPool(sql)`, idemkey/postgres-js) instead of node-postgres: the
 * whole store contract and the model, notifications through `sql.listen`, and a transaction of the
 * store itself through `sql.begin` (postgresJsTransactions). Tool-level guarantees: test/orm-postgres-js.test.ts.
 */
import { randomUUID } from 'node:crypto'
import postgres from 'postgres'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { postgresJsPool, postgresJsTransactions } from '../../orm/postgres-js/index.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import { PostgresStore } from './index.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)

function tableStore(table: string) {
  const sql = postgres(URL, { max: 6, onnotice: () => {} })
  return {
    create: async () => {
      const store = new PostgresStore({ pool: postgresJsPool(sql), table, transactions: postgresJsTransactions(sql) })
      await store.migrate()
      return store
    },
    teardown: async () => {
      await sql.unsafe(`DROP TABLE IF EXISTS "${table}"`)
      await sql.end({ timeout: 5 })
    },
  }
}

const contract = tableStore(`idemkey_pgjs_contract_${suffix}`)
describeStore('postgres on postgres.js', contract.create, { skip, teardown: contract.teardown })

const model = tableStore(`idemkey_pgjs_model_${suffix}`)
describeStoreModel('postgres on postgres.js', model.create, { skip, numRuns: 500, teardown: model.teardown })

describe.skipIf(skip !== undefined)('PostgresStore on postgres.js', () => {
  it('wakes a watcher through sql.listen when the holder completes (watch fires on notifications only)', async () => {
    const sql = postgres(URL, { max: 4, onnotice: () => {} })
    const table = `idemkey_pgjs_listen_${suffix}`
    const store = new PostgresStore({ pool: postgresJsPool(sql), table })
    try {
      await store.migrate()
      expect(await store.listening()).toBe(true)
      const acquired = await store.acquire('default', 'k', 'f'.repeat(64), 30_000)
      expect(acquired.kind).toBe('acquired')
      const woken = new Promise<void>((resolve) => {
        const stop = store.watch?.('default', 'k', () => {
          stop?.()
          resolve()
        })
      })
      await new Promise((resolve) => setTimeout(resolve, 100))
      const body = new Uint8Array([1, 2, 3])
      const token = acquired.kind === 'acquired' ? acquired.token : 0
      expect(
        await store.complete(
          'default',
          'k',
          token,
          { status: 'completed', response: { status: 200, headers: {}, body }, resourceId: null },
          60_000,
        ),
      ).toBe(true)
      await woken
      expect(await store.get('default', 'k')).toMatchObject({ status: 'completed', token })
    } finally {
      await store.close()
      await sql.unsafe(`DROP TABLE IF EXISTS "${table}"`)
      await sql.end({ timeout: 5 })
    }
  })
})
