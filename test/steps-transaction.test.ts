import { randomUUID } from 'node:crypto'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { MySqlStore } from '../src/backends/mysql/mysql-store.js'
import { PostgresStore } from '../src/backends/postgres/postgres-store.js'
import { Ledger } from '../src/core/ledger.js'
import type { TransactionalStore } from '../src/core/store.js'
import { serviceSkipReason } from './helpers/services.js'

const PG_URL = 'postgres://root@127.0.0.1:5432/test'
const MYSQL_URI = 'mysql://root@127.0.0.1:3306/test'

interface Target {
  name: string
  skip: () => Promise<string | undefined>
  open: (table: string) => Promise<TransactionalStore<unknown>>
  drop: (table: string) => Promise<void>
}

const targets: Target[] = [
  {
    name: 'PostgreSQL',
    skip: () => serviceSkipReason('PostgreSQL', 5432),
    open: async (table) => {
      const store = new PostgresStore({ connectionString: PG_URL, table })
      await store.migrate()
      return store as unknown as TransactionalStore<unknown>
    },
    drop: async (table) => {
      const pool = new pg.Pool({ connectionString: PG_URL })
      await pool.query(`DROP TABLE IF EXISTS "${table}"`)
      await pool.end()
    },
  },
  {
    name: 'MySQL (MariaDB)',
    skip: () => serviceSkipReason('MariaDB', 3306),
    open: async (table) => {
      const store = new MySqlStore({ uri: MYSQL_URI, table })
      await store.migrate()
      return store as unknown as TransactionalStore<unknown>
    },
    drop: async (table) => {
      const pool = mysql.createPool({ uri: MYSQL_URI })
      await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
      await pool.end()
    },
  },
]

for (const { name, skip, open, drop } of targets) {
  const reason = await skip()
  describe.skipIf(reason !== undefined)(`steps in runInTransaction: ${name}`, () => {
    const table = `idemkey_steps_tx_${randomUUID().slice(0, 8)}`
    let store: TransactionalStore<unknown>
    beforeAll(async () => {
      store = await open(table)
    })
    afterAll(async () => {
      await store?.close()
      await drop(table)
    })

    it('rolls a step back with the transaction: the retry runs it again; outside a transaction it stays recorded', async () => {
      const ledger = new Ledger({ store })
      const scope = randomUUID()
      let runs = 0
      const work = async (ctx: { step: (name: string, fn: () => number) => Promise<number> }) => {
        await ctx.step('reserve', () => ++runs)
        throw new Error('the business write failed')
      }
      await expect(ledger.runInTransaction({ scope, key: 'tx', payload: 1 }, work)).rejects.toThrow('the business write failed')
      await expect(ledger.runInTransaction({ scope, key: 'tx', payload: 1 }, work)).rejects.toThrow('the business write failed')
      expect(runs).toBe(2)
      runs = 0
      await expect(ledger.run({ scope, key: 'plain', payload: 1 }, work)).rejects.toThrow('the business write failed')
      await expect(ledger.run({ scope, key: 'plain', payload: 1 }, work)).rejects.toThrow('the business write failed')
      expect(runs).toBe(1)
    })

    it('keeps a transaction that recorded a step, and outlives its lease, from stalling on its own renewal', async () => {
      // Lease 300 ms: renewals every 100 ms. The step's write locks the record's row until commit; a renewal
      // on another connection would wait for that lock, and the commit would wait for the renewal.
      const ledger = new Ledger({ store, lease: 300 })
      const started = Date.now()
      const result = await ledger.runInTransaction({ scope: randomUUID(), key: 'long', payload: 1 }, async (ctx) => {
        await ctx.step('reserve', () => 1)
        await new Promise((resolve) => setTimeout(resolve, 1_000))
        return await ctx.step('charge', () => 'ch_1')
      })
      expect(result).toMatchObject({ kind: 'executed', outcome: 'completed', value: 'ch_1' })
      expect(Date.now() - started).toBeLessThan(3_000)
    })
  })
}
