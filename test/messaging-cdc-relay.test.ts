/**
 * The CDC relay (PgCdcRelay) proven as the polling relay is, on NATS, RabbitMQ and Redis Streams:
 * rolled-back transactions publish nothing; a relay SIGKILLed between the broker's confirm and the
 * slot's confirm loses nothing and the inbox absorbs the repeats; two relays on one slot never both
 * publish; PostgreSQL restarted under load loses nothing. Logical replication needs wal_level =
 * logical, so the file runs its own throwaway PostgreSQL (the shared server stays wal_level = replica).
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import pg from 'pg'
import { SqliteStore } from '../src/backends/sqlite/index.js'
import type { RunningConsumer } from '../src/messaging/consumer-options.js'
import { PgInbox } from '../src/messaging/inbox/index.js'
import {
  PgCdcRelay,
  type PgCdcRelayEvent,
  PgOutbox,
  type Publisher,
  ReplicationSlotInUseError,
  ReplicationSlotLagError,
} from '../src/messaging/outbox/index.js'
import { type OperatorSummary, operatorPage } from '../src/observability/index.js'
import {
  BROKER_PORTS,
  type BrokerName,
  type BrokerResource,
  createResource,
  openPublisher,
  startConsumer,
  topicFor,
} from './fixtures/messaging/brokers.js'
import { exited, Fleet } from './fixtures/messaging/fleet.js'
import { eventually, PG_URL } from './fixtures/messaging/pg.js'
import { canStartThrowaway, startThrowaway, type ThrowawayServer } from './fixtures/postgres/throwaway-server.js'
import { isCI, serviceSkipReason } from './helpers/services.js'
import { TcpFaultProxy } from './helpers/tcp-fault-proxy.js'

const noServer = canStartThrowaway() ? undefined : 'the PostgreSQL 15 binaries (initdb, pg_ctl) are not in /usr/lib/postgresql/15/bin'
if (noServer && isCI()) throw new Error(`CI=${process.env.CI} and ${noServer}`)
if (noServer) console.warn(`\n!!! SKIPPED: CDC relay tests: ${noServer}\n`)

let server: ThrowawayServer
beforeAll(async () => {
  if (noServer) return
  server = await startThrowaway({ settings: { wal_level: 'logical', max_replication_slots: 20, max_wal_senders: 20 } })
}, 60_000)
afterAll(async () => {
  await server?.destroy()
})

/** One test's outbox, orders, inbox and applied tables, a broker resource, a publisher and a consumer. */
async function setUp(broker: BrokerName) {
  const id = randomUUID().replaceAll('-', '').slice(0, 10)
  const pool = new pg.Pool({ connectionString: server.url, max: 8, connectionTimeoutMillis: 2_000 })
  pool.on('error', () => {})
  // A restart ends every connection: a checked-out client's query rejects, and the client also emits
  // 'error', which would be uncaught (PgInbox and order() hold clients with no listener of their own).
  pool.on('connect', (client) => client.on('error', () => {}))
  const t = { outbox: `cdc_${id}_outbox`, orders: `cdc_${id}_orders`, applied: `cdc_${id}_applied`, inbox: `cdc_${id}_inbox` }
  await pool.query(`CREATE TABLE ${t.orders} (id text PRIMARY KEY)`)
  await pool.query(`CREATE TABLE ${t.applied} (order_id text PRIMARY KEY, n integer NOT NULL)`)
  const outbox = new PgOutbox({ pool, table: t.outbox })
  await outbox.migrate()
  let duplicates = 0
  const inbox = new PgInbox({
    pool,
    consumer: 'cdc',
    table: t.inbox,
    onEvent: (event) => {
      if (event.type === 'duplicate') duplicates++
    },
  })
  await inbox.migrate()
  const resource: BrokerResource = await createResource(broker)
  const { publisher, close } = await openPublisher(broker)
  const slot = `cdc_${id}`
  const relays: PgCdcRelay[] = []
  const relay = (events: PgCdcRelayEvent[] = []) => {
    const r = new PgCdcRelay({
      connection: server.url,
      publisher,
      table: t.outbox,
      slot,
      batchSize: 8,
      standbyRetry: '200ms',
      backoffInitial: '50ms',
      onEvent: (event) => events.push(event),
    })
    relays.push(r)
    return r
  }
  await relay().setup()
  let consumer: RunningConsumer | undefined
  const count = async (sql: string) => Number((await pool.query<{ n: string }>(sql)).rows[0]?.n)
  return {
    slot,
    t,
    resource,
    relay,
    duplicates: () => duplicates,
    count,
    async consume() {
      consumer = await startConsumer(broker, resource.name, {
        inbox,
        async handler(tx, message) {
          const { orderId } = JSON.parse(Buffer.from(message.payload).toString('utf8')) as { orderId: string }
          await tx.query(
            `INSERT INTO ${t.applied} (order_id, n) VALUES ($1, 1) ON CONFLICT (order_id) DO UPDATE SET n = ${t.applied}.n + 1`,
            [orderId],
          )
        },
      })
    },
    /** One transaction: an order and its event, committed or rolled back. Throws while the server is down. */
    async order(orderId: string, commit = true) {
      const client = await pool.connect()
      try {
        await client.query('BEGIN')
        await client.query(`INSERT INTO ${t.orders} (id) VALUES ($1)`, [orderId])
        await outbox.add(client, { topic: topicFor(broker, resource.name), payload: { orderId }, partitionKey: `p${orderId.length % 3}` })
        await client.query(commit ? 'COMMIT' : 'ROLLBACK')
      } finally {
        client.release()
      }
    },
    /** Every committed order applied exactly once, and none that was not committed. */
    async expectExactlyOnce(what: string) {
      await eventually(
        async () => (await count(`SELECT count(*) AS n FROM ${t.applied}`)) === (await count(`SELECT count(*) AS n FROM ${t.orders}`)),
        `every committed order to be applied (${what})`,
        40_000,
      )
      expect(await count(`SELECT count(*) AS n FROM ${t.applied} WHERE n <> 1`)).toBe(0)
      expect(
        await count(`SELECT count(*) AS n FROM ${t.applied} a WHERE NOT EXISTS (SELECT 1 FROM ${t.orders} o WHERE o.id = a.order_id)`),
      ).toBe(0)
    },
    async teardown() {
      await consumer?.stop().catch(() => {})
      for (const r of relays) await r.stop().catch(() => {})
      await relays[0]?.drop().catch(() => {})
      await relays[0]?.stop().catch(() => {}) // closes the query connection drop() used
      await close().catch(() => {})
      await resource.teardown().catch(() => {})
      await pool.end().catch(() => {})
    },
  }
}

