/**
 * The HTTP adapters' transactional mode through a data-layer tool (docs/orm.md, "In the HTTP adapters"):
 * an Express handler writes with Drizzle's own `tx` from the idemkey context, and the response is sent
 * only after the tool's transaction committed the row with the record.
 */
import { randomUUID } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import { drizzle } from 'drizzle-orm/node-postgres'
import { pgTable, serial, text } from 'drizzle-orm/pg-core'
import express from 'express'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotency } from '../src/http/express/index.js'
import { type DrizzleTransactionOf, drizzleTransactions } from '../src/orm/drizzle/index.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)
const table = `idemkey_orm_http_${suffix}`
const ordersName = `idemkey_orm_http_orders_${suffix}`

describe.skipIf(skip !== undefined)("Express with transactional: true, writing through Drizzle's own transaction", () => {
  const pool = new pg.Pool({ connectionString: URL, max: 6 })
  const db = drizzle(pool)
  const orders = pgTable(ordersName, { id: serial('id').primaryKey(), sku: text('sku').notNull() })
  const store = new PostgresStore({ pool, table, transactions: drizzleTransactions(db) })
  let base = ''
  let close = () => {}

  beforeAll(async () => {
    await store.migrate()
    await pool.query(`CREATE TABLE "${ordersName}" (id serial PRIMARY KEY, sku text NOT NULL)`)
    const app = express()
    app.post('/orders', express.json(), idempotency({ ledger: new Ledger({ store }), transactional: true }), async (req, res, next) => {
      try {
        const tx = req.idempotency?.tx as DrizzleTransactionOf<typeof db>
        const { sku } = req.body as { sku: string }
        const [row] = await tx.insert(orders).values({ sku }).returning({ id: orders.id })
        if (sku === 'fails') {
          res.status(503).json({ error: 'try again' })
          return
        }
        res.status(201).json({ id: row?.id })
      } catch (error) {
        next(error)
      }
    })
    const server = app.listen(0, '127.0.0.1')
    await new Promise((resolve) => server.once('listening', resolve))
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    close = () => server.close()
  })
  afterAll(async () => {
    close()
    await store.close()
    await pool.query(`DROP TABLE IF EXISTS "${table}", "${ordersName}"`)
    await pool.end()
  })

  const post = (key: string, sku: string) =>
    fetch(`${base}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ sku }),
    })
  const count = async (sku: string) =>
    (await pool.query(`SELECT count(*)::int AS n FROM "${ordersName}" WHERE sku = $1`, [sku])).rows[0].n as number

  it('commits the Drizzle insert with the record: concurrent duplicates insert one row, and every answer is the first one', async () => {
    const key = randomUUID()
    const sku = `sku-${randomUUID()}`
    const responses = await Promise.all(Array.from({ length: 5 }, () => post(key, sku)))
    const bodies = await Promise.all(responses.map((r) => r.text()))
    const created = responses.filter((r) => r.status === 201)
    expect(created.length).toBeGreaterThanOrEqual(1)
    // Duplicates still in flight get 409; every 201 carries the first execution's body, byte for byte.
    expect(new Set(bodies.filter((_, i) => responses[i]?.status === 201)).size).toBe(1)
    expect(await count(sku)).toBe(1)
    const replay = await post(key, sku)
    expect(replay.status).toBe(201)
    expect(await replay.text()).toBe(bodies[responses.findIndex((r) => r.status === 201)])
    expect(await count(sku)).toBe(1)
  })

  it('rolls the Drizzle insert back when the handler answers a transient 5xx (nothing of it is kept)', async () => {
    const key = randomUUID()
    expect((await post(key, 'fails')).status).toBe(503)
    expect(await count('fails')).toBe(0)
  })
})
