/**
 * What idemkey promises on Bun and Deno, run on them against the built package (dist/) and the real
 * servers: the ledger, the store contract on every store whose driver runs there (memory, SQLite on
 * the runtime's node:sqlite, PostgreSQL, MySQL/MariaDB, Redis), the fetch and Hono adapters, and
 * idempotentFetch against the runtime's own HTTP server.
 *
 * `bun test ./test/runtimes/portable.runtime.mjs` (describe/it are Bun's globals), or
 * `deno test -A test/runtimes/portable.runtime.mjs` (idemkey/testing falls back to node:test). Run both
 * with `npm run test:runtimes`. A server that is down skips its suite loudly; under CI=true it fails.
 */

import { mkdtempSync, rmSync } from 'node:fs'
import { createConnection } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Hono } from 'hono'
import { Redis } from 'ioredis'
import { createPool } from 'mysql2/promise'
import pg from 'pg'
import { MemoryStore } from '../../dist/backends/memory/index.js'
import { MySqlStore } from '../../dist/backends/mysql/index.js'
import { PostgresStore } from '../../dist/backends/postgres/index.js'
import { RedisStore } from '../../dist/backends/redis/index.js'
import { SqliteStore } from '../../dist/backends/sqlite/index.js'
import { idempotentFetch } from '../../dist/client/index.js'
import { withIdempotency } from '../../dist/http/fetch/index.js'
import { idempotency } from '../../dist/http/hono/index.js'
import { Ledger } from '../../dist/index.js'
import { describeStore, resolveHarness } from '../../dist/testing/index.js'

const runtime = globalThis.Bun
  ? `Bun ${globalThis.Bun.version}`
  : globalThis.Deno
    ? `Deno ${globalThis.Deno.version.deno}`
    : `Node.js ${process.version}`
const { describe, it, afterAll } = resolveHarness()
const suffix = Math.random().toString(36).slice(2, 10)
const dir = mkdtempSync(join(tmpdir(), 'idemkey-runtime-'))

function assert(condition, message) {
  if (!condition) throw new Error(`${runtime}: ${message}`)
}

/** undefined when the server answers; else why not (and under CI=true, a thrown error: never a silent green). */
async function skipReason(name, port) {
  const up = await new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port })
    socket.setTimeout(1_000, () => {
      socket.destroy()
      resolve(false)
    })
    socket.once('connect', () => {
      socket.end()
      resolve(true)
    })
    socket.once('error', () => resolve(false))
  })
  if (up) return undefined
  const reason = `${name} is not running on 127.0.0.1:${port}`
  if (process.env.CI === 'true') throw new Error(`${reason}, and CI requires it`)
  return reason
}

const [pgSkip, mysqlSkip, redisSkip] = await Promise.all([
  skipReason('PostgreSQL', 5432),
  skipReason('MariaDB', 3306),
  skipReason('Redis', 6379),
])

describeStore(`memory on ${runtime}`, ({ clock }) => new MemoryStore({ clock }))
describeStore(
  `sqlite on ${runtime} (its node:sqlite)`,
  ({ clock }) => new SqliteStore({ path: join(dir, `contract-${suffix}.db`), clock }),
  {
    teardown: () => rmSync(dir, { recursive: true, force: true }),
  },
)

const pgPool = pgSkip ? undefined : new pg.Pool({ connectionString: 'postgres://root@127.0.0.1:5432/test', max: 4 })
describeStore(
  `postgres on ${runtime}`,
  async () => {
    const store = new PostgresStore({ pool: pgPool, table: `idemkey_runtime_${suffix}` })
    await store.migrate()
    return store
  },
  {
    skip: pgSkip,
    teardown: async () => {
      await pgPool.query(`DROP TABLE IF EXISTS "idemkey_runtime_${suffix}"`)
      await pgPool.end()
    },
  },
)

const mysqlPool = mysqlSkip ? undefined : createPool({ uri: 'mysql://root@127.0.0.1:3306/test', connectionLimit: 4 })
describeStore(
  `mysql on ${runtime}`,
  async () => {
    const store = new MySqlStore({ pool: mysqlPool, table: `idemkey_runtime_${suffix}` })
    await store.migrate()
    return store
  },
  {
    skip: mysqlSkip,
    teardown: async () => {
      await mysqlPool.query(`DROP TABLE IF EXISTS idemkey_runtime_${suffix}`)
      await mysqlPool.end()
    },
  },
)