for (const broker of ['nats', 'rabbitmq', 'redis'] as const) {
  const brokerSkip = await serviceSkipReason(
    broker === 'nats' ? 'NATS' : broker === 'rabbitmq' ? 'RabbitMQ' : 'Redis',
    BROKER_PORTS[broker],
  )
  const skip = noServer ?? brokerSkip
  if (skip) console.warn(`Skipping the CDC relay tests through ${broker}: ${skip}`)

  describe.skipIf(skip !== undefined)(`CDC relay from PostgreSQL's logical replication to ${broker}`, () => {
    it('publishes committed events and nothing from rolled-back transactions', async () => {
      const s = await setUp(broker)
      try {
        await s.order('a1')
        await s.order('rolled-back-1', false)
        await s.order('a2')
        await s.order('rolled-back-2', false)
        const relay = s.relay()
        relay.start()
        await s.consume()
        // The last order committed after the rolled-back ones: once it is applied, they would have been too.
        await s.order('a3')
        await s.expectExactlyOnce('rolled back')
        expect(await s.count(`SELECT count(*) AS n FROM ${s.t.applied}`)).toBe(3)
        // Nothing was marked sent: the CDC relay never updates the outbox.
        expect(await s.count(`SELECT count(*) AS n FROM ${s.t.outbox} WHERE status <> 'pending'`)).toBe(0)
        expect(await relay.health()).toMatchObject({ exists: true, active: true, streaming: true, walStatus: 'reserved' })
        await relay.ready()
      } finally {
        await s.teardown()
      }
    }, 30_000)

    it('loses nothing when relays are SIGKILLed after the broker confirmed, and the inbox absorbs the repeats', async () => {
      const s = await setUp(broker)
      const fleet = new Fleet({
        ...process.env,
        CDC_PG_URL: server.url,
        CDC_TABLE: s.t.outbox,
        CDC_SLOT: s.slot,
        FAULT_BROKER: broker,
        CDC_KILL_AFTER_PUBLISHED: '1',
      })
      fleet.respawn = false
      try {
        await s.consume()
        let next = 0
        const produce = async (n: number) => {
          for (let i = 0; i < n; i++) await s.order(`k${next++}`)
        }
        await produce(20)
        // Each relay dies at its worst point: its first batch confirmed by the broker, the slot not moved.
        for (let round = 0; round < 2; round++) {
          const child = fleet.spawn('cdc-relay', 0)
          const producing = produce(10)
          // Worker env: kill after the first published batch.
          expect(await exited(child)).toBe('SIGKILL')
          await producing
        }
        const relay = s.relay()
        relay.start()
        await produce(10)
        await s.expectExactlyOnce(`after relays were killed. Worker errors:\n${fleet.errors()}`)
        expect(await s.count(`SELECT count(*) AS n FROM ${s.t.orders}`)).toBe(50)
        // NATS drops the republished copies itself (its duplicate window); elsewhere the inbox does.
        if (broker !== 'nats') await eventually(() => s.duplicates() > 0, 'the inbox to skip a republished copy', 20_000)
      } finally {
        await fleet.killAll()
        await s.teardown()
      }
    }, 60_000)

    it('lets one relay publish from a slot while a second stands by, and the second takes over when the first stops', async () => {
      const s = await setUp(broker)
      try {
        await s.consume()
        const firstEvents: PgCdcRelayEvent[] = []
        const secondEvents: PgCdcRelayEvent[] = []
        const first = s.relay(firstEvents)
        first.start()
        await eventually(() => firstEvents.some((e) => e.type === 'streaming'), 'the first relay to stream')
        const second = s.relay(secondEvents)
        second.start()
        await eventually(() => secondEvents.some((e) => e.type === 'standby'), 'the second relay to stand by')
        const standby = secondEvents.find((e) => e.type === 'standby')
        expect(standby?.type === 'standby' && standby.error).toBeInstanceOf(ReplicationSlotInUseError)
        expect(standby?.type === 'standby' && standby.error.code).toBe('IN_PROGRESS')
        for (let i = 0; i < 10; i++) await s.order(`first-${i}`)
        await s.expectExactlyOnce('through the first relay')
        expect(secondEvents.filter((e) => e.type === 'published')).toEqual([])

        await first.stop()
        await eventually(() => secondEvents.some((e) => e.type === 'streaming'), 'the second relay to take the slot')
        for (let i = 0; i < 10; i++) await s.order(`second-${i}`)
        await s.expectExactlyOnce('through the second relay')
        expect(secondEvents.some((e) => e.type === 'published')).toBe(true)
      } finally {
        await s.teardown()
      }
    }, 40_000)

    it('loses nothing when PostgreSQL restarts under load', async () => {
      const s = await setUp(broker)
      try {
        await s.consume()
        const events: PgCdcRelayEvent[] = []
        const relay = s.relay(events)
        relay.start()
        // Streaming before the restart, so that the restart cuts a live stream (on a loaded machine the
        // first connection can take longer than the producers' first 20 writes).
        const streaming = () => events.filter((e) => e.type === 'streaming').length
        await eventually(() => streaming() >= 1, 'the relay to stream')
        let stop = false
        let committedOrFailed = 0
        // Producers keep writing; a transaction cut by the restart either committed or not: the orders table is the truth.
        const producer = async (name: string) => {
          for (let i = 0; !stop; i++) {
            await s.order(`${name}-${i}`).catch(() => new Promise((resolve) => setTimeout(resolve, 50)))
            committedOrFailed++
          }
        }
        const producers = [producer('x'), producer('y')]
        await eventually(() => committedOrFailed >= 20, 'the producers to write')
        await server.stop('immediate')
        await server.start()
        const after = committedOrFailed
        await eventually(
          async () => committedOrFailed >= after + 20 && (await s.count(`SELECT count(*) AS n FROM ${s.t.orders}`)) > 40,
          'writes after the restart',
        )
        stop = true
        await Promise.all(producers)
        await s.expectExactlyOnce('after the restart')
        // The restart did cut the relay's stream, and it came back on its own.
        expect(streaming()).toBeGreaterThanOrEqual(2)
      } finally {
        await s.teardown()
      }
    }, 60_000)
  })
}

