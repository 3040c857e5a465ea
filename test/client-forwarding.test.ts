import { randomUUID } from 'node:crypto'
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import express from 'express'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { createIdempotentFetch, deriveKey, forwardKey, idempotencyInfo } from '../src/client/index.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotency } from '../src/http/express/index.js'
import { PaymentsServer } from './client-server.js'

/**
 * Edge client → orders service (Express + idemkey/express) → payments service (a ledger). The orders
 * handler forwards the edge's key to payments with forwardKey, then fails once after the payment went
 * through (a transient 500, so its own record is released). The edge retries with its key, the handler
 * runs again, and payments must see the same derived key and replay instead of charging again.
 */
describe('forwarding the root key through a real Express service', () => {
  const payments = new PaymentsServer('ledger')
  let orders: Server
  let ordersUrl = ''
  const failOnce = new Set<string>()

  beforeAll(async () => {
    await payments.start()
    const pay = createIdempotentFetch({ sleep: async () => {} })
    const app = express()
    app.post('/orders', express.json(), idempotency({ ledger: new Ledger({ store: new MemoryStore(), wait: 0 }) }), async (req, res) => {
      const charged = await pay(`${payments.url}/charges`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ amount: (req.body as { amount: number }).amount }),
        idempotencyKey: forwardKey(req, 'charge'),
      })
      const root = String(req.headers['idempotency-key'])
      if (failOnce.delete(root)) {
        res.status(500).json({ error: 'lost our database connection after charging' })
        return
      }
      res.status(201).json({ order: root, payment: idempotencyInfo(charged) })
    })
    orders = app.listen(0, '127.0.0.1')
    await new Promise<void>((resolve) => orders.once('listening', () => resolve()))
    ordersUrl = `http://127.0.0.1:${(orders.address() as AddressInfo).port}/orders`
  })

  afterAll(async () => {
    orders.closeAllConnections()
    await new Promise<void>((resolve) => orders.close(() => resolve()))
    await payments.close()
  })

  it('lands the retry of the edge on the same downstream key, so payments charges once and replays', async () => {
    const root = `test-${randomUUID()}`
    failOnce.add(root)
    const edge = createIdempotentFetch({ sleep: async () => {} })
    const response = await edge(ordersUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amount: 1200 }),
      idempotencyKey: root,
    })
    expect(response.status).toBe(201)
    expect(idempotencyInfo(response)).toEqual({ key: root, attempts: 2, replayed: false })
    const downstream = deriveKey(root, 'charge')
    expect(await response.json()).toEqual({ order: root, payment: { key: downstream, attempts: 1, replayed: true } })
    expect(payments.count(downstream)).toBe(2)
    expect(payments.charges.get(downstream)).toBe(1)
  })

  it('gives different edge keys different downstream keys', async () => {
    const edge = createIdempotentFetch({ sleep: async () => {} })
    const send = () =>
      edge(ordersUrl, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ amount: 5 }) })
    const [a, b] = await Promise.all([send(), send()])
    const [pa, pb] = [(await a.json()).payment.key, (await b.json()).payment.key]
    expect(pa).not.toBe(pb)
    expect(pa).toBe(deriveKey(idempotencyInfo(a)?.key as string, 'charge'))
    expect(payments.charges.get(pa)).toBe(1)
    expect(payments.charges.get(pb)).toBe(1)
  })
})