const redisPrefix = `idemkey-runtime-${suffix}`
describeStore(`redis on ${runtime}`, () => new RedisStore({ url: 'redis://127.0.0.1:6379', prefix: redisPrefix }), {
  skip: redisSkip,
  teardown: async () => {
    const client = new Redis('redis://127.0.0.1:6379')
    const keys = await client.keys(`${redisPrefix}*`)
    if (keys.length > 0) await client.del(...keys)
    client.disconnect()
  },
})

/** Serves a fetch handler on the runtime's own server; returns its URL and how to stop it. */
function serve(handler) {
  if (globalThis.Bun) {
    const server = globalThis.Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: handler })
    return { url: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) }
  }
  if (globalThis.Deno) {
    const controller = new AbortController()
    const server = globalThis.Deno.serve({ port: 0, hostname: '127.0.0.1', signal: controller.signal, onListen() {} }, handler)
    const stop = () => {
      controller.abort()
      return server.finished
    }
    return { url: `http://127.0.0.1:${server.addr.port}`, stop }
  }
  throw new Error('serve() is for Bun and Deno; Node.js runs the vitest suites')
}

describe(`the ledger and the fetch adapters on ${runtime}`, () => {
  const stores = []
  afterAll(async () => {
    for (const store of stores) await store.close()
  })

  it('runs a function once per key on the embedded store, and replays its value after', async () => {
    const store = new SqliteStore({ path: ':memory:' })
    stores.push(store)
    assert(store.driver === 'node:sqlite', `driver is ${store.driver}`)
    const ledger = new Ledger({ store })
    let runs = 0
    const charge = () => ledger.run({ key: 'order-1', scope: 'billing', payload: { amount: 5 } }, async () => ({ charge: ++runs }))
    const first = await charge()
    const retry = await charge()
    assert(first.kind === 'executed' && retry.kind === 'replayed', `kinds ${first.kind}, ${retry.kind}`)
    assert(runs === 1 && retry.value.charge === 1, `ran ${runs} times`)
  })

  it('withIdempotency (idemkey/fetch) behind the runtime server: idempotentFetch retried with one key charges once', async () => {
    const store = new MemoryStore()
    stores.push(store)
    const ledger = new Ledger({ store })
    let charges = 0
    const server = serve(
      withIdempotency(ledger, async (request) => {
        const body = await request.json()
        charges++
        return Response.json({ charged: body.amount, n: charges }, { status: 201 })
      }),
    )
    try {
      const send = () =>
        idempotentFetch(`${server.url}/charges`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ amount: 500 }),
          idempotencyKey: `key-${suffix}`,
        })
      const first = await send()
      const second = await send()
      assert(first.status === 201 && second.status === 201, `statuses ${first.status}, ${second.status}`)
      assert(second.headers.get('idempotent-replayed') === 'true', 'the second answer is a replay')
      assert(JSON.stringify(await first.json()) === JSON.stringify(await second.json()), 'the replay is the same body')
      assert(charges === 1, `charged ${charges} times`)
    } finally {
      await server.stop()
    }
  })

  it('idempotency (idemkey/hono): the same key runs the route once; another body with it is refused with 422', async () => {
    const store = new MemoryStore()
    stores.push(store)
    const ledger = new Ledger({ store })
    let runs = 0
    const app = new Hono()
    app.post('/charges', idempotency({ ledger }), async (c) => c.json({ n: ++runs, amount: (await c.req.json()).amount }, 201))
    const post = (amount) =>
      app.fetch(
        new Request('http://localhost/charges', {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': `hono-${suffix}` },
          body: JSON.stringify({ amount }),
        }),
      )
    const first = await post(5)
    const again = await post(5)
    const other = await post(6)
    assert(first.status === 201 && again.status === 201, `statuses ${first.status}, ${again.status}`)
    assert(again.headers.get('idempotent-replayed') === 'true', 'the retry is a replay')
    assert(other.status === 422, `another body with the key: ${other.status}`)
    assert(runs === 1, `ran ${runs} times`)
  })
})