/** A pool on the throwaway server and a new outbox table in it (end the pool when done). */
async function freshOutbox(): Promise<{ pool: pg.Pool; table: string; outbox: PgOutbox }> {
  const pool = new pg.Pool({ connectionString: server.url, max: 2 })
  const table = `cdc_${randomUUID().replaceAll('-', '').slice(0, 10)}_outbox`
  const outbox = new PgOutbox({ pool, table })
  await outbox.migrate()
  return { pool, table, outbox }
}

/** Commits one outbox event in a transaction of its own; returns its message ID. */
async function addEvent(pool: pg.Pool, outbox: PgOutbox, payload: unknown): Promise<string> {
  const client = await pool.connect()
  try {
    await client.query('BEGIN')
    const { id } = await outbox.add(client, { topic: 't', payload })
    await client.query('COMMIT')
    return id
  } finally {
    client.release()
  }
}

/** A publisher that confirms every message at once and records the IDs it was given, in order. */
function memoryPublisher(): { publisher: Publisher; published: string[] } {
  const published: string[] = []
  const publisher: Publisher = {
    name: 'memory',
    publish: async (messages) => {
      published.push(...messages.map((m) => m.id))
      return messages.map(() => ({ ok: true as const }))
    },
  }
  return { publisher, published }
}

