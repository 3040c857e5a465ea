import { randomUUID } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import express from 'express'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotency } from '../src/http/express/index.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)
const table = `idemkey_http_${suffix}`
const orders = `idemkey_http_orders_${suffix}`

describe.skipIf(skip !== undefined)('PostgresStore behind the Express adapter with transactional: true', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 6 })
  const store = new PostgresStore<pg.PoolClient>({ pool, table })
  let base = ''
  let close = () => {}
  let wrote = () => {}

  beforeAll(async () => {
    await store.migrate()
    await pool.query(`CREATE TABLE "${orders}" (id serial PRIMARY KEY, sku text NOT NULL)`)
    const app = express()
    const hung = new Set<string>()
    const handler: express.RequestHandler = async (req, res, next) => {
      try {
        const tx = req.idempotency?.tx as pg.PoolClient
        const { sku } = req.body as { sku: string }
        const { rows } = await tx.query(`INSERT INTO "${orders}" (sku) VALUES ($1) RETURNING id`, [sku])
        if (sku === 'fails') {
          res.status(503).json({ error: 'try again' })
          return
        }
        if (sku.startsWith('hangs') && !hung.has(sku)) {
          // The first attempt never answers (a stuck downstream call); its client gives up.
          hung.add(sku)
          wrote()
          return
        }
        if (sku.startsWith('out-of-stock')) {
          res.status(422).json({ error: 'out of stock' })
          return
        }
        res.status(201).json({ id: rows[0].id })
      } catch (error) {
        next(error)
      }
    }
    const ledger = new Ledger({ store })
    app.post('/orders', express.json(), idempotency({ ledger, transactional: true }), handler)
    // A route that keeps what its handler wrote on a decline (an audit row, say).
    // Released soon after its client went away with the response not ended (the abandon timeout).
    app.post('/hanging', express.json(), idempotency({ ledger, transactional: true, abandonAfterMs: 100 }), handler)
    app.post('/audited', express.json(), idempotency({ ledger, transactional: true, failedWrites: 'commit' }), handler)
    const server = app.listen(0, '127.0.0.1')
    await new Promise((resolve) => server.once('listening', resolve))
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    close = () => server.close()
  })
  afterAll(async () => {
    close()
    await store.close()
    await pool.query(`DROP TABLE IF EXISTS "${table}", "${orders}"`)
    await pool.end()
  })

  const post = (key: string, sku: string, path = '/orders', signal?: AbortSignal) =>
    fetch(`${base}${path}`, {
      signal,
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ sku }),
    })
  const count = async (sku: string) =>
    (await pool.query(`SELECT count(*)::int AS n FROM "${orders}" WHERE sku = $1`, [sku])).rows[0].n as number
  /**
   * The count once the handler's transaction has settled. The Express adapter sends the response as
   * the handler ends it and commits right after, so the client can see the 201 a moment before the
   * commit (reported to the HTTP layer's owner); this waits, bounded, for the count to reach `want`.
   */
  const settledCount = async (sku: string, want: number) => {
    for (let i = 0; i < 200 && (await count(sku)) < want; i++) await new Promise((resolve) => setTimeout(resolve, 10))
    return count(sku)
  }

  it('writes the order on ctx.tx once and replays the same response for the same key', async () => {
    const key = randomUUID()
    const sku = `sku-${key}`
    const first = await post(key, sku)
    expect(first.status).toBe(201)
    const body = await first.text()
    const again = await post(key, sku)
    expect(again.status).toBe(201)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(await again.text()).toBe(body)
    expect(await settledCount(sku, 1)).toBe(1)
  })

  it('rolls back the order of a transient (503) answer, so the retry writes it once', async () => {
    const key = randomUUID()
    expect((await post(key, 'fails')).status).toBe(503)
    // Released, not stored: the retry with the same key runs and commits its order.
    const retry = await post(key, `ok-${key}`)
    expect(retry.status).toBe(201)
    expect(retry.headers.get('idempotent-replayed')).toBeNull()
    expect(await settledCount(`ok-${key}`, 1)).toBe(1)
    // Counted only now: the 503 may reach the client before its transaction ends, but the record is
    // released only after the rollback, so once the retry took the key the failed order cannot land late.
    expect(await count('fails')).toBe(0)
  })

  it('rolls back the order of a final 422 answer and replays the 422, so the client told "rejected" gets no order', async () => {
    const key = randomUUID()
    const sku = `out-of-stock-${key}`
    const first = await post(key, sku)
    expect(first.status).toBe(422)
    const again = await post(key, sku)
    expect(again.status).toBe(422)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(await count(sku)).toBe(0)
  })

  it("with failedWrites: 'commit', the route keeps what its handler wrote before a final 422, once", async () => {
    const key = randomUUID()
    const sku = `out-of-stock-${key}`
    expect((await post(key, sku, '/audited')).status).toBe(422)
    expect((await post(key, sku, '/audited')).headers.get('idempotent-replayed')).toBe('true')
    expect(await settledCount(sku, 1)).toBe(1)
  })

  it('rolls back the order of a handler that never answered once its client left (abandonAfterMs), so the retry writes it once', async () => {
    const key = randomUUID()
    const sku = `hangs-${key}`
    const written = new Promise<void>((resolve) => {
      wrote = resolve
    })
    const client = new AbortController()
    const first = post(key, sku, '/hanging', client.signal).catch((error: unknown) => error)
    await written
    client.abort()
    expect(await first).toMatchObject({ name: 'AbortError' })
    // The retry waits for the abandoned attempt's release, then runs the handler again.
    const retry = await post(key, sku, '/hanging')
    expect(retry.status).toBe(201)
    expect(retry.headers.get('idempotent-replayed')).toBeNull()
    expect(await settledCount(sku, 1)).toBe(1)
    await new Promise((resolve) => setTimeout(resolve, 100))
    expect(await count(sku)).toBe(1)
  })
})
