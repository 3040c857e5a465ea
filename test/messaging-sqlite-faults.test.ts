/**
 * The SQLite outbox and inbox end to end through NATS JetStream, with producers, relays and
 * consumers as separate processes on shared SQLite files, SIGKILLed at random and at their worst
 * points. Every committed order is applied exactly once, none from a rolled-back transaction.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { SqliteInbox } from '../src/messaging/inbox/index.js'
import { SqliteOutbox } from '../src/messaging/outbox/index.js'
import { createResource } from './fixtures/messaging/brokers.js'
import { chaos, Fleet } from './fixtures/messaging/fleet.js'
import { eventually } from './fixtures/messaging/pg.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = await serviceSkipReason('NATS', 4222)
const CHAOS_MS = Number(process.env.IDEMKEY_FAULT_CHAOS_MS ?? 10_000)

describe.skipIf(skip !== undefined)('SQLite outbox to SQLite inbox through NATS with processes killed at random', () => {
  it('applies every committed event exactly once, none from a rolled-back transaction, and loses none', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-sqlite-faults-'))
    const appFile = join(dir, 'app.db')
    const consumerFile = join(dir, 'consumer.db')
    const app = new DatabaseSync(appFile)
    const consumer = new DatabaseSync(consumerFile)
    for (const db of [app, consumer]) db.exec('PRAGMA journal_mode = WAL')
    app.exec('CREATE TABLE orders (id TEXT PRIMARY KEY)')
    consumer.exec(
      'CREATE TABLE applied (order_id TEXT PRIMARY KEY, message_id TEXT NOT NULL, n INTEGER NOT NULL); CREATE TABLE observed (kind TEXT)',
    )
    const outbox = new SqliteOutbox({ database: app })
    outbox.migrate()
    new SqliteInbox({ database: consumer, consumer: 'fault' }).migrate()
    const resource = await createResource('nats')
    const fleet = new Fleet({ ...process.env, FAULT_APP_DB: appFile, FAULT_CONSUMER_DB: consumerFile, FAULT_NAME: resource.name })
    const count = (db: DatabaseSync, sql: string) => (db.prepare(sql).get() as { n: number }).n
    try {
      for (let i = 0; i < 2; i++) {
        fleet.spawn('sqlite-producer', 0.005)
        fleet.spawn('sqlite-relay', 0.05)
      }
      fleet.spawn('sqlite-consumer', 0.01)
      const orderCount = async () => count(app, 'SELECT count(*) AS n FROM orders')
      await chaos(fleet, {
        minMs: CHAOS_MS,
        maxMs: 6 * CHAOS_MS,
        ready: async () => (await orderCount()) > 0 && outbox.stats().sent > 0,
        enough: async () => (await orderCount()) >= 100,
      })
      fleet.respawn = false
      await fleet.killAll()
      fleet.spawn('sqlite-relay', 0)
      fleet.spawn('sqlite-consumer', 0)
      await eventually(
        async () =>
          outbox.stats().pending === 0 &&
          count(consumer, 'SELECT count(*) AS n FROM applied') === count(app, 'SELECT count(*) AS n FROM orders') &&
          (await resource.idle()),
        `every committed event to be applied. Worker errors:\n${fleet.errors()}`,
        90_000,
      )
      await fleet.killAll()
      const orders = count(app, 'SELECT count(*) AS n FROM orders')
      console.info(
        `sqlite: ${orders} committed orders, ${fleet.externalKills} external kills, ${count(consumer, 'SELECT count(*) AS n FROM observed')} copies skipped`,
      )
      expect(orders).toBeGreaterThan(20)
      expect(fleet.externalKills).toBeGreaterThan(0)
      expect(count(consumer, 'SELECT count(*) AS n FROM applied WHERE n <> 1')).toBe(0)
      consumer.exec(`ATTACH DATABASE '${appFile.replaceAll("'", "''")}' AS app`)
      expect(
        count(consumer, 'SELECT count(*) AS n FROM applied a WHERE NOT EXISTS (SELECT 1 FROM app.orders o WHERE o.id = a.order_id)'),
      ).toBe(0)
      expect(
        count(consumer, 'SELECT count(*) AS n FROM app.orders o WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.order_id = o.id)'),
      ).toBe(0)
      expect(outbox.stats()).toEqual({ pending: 0, sent: orders, dead: 0 })
    } finally {
      fleet.respawn = false
      await fleet.killAll()
      await resource.teardown().catch(() => {})
      app.close()
      consumer.close()
      rmSync(dir, { recursive: true, force: true })
    }
  }, 150_000)
})