describe.skipIf(noServer !== undefined)('CDC relay with an in-memory publisher: slot health, order, failures', () => {
  it('reports the WAL a stopped relay leaves behind as lag, and ready() fails past maxLagBytes', async () => {
    const { pool, table, outbox } = await freshOutbox()
    const { publisher, published } = memoryPublisher()
    const relay = new PgCdcRelay({ connection: server.url, publisher, table, maxLagBytes: 1024 })
    try {
      await expect(relay.ready()).rejects.toBeInstanceOf(ReplicationSlotLagError)
      await relay.setup()
      await relay.setup() // idempotent
      await relay.ready()
      // Nobody streams: every event written now stays in the slot's WAL.
      for (let i = 0; i < 20; i++) await addEvent(pool, outbox, { i, pad: 'x'.repeat(200) })
      const lagging = await relay.health()
      expect(lagging).toMatchObject({ exists: true, active: false, streaming: false })
      expect(lagging.lagBytes).toBeGreaterThan(1024)
      await expect(relay.ready()).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE', health: { slot: relay.slot } })
      relay.start()
      await eventually(() => published.length === 20, 'the relay to publish the backlog')
      await eventually(async () => (await relay.health()).lagBytes <= 1024, 'the lag to drop once the broker confirmed')
      await relay.ready()
    } finally {
      await relay.stop()
      await relay.drop()
      await pool.end()
    }
  })

  it("shows a stopped relay's slot lag on the operator page, marked past maxLagBytes, and a slot never set up as missing", async () => {
    const { pool, table, outbox } = await freshOutbox()
    const { publisher } = memoryPublisher()
    const relay = new PgCdcRelay({ connection: server.url, publisher, table, maxLagBytes: 1024 })
    const neverSetUp = new PgCdcRelay({ connection: server.url, publisher, table, slot: `${relay.slot}_absent` })
    const store = new SqliteStore({ path: ':memory:' })
    const page = operatorPage({ store, relays: [relay, neverSetUp] })
    const http = createServer((req, res) => page.handler(req, res))
    await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
    try {
      await relay.setup()
      // Nobody streams: the events written now stay in the slot's WAL.
      for (let i = 0; i < 20; i++) await addEvent(pool, outbox, { i, pad: 'x'.repeat(200) })
      const response = await fetch(`http://127.0.0.1:${(http.address() as AddressInfo).port}/api/summary`)
      const { relays } = (await response.json()) as OperatorSummary
      expect(relays).toEqual([
        {
          slot: relay.slot,
          exists: true,
          active: false,
          lagBytes: expect.any(Number),
          maxLagBytes: 1024,
          walStatus: 'reserved',
          problem: 'lagging',
        },
        {
          slot: neverSetUp.slot,
          exists: false,
          active: false,
          lagBytes: 0,
          maxLagBytes: 268_435_456,
          walStatus: null,
          problem: 'missing',
        },
      ])
      expect(relays[0]?.lagBytes).toBeGreaterThan(1024)
    } finally {
      http.close()
      await store.close()
      await relay.drop()
      await relay.stop()
      await neverSetUp.stop()
      await pool.end()
    }
  })

  it('keeps partition order through a retried publish, and dead-letters a message the broker refuses for good', async () => {
    const { pool, table, outbox } = await freshOutbox()
    const confirmed: string[] = []
    const tries = new Map<string, number>()
    const publisher: Publisher = {
      name: 'memory',
      publish: async (messages) =>
        messages.map((m) => {
          const name = (JSON.parse(Buffer.from(m.payload).toString('utf8')) as { name: string }).name
          const n = (tries.get(name) ?? 0) + 1
          tries.set(name, n)
          if (name === 'a1' && n <= 2) return { ok: false as const, error: new Error('broker busy'), retryable: true }
          if (name === 'poison') return { ok: false as const, error: new Error('too large for the broker'), retryable: false }
          confirmed.push(name)
          return { ok: true as const }
        }),
    }
    const events: PgCdcRelayEvent[] = []
    const relay = new PgCdcRelay({ connection: server.url, publisher, table, backoffInitial: '10ms', onEvent: (e) => events.push(e) })
    try {
      await relay.setup()
      relay.start()
      const client = await pool.connect()
      await client.query('BEGIN')
      for (const [name, key] of [
        ['a0', 'a'],
        ['a1', 'a'],
        ['b0', 'b'],
        ['a2', 'a'],
        ['poison', 'c'],
        ['b1', 'b'],
        ['c1', 'c'],
        ['free', undefined],
      ] as const) {
        await outbox.add(client, { topic: 't', payload: { name }, partitionKey: key })
      }
      await client.query('COMMIT').finally(() => client.release())
      await eventually(() => confirmed.length === 7, `7 confirmed, got ${confirmed.join(',')}`)
      const order = (key: string) => confirmed.filter((name) => name.startsWith(key))
      expect(order('a')).toEqual(['a0', 'a1', 'a2'])
      expect(order('b')).toEqual(['b0', 'b1'])
      expect(order('c')).toEqual(['c1'])
      expect(tries.get('a1')).toBe(3)
      const failed = events.flatMap((e) => (e.type === 'failed' ? [{ dead: e.dead, attempts: e.message.attempts }] : []))
      expect(failed).toEqual(
        expect.arrayContaining([
          { dead: false, attempts: 1 },
          { dead: false, attempts: 2 },
          { dead: true, attempts: 1 },
        ]),
      )
      expect(await outbox.stats()).toEqual({ pending: 7, sent: 0, dead: 1 })
    } finally {
      await relay.stop()
      await relay.drop()
      await relay.stop()
      await pool.end()
    }
  })

  it('replaces a replication connection gone half-open after silentConnectionTimeout, and publishes what was written meanwhile', async () => {
    const SILENT_MS = 2_000
    const { pool, table, outbox } = await freshOutbox()
    const { publisher, published } = memoryPublisher()
    const add = (i: number) => addEvent(pool, outbox, { i })
    // Both of the relay's connections (replication and queries) go through the proxy, as both would
    // cross the same broken network.
    const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: server.port })
    const events: PgCdcRelayEvent[] = []
    const relay = new PgCdcRelay({
      connection: `postgres://postgres@127.0.0.1:${proxy.port}/postgres`,
      publisher,
      table,
      standbyRetry: '200ms',
      silentConnectionTimeout: SILENT_MS,
      onEvent: (e) => events.push(e),
    })
    const silentErrors = () =>
      events.filter((e) => e.type === 'error' && /replication connection answered nothing for 2s/.test(String((e.error as Error)?.message)))
    const streams = () => events.filter((e) => e.type === 'streaming').length
    try {
      await relay.setup()
      relay.start()
      await eventually(() => streams() === 1, 'the relay to stream')
      const first = await add(0)
      await eventually(() => published.includes(first), 'the first event to be published')

      // Half-open: the relay's packets go out, nothing comes back, nothing closes.
      proxy.blackhole()
      const blackholedAt = Date.now()
      // The watchdog looks once a second: it fires within SILENT_MS and a tick; the rest is margin for a loaded machine.
      await eventually(() => silentErrors().length > 0, 'the relay to report the silent connection', SILENT_MS + 1_000 + 5_000)
      expect(Date.now() - blackholedAt).toBeGreaterThanOrEqual(SILENT_MS)
      expect(proxy.counts().stalled).toBeGreaterThanOrEqual(1)
      const meanwhile: string[] = []
      for (let i = 1; i <= 5; i++) meanwhile.push(await add(i))

      // The network comes back for new connections; the stalled ones stay half-open for ever.
      proxy.heal({ stalled: 'hang' })
      await eventually(() => meanwhile.every((id) => published.includes(id)), 'the events written while blackholed to be published')
      expect(streams()).toBeGreaterThanOrEqual(2)
      // At least once: a replay may repeat an event, but none is missing and none is foreign.
      expect([...new Set(published)].sort()).toEqual([first, ...meanwhile].sort())
    } finally {
      await relay.stop()
      await proxy.close()
      const cleanup = new PgCdcRelay({ connection: server.url, publisher, table })
      await eventually(async () => (await cleanup.health()).active === false, 'the slot to be released')
      await cleanup.drop()
      await cleanup.stop()
      await pool.end()
    }
  }, 40_000)

  it('lets a script that calls setup(), health() and drop() (no start or stop) exit by itself: each closes the connection it opened (the script hung)', async () => {
    const { pool, table } = await freshOutbox()
    await pool.end()
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-cdc-script-'))
    const script = join(dir, 'setup-drop.mts')
    writeFileSync(
      script,
      `import { PgCdcRelay } from ${JSON.stringify(join(import.meta.dirname, '..', 'src/messaging/outbox/index.ts'))}
const relay = new PgCdcRelay({ connection: process.argv[2], table: process.argv[3], publisher: { name: 'none', publish: async () => [] } })
await relay.setup()
const health = await relay.health()
await relay.drop()
console.log(JSON.stringify({ exists: health.exists, after: (await relay.health()).exists }))
`,
    )
    const child = spawn(process.execPath, ['--import', 'tsx', script, server.url, table], { stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout?.on('data', (chunk: Buffer) => (output += chunk))
    child.stderr?.on('data', (chunk: Buffer) => (output += chunk))
    // Loading tsx and connecting take a few seconds on a loaded machine; a hung script never ends.
    const bound = setTimeout(() => child.kill('SIGKILL'), 30_000)
    try {
      expect(await exited(child), `the script did not exit within 30 s by itself; it printed:\n${output}`).toBe(null)
      expect(child.exitCode, output).toBe(0)
      expect(JSON.parse(output.trim().split('\n').at(-1) as string)).toEqual({ exists: true, after: false })
    } finally {
      clearTimeout(bound)
      rmSync(dir, { recursive: true, force: true })
    }
  }, 45_000)

  it('refuses to set up on a server without wal_level = logical, saying how to fix it', async () => {
    const relay = new PgCdcRelay({ connection: PG_URL, publisher: { name: 'none', publish: async () => [] } })
    try {
      await expect(relay.setup()).rejects.toMatchObject({ code: 'STORE_SCHEMA', message: expect.stringContaining('wal_level = logical') })
    } finally {
      await relay.stop()
    }
  })
})

