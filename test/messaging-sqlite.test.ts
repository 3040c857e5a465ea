/** The SQLite outbox and inbox (better-sqlite3), with a real NATS JetStream between them. */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Database from 'better-sqlite3'
import type { SqliteDatabase } from '../src/backends/sqlite/driver.js'
import { consumeNats, NatsPublisher } from '../src/messaging/brokers/nats/index.js'
import { SqliteInbox } from '../src/messaging/inbox/index.js'
import { OutboxRelay, type RelayEvent, SqliteOutbox } from '../src/messaging/outbox/index.js'
import { createStream, type TestStream } from './fixtures/messaging/nats.js'
import { eventually } from './fixtures/messaging/pg.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = await serviceSkipReason('NATS', 4222)

describe('SQLite outbox and inbox', () => {
  let dir: string
  let file: string
  let db: Database.Database
  let outbox: SqliteOutbox

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'idemkey-msg-'))
    file = join(dir, 'app.db')
    db = new Database(file)
    db.pragma('journal_mode = WAL')
    db.exec('CREATE TABLE orders (id TEXT PRIMARY KEY)')
    outbox = new SqliteOutbox({ database: db })
    outbox.migrate()
    outbox.migrate()
  })
  afterEach(() => {
    db.close()
    rmSync(dir, { recursive: true, force: true })
  })

  const placeOrder = (id: string, extra: Partial<Parameters<SqliteOutbox['add']>[1]> = {}) =>
    db.transaction(() => {
      db.prepare('INSERT OR IGNORE INTO orders (id) VALUES (?)').run(id)
      return outbox.add(db, { topic: 'orders', payload: { id }, idempotencyKey: id, ...extra })
    })()

  it('writes the event with the state change, adds nothing on a replay, and refuses an add outside a transaction', () => {
    const first = placeOrder('o1')
    expect(placeOrder('o1')).toEqual({ id: first.id, created: false })
    expect(() =>
      db.transaction(() => {
        placeOrder('o2')
        throw new Error('rolled back')
      })(),
    ).toThrow('rolled back')
    expect(() => outbox.add(db, { topic: 'orders', payload: 1 })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }))
    expect(outbox.stats()).toEqual({ pending: 1, sent: 0, dead: 0 })
  })

  it('does not claim a later event of a partition while an earlier one is leased to another relay', async () => {
    placeOrder('a1', { partitionKey: 'a' })
    placeOrder('a2', { partitionKey: 'a' })
    placeOrder('b1', { partitionKey: 'b' })
    placeOrder('free')
    const other = new Database(file)
    try {
      const first = await new SqliteOutbox({ database: other }).storage().claim('relay-1', 1, 60_000)
      expect(first.map((m) => m.partitionKey)).toEqual(['a'])
      const second = await outbox.storage().claim('relay-2', 10, 60_000)
      expect(second.map((m) => m.partitionKey)).toEqual(['b', null])
    } finally {
      other.close()
    }
  })

  it('purges sent rows past their age in batches, and puts dead-lettered rows back to pending', async () => {
    for (const id of ['s1', 's2', 's3', 'd1', 'd2']) placeOrder(id)
    const storage = outbox.storage()
    const claimed = await storage.claim('relay-1', 10, 60_000)
    const seq = (id: string) => claimed.find((m) => m.id === placeOrder(id).id)?.seq as number
    await storage.markSent(['s1', 's2', 's3'].map(seq))
    await storage.markFailed('relay-1', [
      { seq: seq('d1'), error: 'nack', retryInMs: 0, dead: true },
      { seq: seq('d2'), error: 'nack', retryInMs: 0, dead: true },
    ])
    expect(outbox.stats()).toEqual({ pending: 0, sent: 3, dead: 2 })
    expect(outbox.purgeSent('1h')).toBe(0)
    await new Promise((resolve) => setTimeout(resolve, 5))
    expect(outbox.purgeSent(1, { batchSize: 2 })).toBe(3)
    expect(outbox.retryDead([placeOrder('d1').id])).toBe(1)
    expect(outbox.stats()).toEqual({ pending: 1, sent: 0, dead: 1 })
    expect(outbox.retryDead()).toBe(1)
    expect(outbox.stats()).toEqual({ pending: 2, sent: 0, dead: 0 })
    expect(() => outbox.purgeSent(1, { batchSize: 0 })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }))
  })

  it('purges inbox IDs past the retention in bounded batches, like PgInbox.purge', async () => {
    let now = 1_000_000
    const inboxDb = new Database(join(dir, 'inbox.db'))
    // Counts the rows each purge DELETE statement of processed IDs removes: at most batchSize.
    const deletes: number[] = []
    const counted: SqliteDatabase = {
      prepare: (sql) => {
        const statement = inboxDb.prepare(sql)
        if (!sql.trimStart().startsWith('DELETE') || sql.includes('_failures')) return statement
        return {
          run: (...params: unknown[]) => {
            const result = statement.run(...params)
            deletes.push(result.changes)
            return result
          },
          get: (...params: unknown[]) => statement.get(...params),
          all: (...params: unknown[]) => statement.all(...params),
        }
      },
      exec: (sql) => inboxDb.exec(sql),
      get open() {
        return inboxDb.open
      },
      close: () => inboxDb.close(),
      get inTransaction() {
        return inboxDb.inTransaction
      },
    }
    try {
      const inbox = new SqliteInbox({ database: counted, consumer: 'billing', retention: '1h', now: () => now })
      const other = new SqliteInbox({ database: inboxDb, consumer: 'shipping', retention: '1h', now: () => now })
      inbox.migrate()
      const effect = () => undefined
      for (let i = 0; i < 5; i++) await inbox.handle({ id: `old-${i}`, payload: 'x' }, effect)
      await other.handle({ id: 'old-other', payload: 'x' }, effect)
      now += 2 * 3_600_000
      await inbox.handle({ id: 'fresh', payload: 'x' }, effect)
      expect(inbox.purge({ batchSize: 2 })).toBe(5)
      expect(deletes).toEqual([2, 2, 1])
      expect(inbox.purge()).toBe(0)
      expect(() => inbox.purge({ batchSize: 0 })).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }))
      expect(inboxDb.prepare('SELECT consumer, message_id FROM idemkey_inbox ORDER BY message_id').all()).toEqual([
        { consumer: 'billing', message_id: 'fresh' },
        { consumer: 'shipping', message_id: 'old-other' },
      ])
    } finally {
      inboxDb.close()
    }
  })

  it('handles a batch in one transaction: new IDs applied in order, duplicates skipped, a reused ID flagged, a failing effect rolls all back', async () => {
    db.exec('CREATE TABLE applied (n INTEGER)')
    const inbox = new SqliteInbox({ database: db, consumer: 'billing' })
    inbox.migrate()
    const apply = (tx: SqliteDatabase, m: { payload: unknown }) => {
      tx.prepare('INSERT INTO applied (n) VALUES (?)').run(Number(m.payload))
      return Number(m.payload)
    }
    await inbox.handle({ id: 'm1', payload: '1' }, apply)
    const results = await inbox.handleBatch(
      [
        { id: 'm1', payload: '1' },
        { id: 'm2', payload: '2' },
        { id: 'm1', payload: '9' },
        { id: 'm3', payload: '3' },
        { id: 'm2', payload: '2' },
      ],
      apply,
    )
    expect(results.map((r) => r.status)).toEqual(['duplicate', 'applied', 'mismatch', 'applied', 'duplicate'])
    expect(results[1]).toEqual({ status: 'applied', value: 2 })
    const failing = (tx: SqliteDatabase, m: { id: string; payload: unknown }) => {
      apply(tx, m)
      if (m.id === 'm5') throw new Error('effect failed')
    }
    await expect(
      inbox.handleBatch(
        [
          { id: 'm4', payload: '4' },
          { id: 'm5', payload: '5' },
        ],
        failing,
      ),
    ).rejects.toThrow('effect failed')
    expect(db.prepare('SELECT n FROM applied ORDER BY rowid').all()).toEqual([{ n: 1 }, { n: 2 }, { n: 3 }])
    expect((db.prepare("SELECT count(*) AS n FROM idemkey_inbox WHERE message_id IN ('m4', 'm5')").get() as { n: number }).n).toBe(0)
  })

  describe('through NATS JetStream', { skip: skip !== undefined }, () => {
    let nats: TestStream
    beforeEach(async () => {
      nats = await createStream()
    })
    afterEach(async () => {
      await nats.drop()
    })

    it('lets two relays on separate connections drain one file without publishing a row twice', async () => {
      db.transaction(() => {
        for (let i = 0; i < 300; i++) outbox.add(db, { topic: nats.subject('orders'), payload: { i } })
      })()
      const published = new Map<string, number>()
      const onEvent = (e: RelayEvent) => {
        if (e.type === 'published') for (const m of e.messages) published.set(m.id, (published.get(m.id) ?? 0) + 1)
      }
      const connections = [new Database(file), new Database(file)]
      try {
        const publisher = new NatsPublisher({ connection: nats.connection })
        await Promise.all(
          connections.map(async (connection) => {
            const relay = new OutboxRelay({ outbox: new SqliteOutbox({ database: connection }), publisher, batchSize: 25, onEvent })
            while ((await relay.runOnce()) > 0) {}
          }),
        )
      } finally {
        for (const c of connections) c.close()
      }
      expect(published.size).toBe(300)
      expect([...published.values()].every((n) => n === 1)).toBe(true)
      expect(await nats.count()).toBe(300)
      expect(outbox.stats()).toEqual({ pending: 0, sent: 300, dead: 0 })
    })

    it('applies each event once in a synchronous inbox transaction and refuses an async effect', async () => {
      for (const id of ['o1', 'o2', 'o3']) placeOrder(id, { topic: nats.subject('orders') })
      const relay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
      await relay.runOnce()
      db.exec('CREATE TABLE applied (order_id TEXT PRIMARY KEY)')
      const inbox = new SqliteInbox({ database: db, consumer: 'billing' })
      inbox.migrate()
      await expect(inbox.handle({ id: 'x', payload: 'x' }, async () => 1)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
      await nats.addConsumer('billing')
      const running = await consumeNats({
        connection: nats.connection,
        stream: nats.stream,
        consumer: 'billing',
        inbox,
        handler: (tx, m) => {
          tx.prepare('INSERT INTO applied (order_id) VALUES (?)').run((JSON.parse(Buffer.from(m.payload).toString()) as { id: string }).id)
        },
      })
      await eventually(() => (db.prepare('SELECT count(*) AS n FROM applied').get() as { n: number }).n === 3, 'three applied orders')
      await running.stop()
      expect(
        await inbox.handle(
          { id: placeOrder('o1', { topic: nats.subject('orders') }).id, payload: JSON.stringify({ id: 'o1' }) },
          () => 'again',
        ),
      ).toEqual({ status: 'duplicate' })
      expect(db.prepare('SELECT order_id FROM applied ORDER BY order_id').all()).toEqual([
        { order_id: 'o1' },
        { order_id: 'o2' },
        { order_id: 'o3' },
      ])
    })
  })
})
