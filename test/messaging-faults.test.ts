/**
 * End to end through each real broker, with real processes killed at random (SIGKILL): producers
 * inside open transactions, relays after the broker confirmed but before marking rows sent, consumers
 * after their transaction committed but before the ack, plus kills from outside at any moment.
 * At the end every committed event is applied exactly once, none from a rolled-back transaction,
 * and nothing is lost.
 */
import { BROKER_PORTS, type BrokerName, createResource, topicFor } from './fixtures/messaging/brokers.js'
import { chaos, exited, Fleet } from './fixtures/messaging/fleet.js'
import { eventually } from './fixtures/messaging/pg.js'
import { type SqlDatabase, sqlDatabases } from './fixtures/messaging/sql.js'
import { serviceSkipReason } from './helpers/services.js'

const CHAOS_MS = Number(process.env.IDEMKEY_FAULT_CHAOS_MS ?? 10_000)

/** The tables of a fault run, their names as the workers see them, and the count query. */
async function setUp(database: SqlDatabase, label: string, broker: BrokerName) {
  const db = await database.open(`${label}_${broker}`)
  const resource = await createResource(broker)
  const fleet = new Fleet({
    ...process.env,
    FAULT_DB: database.dialect,
    FAULT_TABLE_PREFIX: db.tablePrefix,
    FAULT_BROKER: broker,
    FAULT_NAME: resource.name,
  })
  await db.query(`CREATE TABLE ${db.table('orders')} (id varchar(64) PRIMARY KEY)`)
  await db.query(
    `CREATE TABLE ${db.table('applied')} (order_id varchar(64) PRIMARY KEY, message_id varchar(255) NOT NULL, n integer NOT NULL)`,
  )
  await db.query(`CREATE TABLE ${db.table('observed')} (kind varchar(32) NOT NULL)`)
  const outbox = db.outbox({ table: db.table('outbox') })
  await outbox.migrate()
  await db.inbox({ consumer: 'fault', table: db.table('inbox') }).migrate()
  const count = async (sql: string) => Number((await db.query<{ n: unknown }>(sql))[0]?.n)
  const t = { orders: db.table('orders'), applied: db.table('applied'), observed: db.table('observed'), outbox: db.table('outbox') }
  return { db, resource, fleet, outbox, count, t }
}

async function runScenario(database: SqlDatabase, broker: BrokerName): Promise<void> {
  const { db, resource, fleet, outbox, count, t } = await setUp(database, 'fault', broker)
  try {
    // Chaos: everyone may kill itself at its worst moment, and the test kills someone every ~1.5 s.
    for (let i = 0; i < 2; i++) {
      fleet.spawn('producer', 0.005)
      fleet.spawn('relay', 0.05)
      fleet.spawn('consumer', 0.01)
    }
    const orderCount = () => count(`SELECT count(*) AS n FROM ${t.orders}`)
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
        (await count(`SELECT count(*) AS n FROM ${t.applied}`)) === (await count(`SELECT count(*) AS n FROM ${t.orders}`)) &&
        (await resource.idle()),
      `every committed event of ${broker} to be applied. Worker errors:\n${fleet.errors()}`,
      90_000,
    )
    await fleet.killAll()

    const orders = await count(`SELECT count(*) AS n FROM ${t.orders}`)
    console.info(
      `${database.name}, ${broker}: ${orders} committed orders, ${fleet.externalKills} external kills, ${fleet.selfKills} self-kills, ` +
        `${await count(`SELECT count(*) AS n FROM ${t.observed}`)} redeliveries skipped by the inbox`,
    )
    expect(orders).toBeGreaterThan(20)
    expect(fleet.externalKills).toBeGreaterThan(0)
    // Exactly once: no order applied twice…
    expect(await count(`SELECT count(*) AS n FROM ${t.applied} WHERE n <> 1`)).toBe(0)
    // …nothing applied that was never committed (rolled back, or killed mid-transaction)…
    expect(
      await count(`SELECT count(*) AS n FROM ${t.applied} a WHERE NOT EXISTS (SELECT 1 FROM ${t.orders} o WHERE o.id = a.order_id)`),
    ).toBe(0)
    // …nothing lost…
    expect(
      await count(`SELECT count(*) AS n FROM ${t.orders} o WHERE NOT EXISTS (SELECT 1 FROM ${t.applied} a WHERE a.order_id = o.id)`),
    ).toBe(0)
    // …and one event per order, replays included, none dead-lettered.
    expect(await outbox.stats()).toEqual({ pending: 0, sent: orders, dead: 0 })
    expect(await count(`SELECT count(*) AS n FROM ${t.applied} a JOIN ${t.outbox} o ON o.id = a.message_id`)).toBe(orders)
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
async function runWorstPoints(database: SqlDatabase, broker: BrokerName): Promise<void> {
  const { db, resource, fleet, outbox, count, t } = await setUp(database, 'worst', broker)
  fleet.respawn = false
  try {
    await db.inTransaction(async (tx) => {
      for (let i = 0; i < 20; i++) {
        const orderId = `order-${i}`
        await db.exec(tx, `INSERT INTO ${t.orders} (id) VALUES ($1)`, [orderId])
        await outbox.add(tx, { topic: topicFor(broker, resource.name), payload: { orderId }, idempotencyKey: orderId })
      }
    })

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
    expect(await count(`SELECT count(*) AS n FROM ${t.applied}`)).toBeGreaterThanOrEqual(1)
    fleet.spawn('consumer', 0)
    await eventually(
      async () => (await count(`SELECT count(*) AS n FROM ${t.applied}`)) === 20 && (await resource.idle()),
      `all 20 orders to be applied. Worker errors:\n${fleet.errors()}`,
      60_000,
    )
    expect(await count(`SELECT count(*) AS n FROM ${t.applied} WHERE n <> 1`)).toBe(0)
    // The unacked message always comes back; without broker-side dedup the republished batch does too.
    // (The worker records skips without waiting, hence the deadline rather than one read.)
    const expected = broker === 'nats' ? 1 : 21
    await eventually(
      async () => (await count(`SELECT count(*) AS n FROM ${t.observed}`)) >= expected,
      `${expected} copies skipped by the inbox`,
      10_000,
    )
  } finally {
    await fleet.killAll()
    await resource.teardown().catch(() => {})
    await db.drop()
  }
}

for (const database of await sqlDatabases()) {
  for (const broker of ['nats', 'rabbitmq', 'redis'] as const) {
    const skip =
      database.skip ??
      (await serviceSkipReason(broker === 'nats' ? 'NATS' : broker === 'rabbitmq' ? 'RabbitMQ' : 'Redis', BROKER_PORTS[broker]))
    if (skip) console.warn(`Skipping the ${broker} fault test on ${database.name}: ${skip}`)
    describe.skipIf(skip !== undefined)(
      `outbox to inbox on ${database.name} through ${broker} with producers, relays and consumers killed at random`,
      () => {
        it('applies every committed event exactly once, none from a rolled-back transaction, and loses none', async () => {
          await runScenario(database, broker)
        }, 150_000)

        it('republishes the batch of a relay killed between confirm and mark-sent, and skips the copy a consumer killed before its ack gets again', async () => {
          await runWorstPoints(database, broker)
        }, 120_000)
      },
    )
  }
}