const BIN = join(import.meta.dirname, '..', 'bin/idemkey.js')
const redisSkip = noServer ?? (await serviceSkipReason('Redis', BROKER_PORTS.redis))

describe.skipIf(redisSkip !== undefined)('idemkey relay (the built CLI)', () => {
  beforeAll(() => {
    if (!existsSync(join(import.meta.dirname, '..', 'dist/cli/main.js'))) {
      throw new Error('dist/cli/main.js is missing: run `npm run build` first (npm test does).')
    }
  })

  it('relays committed outbox rows to Redis Streams, answers /readyz, and stops on SIGTERM', { timeout: 40_000 }, async () => {
    const pool = new pg.Pool({ connectionString: server.url, max: 2 })
    const id = randomUUID().replaceAll('-', '').slice(0, 10)
    const table = `cdc_${id}_cli`
    const stream = `idemkey:h1cdc:${id}`
    const outbox = new PgOutbox({ pool, table })
    await outbox.migrate()
    const redis = new Redis(BROKER_PORTS.redis, '127.0.0.1')
    const { child, stderr } = relayCli(['--from', server.url, '--to', 'redis://127.0.0.1:6379', '--table', table, '--health-port', '0'])
    try {
      await eventually(() => /streaming from slot/.test(stderr()), `the relay to stream. stderr:\n${stderr()}`)
      const port = Number(/health on http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr())?.[1])
      for (let i = 0; i < 3; i++) {
        const client = await pool.connect()
        await client.query('BEGIN')
        await outbox.add(client, { topic: stream, payload: { i } })
        await client.query('COMMIT')
        client.release()
      }
      await eventually(async () => (await redis.xlen(stream)) === 3, `3 entries on ${stream}. stderr:\n${stderr()}`)
      const ready = await fetch(`http://127.0.0.1:${port}/readyz`)
      expect(ready.status).toBe(200)
      expect(await ready.json()).toMatchObject({ status: 'ready', slot: `idemkey_cdc_${table}`, exists: true, active: true })
      child.kill('SIGTERM')
      expect(await exited(child)).toBe(null)
      expect(child.exitCode).toBe(0)
      expect(stderr()).toContain('published 3 messages')
    } finally {
      child.kill('SIGKILL')
      await redis.del(stream)
      redis.disconnect()
      await eventually(async () => {
        const { rows } = await pool.query('SELECT active FROM pg_replication_slots WHERE slot_name = $1', [`idemkey_cdc_${table}`])
        return rows[0]?.active !== true
      }, 'the slot to be released')
      await new PgCdcRelay({ connection: server.url, publisher: { name: 'none', publish: async () => [] }, table }).drop()
      await pool.end()
    }
  })

  it('exits, saying which flag to change, when its health port is taken (not left running half started)', { timeout: 30_000 }, async () => {
    const pool = new pg.Pool({ connectionString: server.url, max: 1 })
    const table = `cdc_${randomUUID().replaceAll('-', '').slice(0, 10)}_port`
    await new PgOutbox({ pool, table }).migrate()
    const holder = createServer()
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve))
    const port = (holder.address() as AddressInfo).port
    const { child, stderr } = relayCli([
      '--from',
      server.url,
      '--to',
      'redis://127.0.0.1:6379',
      '--table',
      table,
      '--health-port',
      String(port),
    ])
    try {
      expect(await exited(child)).toBe(null)
      expect(child.exitCode).toBe(1)
      expect(stderr()).toContain(`--health-port ${port}: something else already listens on 127.0.0.1:${port}`)
    } finally {
      child.kill('SIGKILL')
      holder.close()
      await new PgCdcRelay({ connection: server.url, publisher: { name: 'none', publish: async () => [] }, table }).drop()
      await pool.end()
    }
  })

  it('refuses a server without wal_level = logical with a message that says how to fix it, and exits', { timeout: 30_000 }, async () => {
    const { child, stderr } = relayCli(['--from', PG_URL, '--to', 'redis://127.0.0.1:6379', '--table', 'h1_cdc_absent'])
    try {
      expect(await exited(child)).toBe(null)
      expect(child.exitCode).toBe(1)
      expect(stderr()).toContain('wal_level = logical')
    } finally {
      child.kill('SIGKILL')
    }
  })
})

/** The built CLI's `idemkey relay` with `args`, its stderr collected as it comes. */
function relayCli(args: string[]): { child: ChildProcess; stderr: () => string } {
  const child = spawn(process.execPath, [BIN, 'relay', ...args], { stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString()
  })
  return { child, stderr: () => stderr }
}
