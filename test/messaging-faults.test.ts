/**
 * End to end through each real broker, with real processes killed at random (SIGKILL): producers
 * inside open transactions, relays after the broker confirmed but before marking rows sent, consumers
 * after their transaction committed but before the ack, plus kills from outside at any moment.
 * At the end every committed event is applied exactly once, none from a rolled-back transaction,
 * and nothing is lost.
 */
import { PgInbox } from '../src/messaging/inbox/index.js'
import { PgOutbox } from '../src/messaging/outbox/index.js'
import { BROKER_PORTS, type BrokerName, createResource, topicFor } from './fixtures/messaging/brokers.js'
import { chaos, exited, Fleet } from './fixtures/messaging/fleet.js'
import { createSchema, eventually } from './fixtures/messaging/pg.js'
import { serviceSkipReason } from './helpers/services.js'

const CHAOS_MS = Number(process.env.IDEMKEY_FAULT_CHAOS_MS ?? 10_000)
const pgSkip = await serviceSkipReason('PostgreSQL', 5432)

async function runScenario(broker: BrokerName): Promise<void> {
  const db = await createSchema(`fault_${broker}`)
  const s = `"${db.schema}"`
  const resource = await createResource(broker)
  const fleet = new Fleet({ ...process.env, FAULT_SCHEMA: db.schema, FAULT_BROKER: broker, FAULT_NAME: resource.name })
  try {
    await db.pool.query(`CREATE TABLE ${s}.orders (id text PRIMARY KEY)`)
    await db.pool.query(`CREATE TABLE ${s}.applied (order_id text PRIMARY KEY, message_id text NOT NULL, n integer NOT NULL)`)
    await db.pool.query(`CREATE TABLE ${s}.observed (kind text NOT NULL)`)
    const outbox = new PgOutbox({ pool: db.pool, table: db.table('outbox') })
    await outbox.migrate()
    await new PgInbox({ pool: db.pool, consumer: 'fault', table: db.table('inbox') }).migrate()

    // Chaos: everyone may kill itself at its worst moment, and the test kills someone every ~1.5 s.
    for (let i = 0; i < 2; i++) {
      fleet.spawn('producer', 0.005)
      fleet.spawn('relay', 0.05)
      fleet.spawn('consumer', 0.01)
    }
    const count = async (sql: string) => Number((await db.pool.query<{ n: string }>(sql)).rows[0]?.n)
    const orderCount = () => count(`SELECT count(*) AS n FROM ${s}.orders`)
    await chaos(fleet, {
      minMs: CHAOS_MS,
      maxMs: 6 * CHAOS_MS,
      ready: async () => (await orderCount()) > 0 && (await outbox.stats()).sent > 0,
      enough: async () => (await orderCount()) >= 100,
    })
    fleet.respawn = false
    await fleet.killAll()

    // Recovery: one relay and one consumer that no longer kill themselves drain what is left,
    // including batches leased by dead relays and messages left unacked by dead consumers.
    fleet.spawn('relay', 0)
    fleet.spawn('consumer', 0)
    await eventually(
      async () =>
        (await outbox.stats()).pending === 0 &&
        (await count(`SELECT count(*) AS n FROM ${s}.applied`)) === (await count(`SELECT count(*) AS n FROM ${s}.orders`)) &&
        (await resource.idle()),
      `every committed event of ${broker} to be applied. Worker errors:\n${fleet.errors()}`,
      90_000,
    )
    await fleet.killAll()

    const orders = await count(`SELECT count(*) AS n FROM ${s}.orders`)
    console.info(
      `${broker}: ${orders} committed orders, ${fleet.externalKills} external kills, ${fleet.selfKills} self-kills, ` +
        `${await count(`SELECT count(*) AS n FROM ${s}.observed`)} redeliveries skipped by the inbox`,
    )
    expect(orders).toBeGreaterThan(20)
    expect(fleet.externalKills).toBeGreaterThan(0)
    // Exactly once: no order applied twice…
    expect(await count(`SELECT count(*) AS n FROM ${s}.applied WHERE n <> 1`)).toBe(0)
    // …nothing applied that was never committed (rolled back, or killed mid-transaction)…
    expect(
      await count(`SELECT count(*) AS n FROM ${s}.applied a WHERE NOT EXISTS (SELECT 1 FROM ${s}.orders o WHERE o.id = a.order_id)`),
    ).toBe(0)
    // …nothing lost…
    expect(
      await count(`SELECT count(*) AS n FROM ${s}.orders o WHERE NOT EXISTS (SELECT 1 FROM ${s}.applied a WHERE a.order_id = o.id)`),
    ).toBe(0)
    // …and one event per order, replays included, none dead-lettered.
    expect(await outbox.stats()).toEqual({ pending: 0, sent: orders, dead: 0 })
    expect(await count(`SELECT count(*) AS n FROM ${s}.applied a JOIN ${db.table('outbox')} o ON o.id = a.message_id`)).toBe(orders)
  } finally {
    fleet.respawn = false
    await fleet.killAll()
    await resource.teardown().catch(() => {})
    await db.drop()
  }
}

/**
 * Deterministic kills at the two worst points: a relay dies after the broker confirmed its batch
 * and before marking it sent; a consumer dies after its commit and before its ack.
 */
async function runWorstPoints(broker: BrokerName): Promise<void> {
  const db = await createSchema(`worst_${broker}`)
  const s = `"${db.schema}"`
  const resource = await createResource(broker)
  const fleet = new Fleet({ ...process.env, FAULT_SCHEMA: db.schema, FAULT_BROKER: broker, FAULT_NAME: resource.name })
  fleet.respawn = false
  const count = async (sql: string) => Number((await db.pool.query<{ n: string }>(sql)).rows[0]?.n)
  try {
    await db.pool.query(`CREATE TABLE ${s}.orders (id text PRIMARY KEY)`)
    await db.pool.query(`CREATE TABLE ${s}.applied (order_id text PRIMARY KEY, message_id text NOT NULL, n integer NOT NULL)`)
    await db.pool.query(`CREATE TABLE ${s}.observed (kind text NOT NULL)`)
    const outbox = new PgOutbox({ pool: db.pool, table: db.table('outbox') })
    await outbox.migrate()
    await new PgInbox({ pool: db.pool, consumer: 'fault', table: db.table('inbox') }).migrate()
    const client = await db.pool.connect()
    await client.query('BEGIN')
    for (let i = 0; i < 20; i++) {
      const orderId = `order-${i}`
      await client.query(`INSERT INTO ${s}.orders (id) VALUES ($1)`, [orderId])
      await outbox.add(client, { topic: topicFor(broker, resource.name), payload: { orderId }, idempotencyKey: orderId })
    }
    await client.query('COMMIT')
    client.release()

    // The relay kills itself once the broker confirmed its one batch of 20.
    expect(await exited(fleet.spawn('relay', 1))).toBe('SIGKILL')
    expect(await outbox.stats()).toEqual({ pending: 20, sent: 0, dead: 0 })
    // Another relay takes the batch after the 2 s lease and publishes it again, same IDs.
    fleet.spawn('relay', 0)
    await eventually(
      async () => (await outbox.stats()).sent === 20,
      `the second relay to send the batch. Worker errors:\n${fleet.errors()}`,
    )
    await fleet.killAll('relay')

    // The consumer kills itself after its first commit, before the ack.
    expect(await exited(fleet.spawn('consumer', 1))).toBe('SIGKILL')
    expect(await count(`SELECT count(*) AS n FROM ${s}.applied`)).toBeGreaterThanOrEqual(1)
    fleet.spawn('consumer', 0)
    await eventually(
      async () => (await count(`SELECT count(*) AS n FROM ${s}.applied`)) === 20 && (await resource.idle()),
      `all 20 orders to be applied. Worker errors:\n${fleet.errors()}`,
      60_000,
    )
    expect(await count(`SELECT count(*) AS n FROM ${s}.applied WHERE n <> 1`)).toBe(0)
    // The unacked message always comes back; without broker-side dedup the republished batch does too.
    // (The worker records skips without waiting, hence the deadline rather than one read.)
    const expected = broker === 'nats' ? 1 : 21
    await eventually(
      async () => (await count(`SELECT count(*) AS n FROM ${s}.observed`)) >= expected,
      `${expected} copies skipped by the inbox`,
      10_000,
    )
  } finally {
    await fleet.killAll()
    await resource.teardown().catch(() => {})
    await db.drop()
  }
}

for (const broker of ['nats', 'rabbitmq', 'redis'] as const) {
  const skip =
    pgSkip ?? (await serviceSkipReason(broker === 'nats' ? 'NATS' : broker === 'rabbitmq' ? 'RabbitMQ' : 'Redis', BROKER_PORTS[broker]))
  if (skip) console.warn(`Skipping the ${broker} fault test: ${skip}`)
  describe.skipIf(skip !== undefined)(`outbox to inbox through ${broker} with producers, relays and consumers killed at random`, () => {
    it('applies every committed event exactly once, none from a rolled-back transaction, and loses none', async () => {
      await runScenario(broker)
    }, 150_000)

    it('republishes the batch of a relay killed between confirm and mark-sent, and skips the copy a consumer killed before its ack gets again', async () => {
      await runWorstPoints(broker)
    }, 120_000)
  })
}
