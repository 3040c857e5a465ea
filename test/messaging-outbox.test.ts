/**
 * Outbox, relay and inbox on each SQL database (PostgreSQL, MySQL/MariaDB), published to a real NATS
 * JetStream: one suite, run per database through its harness (fixtures/messaging/sql.ts). Each test
 * gets its own stream and outbox table; the file gets its own schema or table prefix. Below it, what
 * only one database has: PostgreSQL's LISTEN/NOTIFY and its name limits, MySQL's own checks.
 */
import mysql from 'mysql2/promise'
import type { JsMsg } from 'nats'
import pg from 'pg'
import type { SqlTransactions } from '../src/core/sql-transactions.js'
import { IdempotencyError } from '../src/errors.js'
import { consumeNats, NatsPublisher } from '../src/messaging/brokers/nats/index.js'
import { InboxMismatchError, MySqlInbox, PgInbox } from '../src/messaging/inbox/index.js'
import { MySqlOutbox, type OutboxMessage, OutboxRelay, PgOutbox, type Publisher, type RelayEvent } from '../src/messaging/outbox/index.js'
import { createStream, type TestStream } from './fixtures/messaging/nats.js'
import { createSchema, eventually, inTransaction, PG_URL, type TestSchema } from './fixtures/messaging/pg.js'
import { MYSQL_URL, sqlDatabases, type TestDb, type TestOutbox } from './fixtures/messaging/sql.js'
import { serviceSkipReason } from './helpers/services.js'
import { TcpFaultProxy } from './helpers/tcp-fault-proxy.js'

const natsSkip = await serviceSkipReason('NATS', 4222)
const databases = await sqlDatabases()

async function readStream(nats: TestStream, count: number): Promise<JsMsg[]> {
  const durable = `read_${Math.random().toString(36).slice(2, 8)}`
  await nats.addConsumer(durable)
  const consumer = await nats.connection.jetstream().consumers.get(nats.stream, durable)
  const out: JsMsg[] = []
  while (out.length < count) {
    const batch = await consumer.fetch({ max_messages: count - out.length, expires: 2_000 })
    let got = 0
    for await (const m of batch) {
      out.push(m)
      m.ack()
      got++
    }
    if (got === 0) break
  }
  return out
}

for (const database of databases) {
  const skip = database.skip ?? natsSkip
  if (skip) console.warn(`Skipping messaging-outbox tests on ${database.name}: ${skip}`)

  describe.skipIf(skip !== undefined)(`outbox, relay and inbox on ${database.name} with NATS JetStream`, () => {
    let db: TestDb
    let nats: TestStream
    let outbox: TestOutbox
    let table: string

    beforeAll(async () => {
      db = await database.open('outbox')
    })
    afterAll(async () => {
      await db?.drop()
    })
    beforeEach(async (context) => {
      nats = await createStream()
      table = db.table(`outbox_${context.task.id.replace(/[^A-Za-z0-9]/g, '').slice(-10)}`)
      outbox = db.outbox({ table })
      await outbox.migrate()
    })
    afterEach(async () => {
      await nats?.drop()
    })

    it('publishes a committed event with Nats-Msg-Id set to its ID and never publishes a rolled-back one', async () => {
      const committed = await db.inTransaction((tx) => outbox.add(tx, { topic: nats.subject('orders'), payload: { order: 1 } }))
      await expect(
        db.inTransaction(async (tx) => {
          await outbox.add(tx, { topic: nats.subject('orders'), payload: { order: 2 } })
          throw new Error('business rule failed')
        }),
      ).rejects.toThrow('business rule failed')
      const relay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
      expect(await relay.runOnce()).toBe(1)
      expect(await relay.runOnce()).toBe(0)
      const [msg] = await readStream(nats, 2)
      expect(await nats.count()).toBe(1)
      expect(msg?.headers?.get('Nats-Msg-Id')).toBe(committed.id)
      expect(JSON.parse(new TextDecoder().decode(msg?.data))).toEqual({ order: 1 })
      expect(await outbox.stats()).toEqual({ pending: 0, sent: 1, dead: 0 })
    })

    it('adds no second event when a request is replayed: the ID is derived from its idempotency key', async () => {
      const event = { topic: 'orders.created', payload: { order: 7 }, idempotencyKey: 'req-7' }
      const first = await db.inTransaction((tx) => outbox.add(tx, event))
      const replay = await db.inTransaction((tx) => outbox.add(tx, event))
      const second = await db.inTransaction((tx) => outbox.add(tx, { ...event, n: 1 }))
      expect(first.created).toBe(true)
      expect(replay).toEqual({ id: first.id, created: false })
      expect(second.id).not.toBe(first.id)
      const explicit = await db.inTransaction((tx) => outbox.add(tx, { ...event, id: 'evt-1' }))
      expect(explicit.id).toBe('evt-1')
      expect((await outbox.stats()).pending).toBe(3)
    })

    it('refuses payloads JSON cannot carry and oversized payloads before writing anything', async () => {
      const small = db.outbox({ table, maxPayloadBytes: 100 })
      const cyclic: Record<string, unknown> = {}
      cyclic.self = cyclic
      const attempts = [
        { payload: { amount: 10n }, code: 'INVALID_ARGUMENT' },
        { payload: cyclic, code: 'INVALID_ARGUMENT' },
        { payload: undefined, code: 'INVALID_ARGUMENT' },
        { payload: 'x'.repeat(200), code: 'BODY_TOO_LARGE' },
      ]
      for (const { payload, code } of attempts) {
        await expect(db.inTransaction((tx) => small.add(tx, { topic: 't', payload }))).rejects.toMatchObject({
          name: 'IdempotencyError',
          code,
        })
      }
      expect(await outbox.stats()).toEqual({ pending: 0, sent: 0, dead: 0 })
    })

    it('keeps a row the broker did not confirm, retries it with backoff and dead-letters it after maxAttempts', async () => {
      // No stream listens on this subject: JetStream answers "no responders", nothing is stored.
      await db.inTransaction((tx) => outbox.add(tx, { topic: 'nowhere.orders', payload: { order: 1 } }))
      const events: RelayEvent[] = []
      const relay = new OutboxRelay({
        outbox,
        publisher: new NatsPublisher({ connection: nats.connection, timeout: '2s' }),
        maxAttempts: 2,
        backoffInitial: '1ms',
        onEvent: (e) => events.push(e),
      })
      expect(await relay.runOnce()).toBe(1)
      expect(await outbox.stats()).toEqual({ pending: 1, sent: 0, dead: 0 })
      await eventually(async () => (await relay.runOnce()) === 1, 'the backoff to end')
      expect(await outbox.stats()).toEqual({ pending: 0, sent: 0, dead: 1 })
      const failures = events.filter((e) => e.type === 'failed')
      expect(failures.map((e) => e.dead)).toEqual([false, true])
      expect(failures[0]?.error).toBeInstanceOf(IdempotencyError)
      expect(failures[0]?.error).toMatchObject({ name: 'IdempotencyError', code: 'STORE_UNAVAILABLE', reason: 'unroutable' })
      const rows = await db.query<{ last_error: string }>(`SELECT last_error FROM ${table}`)
      expect(rows[0]?.last_error).toMatch(/not confirmed/)
      expect(await outbox.retryDead()).toBe(1)
      expect(await outbox.stats()).toEqual({ pending: 1, sent: 0, dead: 0 })
    })

    it('lets two relays drain one backlog side by side without publishing any row twice', async () => {
      const total = 600
      await db.inTransaction(async (tx) => {
        for (let i = 0; i < total; i++) await outbox.add(tx, { topic: nats.subject('bulk'), payload: { i } })
      })
      const published = new Map<string, number>()
      const onEvent = (e: RelayEvent) => {
        if (e.type === 'published') for (const m of e.messages) published.set(m.id, (published.get(m.id) ?? 0) + 1)
      }
      const publisher = new NatsPublisher({ connection: nats.connection })
      const relays = [1, 2].map(
        (n) =>
          new OutboxRelay({
            outbox: db.outbox({ table, ordering: 'none' }),
            publisher,
            batchSize: 50,
            relayId: `r${n}`,
            onEvent,
          }),
      )
      const claimedBy = await Promise.all(
        relays.map(async (relay) => {
          let claimed = 0
          for (let n = await relay.runOnce(); n > 0; n = await relay.runOnce()) claimed += n
          return claimed
        }),
      )
      expect(claimedBy[0]! + claimedBy[1]!).toBe(total)
      expect(published.size).toBe(total)
      expect([...published.values()].every((n) => n === 1)).toBe(true)
      expect(await nats.count()).toBe(total)
    })

    it("publishes a dead relay's claimed batch once its lease has ended", async () => {
      await db.inTransaction(async (tx) => {
        for (let i = 0; i < 5; i++) await outbox.add(tx, { topic: nats.subject('lease'), payload: { i } })
      })
      const claimed = await outbox.storage().claim('dead-relay', 10, 1_500)
      expect(claimed).toHaveLength(5)
      const relay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
      expect(await relay.runOnce()).toBe(0)
      await eventually(async () => (await relay.runOnce()) === 5, 'the lease to end')
      expect(await outbox.stats()).toEqual({ pending: 0, sent: 5, dead: 0 })
      expect(await nats.count()).toBe(5)
    })

    it('purges sent rows past their age in bounded batches and leaves pending rows alone', async () => {
      await db.inTransaction(async (tx) => {
        for (let i = 0; i < 5; i++) await outbox.add(tx, { topic: nats.subject('purge'), payload: { i } })
      })
      const relay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
      expect(await relay.runOnce()).toBe(5)
      await db.inTransaction((tx) => outbox.add(tx, { topic: nats.subject('purge'), payload: 'later' }))
      expect(await outbox.purgeSent('1h')).toBe(0)
      await new Promise((resolve) => setTimeout(resolve, 20))
      expect(await outbox.purgeSent(1, { batchSize: 2 })).toBe(5)
      expect(await outbox.stats()).toEqual({ pending: 1, sent: 0, dead: 0 })
      await expect(outbox.purgeSent(1, { batchSize: 0 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
    })

    it('keeps per-partition order at the broker even when a publish in the middle fails', async () => {
      await db.inTransaction(async (tx) => {
        for (let i = 0; i < 30; i++)
          await outbox.add(tx, { topic: nats.subject('ordered'), payload: { p: i % 3, i }, partitionKey: `p${i % 3}` })
      })
      const real = new NatsPublisher({ connection: nats.connection })
      const failedOnce = new Set<string>()
      // Fault injection in front of the real broker: the 5th and 11th events fail on their first try.
      const flaky: Publisher = {
        name: 'flaky-nats',
        async publish(messages: readonly OutboxMessage[]) {
          const ok = messages.filter(
            (m) => !([4, 10].includes((JSON.parse(Buffer.from(m.payload).toString()) as { i: number }).i) && !failedOnce.has(m.id)),
          )
          const results = await real.publish(ok)
          return messages.map((m) => {
            const index = ok.indexOf(m)
            if (index >= 0) return results[index]!
            failedOnce.add(m.id)
            return { ok: false as const, error: new Error('injected failure'), retryable: true }
          })
        },
      }
      const relay = new OutboxRelay({ outbox, publisher: flaky, backoffInitial: '1ms', batchSize: 8 })
      await eventually(async () => {
        await relay.runOnce()
        return (await outbox.stats()).sent === 30
      }, 'all 30 events to be sent')
      const order = (await readStream(nats, 30)).map((m) => JSON.parse(new TextDecoder().decode(m.data)) as { p: number; i: number })
      expect(order).toHaveLength(30)
      for (const p of [0, 1, 2]) {
        const seen = order.filter((e) => e.p === p).map((e) => e.i)
        expect(seen).toEqual([...seen].sort((a, b) => a - b))
      }
      expect(failedOnce.size).toBe(2)
    })

    it('claims no later event of a partition while an earlier one is leased or backing off, and claims it once that one is sent', async () => {
      await db.inTransaction(async (tx) => {
        for (const [id, partitionKey] of [
          ['a1', 'a'],
          ['a2', 'a'],
          ['b1', 'b'],
          ['b2', 'b'],
          ['c1', 'c'],
          ['free', undefined],
        ] as const)
          await outbox.add(tx, { id, topic: nats.subject('claims'), payload: id, ...(partitionKey ? { partitionKey } : {}) })
      })
      const storage = outbox.storage()
      const ids = (messages: OutboxMessage[]) => messages.map((m) => m.id)
      const first = await storage.claim('relay-1', 1, 60_000)
      expect(ids(first)).toEqual(['a1'])
      const second = await storage.claim('relay-2', 1, 60_000)
      expect(ids(second)).toEqual(['b1'])
      // b1 fails and backs off: b2 stays blocked although nothing of b is leased any more.
      await storage.markFailed('relay-2', [{ seq: second[0]!.seq, error: 'nack', retryInMs: 60_000, dead: false }])
      expect(ids(await storage.claim('relay-3', 10, 60_000))).toEqual(['c1', 'free'])
      await storage.markSent([first[0]!.seq])
      expect(ids(await storage.claim('relay-4', 10, 60_000))).toEqual(['a2'])
    })

    it('lets two relays run side by side under partition ordering: no row published twice at once, each partition in order at the broker', async () => {
      await db.inTransaction(async (tx) => {
        for (let i = 0; i < 120; i++)
          await outbox.add(tx, { topic: nats.subject('two'), payload: { p: i % 4, i }, partitionKey: `p${i % 4}` })
      })
      // Each publish holds its batch a little, so the two relays' claims overlap in time.
      const inFlight = new Set<string>()
      const overlaps: string[] = []
      const real = new NatsPublisher({ connection: nats.connection })
      const slow: Publisher = {
        name: 'slow-nats',
        async publish(messages) {
          for (const m of messages) {
            if (inFlight.has(m.id)) overlaps.push(m.id)
            inFlight.add(m.id)
          }
          await new Promise((resolve) => setTimeout(resolve, 5))
          try {
            return await real.publish(messages)
          } finally {
            for (const m of messages) inFlight.delete(m.id)
          }
        },
      }
      const relays = [1, 2].map(
        (n) =>
          new OutboxRelay({
            outbox: db.outbox({ table }),
            publisher: slow,
            batchSize: 7,
            relayId: `r${n}`,
            pollInterval: '20ms',
            concurrency: 2,
          }),
      )
      for (const relay of relays) relay.start()
      try {
        await eventually(async () => (await outbox.stats()).sent === 120, 'both relays to send all 120 events')
      } finally {
        await Promise.all(relays.map((relay) => relay.stop()))
      }
      expect(overlaps).toEqual([])
      const order = (await readStream(nats, 120)).map((m) => JSON.parse(new TextDecoder().decode(m.data)) as { p: number; i: number })
      expect(order).toHaveLength(120)
      for (const p of [0, 1, 2, 3]) {
        const seen = order.filter((e) => e.p === p).map((e) => e.i)
        expect(seen).toEqual([...seen].sort((a, b) => a - b))
      }
    })

    it('stops after the batch in hand: that batch is marked sent, unclaimed rows stay pending for the next relay, nothing is lost or sent twice', async () => {
      await db.inTransaction(async (tx) => {
        for (let i = 0; i < 40; i++) await outbox.add(tx, { topic: nats.subject('stop'), payload: { i } })
      })
      const real = new NatsPublisher({ connection: nats.connection })
      let release = () => {}
      const held = new Promise<void>((resolve) => {
        release = resolve
      })
      let inPublish = () => {}
      const publishing = new Promise<void>((resolve) => {
        inPublish = resolve
      })
      const published = new Map<string, number>()
      const count = (messages: readonly OutboxMessage[]) => {
        for (const m of messages) published.set(m.id, (published.get(m.id) ?? 0) + 1)
      }
      const heldOnce: Publisher = {
        name: 'held-nats',
        async publish(messages) {
          inPublish()
          await held
          count(messages)
          return real.publish(messages)
        },
      }
      const first = new OutboxRelay({ outbox, publisher: heldOnce, batchSize: 10 })
      first.start()
      await publishing
      const stopping = first.stop()
      release()
      await stopping
      expect(await outbox.stats()).toEqual({ pending: 30, sent: 10, dead: 0 })
      const counting: Publisher = {
        name: 'counting-nats',
        async publish(messages) {
          count(messages)
          return real.publish(messages)
        },
      }
      const second = new OutboxRelay({ outbox, publisher: counting, batchSize: 10 })
      for (let n = await second.runOnce(); n > 0; n = await second.runOnce()) {}
      expect(await outbox.stats()).toEqual({ pending: 0, sent: 40, dead: 0 })
      expect(published.size).toBe(40)
      expect([...published.values()].every((n) => n === 1)).toBe(true)
      expect(await nats.count()).toBe(40)
    })

    it('applies a message once: a redelivery is skipped, the same ID with another payload is flagged, a failed effect leaves no trace', async () => {
      const ledger = db.table('ledger')
      await db.query(`CREATE TABLE IF NOT EXISTS ${ledger} (message_id varchar(255), amount int)`)
      const events: string[] = []
      const inbox = db.inbox({ consumer: 'billing', table: db.table('inbox'), retention: '1ms', onEvent: (e) => events.push(e.type) })
      await inbox.migrate()
      await inbox.migrate()
      const effect = (tx: unknown, amount: number) => db.exec(tx, `INSERT INTO ${ledger} VALUES ($1, $2)`, ['m1', amount])
      const message = { id: 'm1', payload: '{"amount":5}' }
      expect(await inbox.handle(message, (tx) => effect(tx, 5).then(() => 'done'))).toEqual({ status: 'applied', value: 'done' })
      expect(await inbox.handle(message, (tx) => effect(tx, 5))).toEqual({ status: 'duplicate' })
      await expect(inbox.handle({ id: 'm1', payload: '{"amount":6}' }, (tx) => effect(tx, 6))).rejects.toBeInstanceOf(InboxMismatchError)
      await expect(
        inbox.handle({ id: 'm2', payload: 'x' }, async () => {
          throw new Error('effect failed')
        }),
      ).rejects.toThrow('effect failed')
      expect(await inbox.handle({ id: 'm2', payload: 'x' }, async () => 'second try')).toEqual({ status: 'applied', value: 'second try' })
      expect(await db.query(`SELECT amount FROM ${ledger}`)).toEqual([{ amount: 5 }])
      expect(events).toEqual(['applied', 'duplicate', 'mismatch', 'applied'])
      // Retention 1 ms (0 is refused: it forgets IDs a redelivery may still bring): every processed ID may go.
      await new Promise((resolve) => setTimeout(resolve, 5))
      expect(await inbox.purge({ batchSize: 1 })).toBe(2)
    })

    it('handles a batch in one transaction: new IDs applied in order, known ones skipped, another payload flagged, a repeat inside the batch applied once', async () => {
      const inbox = db.inbox({ consumer: 'batch', table: db.table('inbox_batch') })
      await inbox.migrate()
      expect(await inbox.handle({ id: 'old', payload: 'a' }, () => 0)).toMatchObject({ status: 'applied' })
      const order: string[] = []
      const results = await inbox.handleBatch?.(
        [
          { id: 'n1', payload: '1' },
          { id: 'old', payload: 'a' },
          { id: 'old', payload: 'changed' },
          { id: 'n2', payload: '2' },
          { id: 'n1', payload: '1' },
        ],
        (_tx, m) => {
          order.push(m.id)
          return m.id
        },
      )
      expect(results?.map((r) => r.status)).toEqual(['applied', 'duplicate', 'mismatch', 'applied', 'duplicate'])
      expect(order).toEqual(['n1', 'n2'])
      await expect(
        inbox.handleBatch?.([{ id: 'n3', payload: '3' }], () => {
          throw new Error('effect failed')
        }),
      ).rejects.toThrow('effect failed')
      expect(await inbox.handle({ id: 'n3', payload: '3' }, () => 'applied after the rolled-back batch')).toMatchObject({
        status: 'applied',
      })
    })

    it('keeps message IDs exactly as given, whatever quotes, backslashes or SQL they hold: applied once, found again as duplicates', async () => {
      const inbox = db.inbox({ consumer: "it's \\ odd", table: db.table('inbox_quoting') })
      await inbox.migrate()
      const ids = ["it's", 'back\\slash', "\\'; DROP TABLE x; --", "E'x'", '$1', '{a,"b"}', 'NULL', 'ünïcödé ✓ 日本']
      const applied: string[] = []
      const batch = await inbox.handleBatch?.(
        ids.slice(0, 6).map((id) => ({ id, payload: id })),
        (_tx, m) => {
          applied.push(m.id)
        },
      )
      expect(batch?.map((r) => r.status)).toEqual(Array(6).fill('applied'))
      for (const id of ids.slice(6))
        expect(await inbox.handle({ id, payload: id }, (_tx, m) => applied.push(m.id))).toMatchObject({ status: 'applied' })
      expect(applied).toEqual(ids)
      for (const id of ids) expect(await inbox.handle({ id, payload: id }, () => applied.push('again'))).toEqual({ status: 'duplicate' })
      const again = await inbox.handleBatch?.(
        ids.map((id) => ({ id, payload: id })),
        () => {
          applied.push('again')
        },
      )
      expect(again?.map((r) => r.status)).toEqual(Array(ids.length).fill('duplicate'))
      await expect(inbox.handle({ id: ids[0] as string, payload: 'other' }, () => 0)).rejects.toBeInstanceOf(InboxMismatchError)
      expect(applied).toEqual(ids)
      // MySQL keeps the ID as bytes (varbinary): read as UTF-8.
      const stored = (await db.query(`SELECT message_id FROM ${db.table('inbox_quoting')}`)) as Array<{ message_id: string | Buffer }>
      expect(stored.map((row) => (Buffer.isBuffer(row.message_id) ? row.message_id.toString('utf8') : row.message_id)).sort()).toEqual(
        [...ids].sort(),
      )
    })

    it('handles two batches of the same IDs in opposite orders at once without a deadlock: each ID applied once', async () => {
      const inbox = db.inbox({ consumer: 'batches', table: db.table('inbox_batches') })
      await inbox.migrate()
      const messages = Array.from({ length: 60 }, (_, i) => ({ id: `id-${String(i).padStart(2, '0')}`, payload: `${i}` }))
      const applied: string[] = []
      const effect = async (_tx: unknown, m: { id: string }) => {
        applied.push(m.id)
      }
      const results = await Promise.all([inbox.handleBatch?.(messages, effect), inbox.handleBatch?.([...messages].reverse(), effect)])
      expect(applied.sort()).toEqual(messages.map((m) => m.id))
      const statuses = results.flatMap((batch) => batch?.map((r) => r.status) ?? [])
      expect(statuses.filter((s) => s === 'applied')).toHaveLength(60)
      expect(statuses.filter((s) => s === 'duplicate')).toHaveLength(60)
    })

    it("records a message ID inside the caller's own transaction: new once, duplicate after commit, new again after a rollback", async () => {
      const inbox = db.inbox({ consumer: 'own-tx', table: db.table('inbox_own') })
      await inbox.migrate()
      const message = { id: 'own-1', payload: '{"a":1}' }
      await expect(
        db.inTransaction(async (tx) => {
          expect(await inbox.record(tx, message)).toBe('new')
          throw new Error('effect failed')
        }),
      ).rejects.toThrow('effect failed')
      expect(await db.inTransaction((tx) => inbox.record(tx, message))).toBe('new')
      expect(await db.inTransaction((tx) => inbox.record(tx, message))).toBe('duplicate')
      await expect(db.inTransaction((tx) => inbox.record(tx, { id: 'own-1', payload: '{"a":2}' }))).rejects.toBeInstanceOf(
        InboxMismatchError,
      )
    })

    it('makes a second consumer of the same ID wait for the first one and then see a duplicate', async () => {
      const inbox = db.inbox({ consumer: 'race', table: db.table('inbox_race') })
      await inbox.migrate()
      let release = () => {}
      const held = new Promise<void>((resolve) => {
        release = resolve
      })
      let entered = () => {}
      const inside = new Promise<void>((resolve) => {
        entered = resolve
      })
      const first = inbox.handle({ id: 'same', payload: 'p' }, async () => {
        entered()
        await held
        return 'first'
      })
      await inside
      let secondDone = false
      const second = inbox
        .handle({ id: 'same', payload: 'p' }, () => 'second')
        .finally(() => {
          secondDone = true
        })
      await new Promise((resolve) => setTimeout(resolve, 200))
      expect(secondDone).toBe(false)
      release()
      expect(await first).toEqual({ status: 'applied', value: 'first' })
      expect(await second).toEqual({ status: 'duplicate' })
    })

    it('acks a JetStream message only after the transaction commits, so a failed effect is redelivered and applied once', async () => {
      await nats.addConsumer('billing', 1_000)
      const applied = db.table('applied_nats')
      await db.query(`CREATE TABLE ${applied} (message_id varchar(255) PRIMARY KEY)`)
      const inbox = db.inbox({ consumer: 'billing', table: db.table('inbox_nats') })
      await inbox.migrate()
      await db.inTransaction(async (tx) => {
        for (let i = 0; i < 3; i++) await outbox.add(tx, { topic: nats.subject('pay'), payload: { i } })
      })
      const relay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
      await relay.runOnce()
      await relay.runOnce() // nothing left; stream holds 3
      let failures = 0
      const errors: unknown[] = []
      const running = await consumeNats({
        connection: nats.connection,
        stream: nats.stream,
        consumer: 'billing',
        inbox,
        nakDelayMs: 10,
        onError: (e) => errors.push(e),
        handler: async (tx, message) => {
          await db.exec(tx, `INSERT INTO ${applied} VALUES ($1)`, [message.id])
          if (failures++ === 0) throw new Error('first effect fails after writing')
        },
      })
      try {
        await eventually(
          async () => Number((await db.query<{ n: unknown }>(`SELECT count(*) AS n FROM ${applied}`))[0]?.n) === 3,
          'three applied events',
        )
      } finally {
        await running.stop()
      }
      expect(errors).toHaveLength(1)
    })

    it(`answers STORE_UNAVAILABLE when ${database.name} refuses the connection, for the relay claim, the inbox and the outbox`, async () => {
      const down = db.down()
      try {
        const relay = new OutboxRelay({ outbox: down.outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
        await expect(relay.runOnce()).rejects.toMatchObject({ name: 'IdempotencyError', code: 'STORE_UNAVAILABLE' })
        await expect(down.inbox.handle({ id: 'm', payload: 'x' }, () => 1)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
        await expect(down.outbox.stats()).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
      } finally {
        await down.close()
      }
    })
  })
}

const pgSkip = databases.find((d) => d.dialect === 'postgres')?.skip ?? natsSkip

describe.skipIf(databases.find((d) => d.dialect === 'postgres')?.skip !== undefined)('PgOutbox when its connection is cut', () => {
  it('keeps the process up when the connection migrate() waits on is cut: STORE_UNAVAILABLE, and a server refusal stays STORE_SCHEMA', async () => {
    const db = await createSchema('outbox_cut')
    const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: 5432 })
    const proxied = new pg.Pool({ connectionString: PG_URL.replace(':5432/', `:${proxy.port}/`), max: 1 })
    proxied.on('error', () => {})
    try {
      const outbox = new PgOutbox({ pool: proxied, table: db.table('outbox') })
      await outbox.migrate()
      proxy.blackhole()
      const migrating = outbox.migrate().catch((error: unknown) => error)
      await proxy.held() // its BEGIN sent, unanswered
      // node-postgres emits the loss as 'error' on the client: with no listener, the process would crash.
      expect(proxy.cut()).toBe(1)
      expect(await migrating).toMatchObject({ code: 'STORE_UNAVAILABLE', message: expect.stringContaining('PgOutbox: migrate failed') })
      const refused = new PgOutbox({ pool: db.pool, table: 'no_such_schema_here.outbox' })
      await expect(refused.migrate()).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
    } finally {
      await proxied.end()
      await proxy.close()
      await db.drop()
    }
  }, 10_000)
})

describe.skipIf(pgSkip !== undefined)('outbox relay on PostgreSQL: LISTEN/NOTIFY and long names', () => {
  let db: TestSchema
  let nats: TestStream
  let outbox: PgOutbox
  let table: string

  beforeAll(async () => {
    db = await createSchema('outbox')
  })
  afterAll(async () => {
    await db?.drop()
  })
  beforeEach(async (context) => {
    nats = await createStream()
    table = db.table(`outbox_${context.task.id.replace(/[^A-Za-z0-9]/g, '').slice(-10)}`)
    outbox = new PgOutbox({ pool: db.pool, table })
    await outbox.migrate()
  })
  afterEach(async () => {
    await nats?.drop()
  })

  it('refuses a message ID holding a NUL character as invalid (the helpers reject it) rather than as a database outage', async () => {
    const inbox = new PgInbox({ pool: db.pool, consumer: 'nul', table: db.table('inbox_nul') })
    await inbox.migrate()
    const invalid = expect.objectContaining({ name: 'IdempotencyError', code: 'INVALID_ARGUMENT' })
    await expect(inbox.handle({ id: 'a\0b', payload: 'x' }, () => 0)).rejects.toEqual(invalid)
    await expect(
      inbox.handleBatch(
        [
          { id: 'ok', payload: 'x' },
          { id: 'a\0b', payload: 'x' },
        ],
        () => 0,
      ),
    ).rejects.toEqual(invalid)
    expect(() => new PgInbox({ pool: db.pool, consumer: 'a\0b' })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
  })

  it('wakes on LISTEN/NOTIFY when a transaction commits, without waiting for its poll', async () => {
    const sent: string[] = []
    const relay = new OutboxRelay({
      outbox,
      publisher: new NatsPublisher({ connection: nats.connection }),
      pollInterval: '10m',
      onEvent: (e) => {
        if (e.type === 'sent') sent.push(...e.messages.map((m) => m.id))
      },
    })
    relay.start()
    try {
      // Let the first (empty) poll pass so only a notification can wake the relay.
      await new Promise((resolve) => setTimeout(resolve, 300))
      const { id } = await inTransaction(db.pool, (tx) => outbox.add(tx, { topic: nats.subject('wake'), payload: 1 }))
      await eventually(() => sent.includes(id), 'the relay to publish after NOTIFY (its poll is 10 minutes)', 20_000)
    } finally {
      await relay.stop()
    }
  })

  it('adds, notifies and wakes the relay with schema and table names up to 63 bytes each (NOTIFY channel and index names fit)', async () => {
    // Issue 16: "<schema>_<table>_added" passed PostgreSQL's 63-byte limit, so every add() failed.
    const schema = `mcklong_${Math.random().toString(36).slice(2, 7)}_schema_name_padding_x`
    const longest = `s${'x'.repeat(55)}_${Math.random().toString(36).slice(2, 8)}`.slice(0, 63)
    await db.pool.query(`CREATE SCHEMA "${schema}"`)
    await db.pool.query(`CREATE SCHEMA "${longest}"`)
    try {
      for (const name of [`${schema}.outbox_events_of_the_billing_service`, `${longest}.${'t'.repeat(63)}`]) {
        const long = new PgOutbox({ pool: db.pool, table: name })
        expect(Buffer.byteLength(long.channel)).toBeLessThanOrEqual(63)
        await long.migrate()
        await long.migrate()
        const sent: string[] = []
        const relay = new OutboxRelay({
          outbox: long,
          publisher: new NatsPublisher({ connection: nats.connection }),
          pollInterval: '10m',
          onEvent: (e) => {
            if (e.type === 'sent') sent.push(...e.messages.map((m) => m.id))
          },
        })
        relay.start()
        try {
          await new Promise((resolve) => setTimeout(resolve, 300))
          const { id, created } = await inTransaction(db.pool, (tx) => long.add(tx, { topic: nats.subject('long'), payload: { name } }))
          expect(created).toBe(true)
          await eventually(
            () => sent.includes(id),
            'the relay to publish after NOTIFY on the shortened channel (its poll is 10 minutes)',
            20_000,
          )
        } finally {
          await relay.stop()
        }
      }
      // Two long names that share their first 63 bytes still get two channels.
      const a = new PgOutbox({ pool: db.pool, table: `${schema}.outbox_events_of_the_billing_service_a` })
      const b = new PgOutbox({ pool: db.pool, table: `${schema}.outbox_events_of_the_billing_service_b` })
      expect(a.channel).not.toBe(b.channel)
      // Short names keep the channel they always had.
      expect(new PgOutbox({ pool: db.pool, table: 'app.outbox' }).channel).toBe('app_outbox_added')
      expect(new PgOutbox({ pool: db.pool }).channel).toBe('idemkey_outbox_added')
    } finally {
      await db.pool.query(`DROP SCHEMA "${schema}" CASCADE`)
      await db.pool.query(`DROP SCHEMA "${longest}" CASCADE`)
    }
  })

  it('listens once the database answers when its first LISTEN failed (the relay started before the database was up)', async () => {
    // The pool refuses its first connection, as a database still starting does: the relay's LISTEN.
    let refusals = 1
    const flaky = {
      query: db.pool.query.bind(db.pool),
      connect: () => (refusals-- > 0 ? Promise.reject(new Error('connect ECONNREFUSED 127.0.0.1:5432')) : db.pool.connect()),
    } as unknown as pg.Pool
    const late = new PgOutbox({ pool: flaky, table })
    const sent: string[] = []
    const errors: unknown[] = []
    const relay = new OutboxRelay({
      outbox: late,
      publisher: new NatsPublisher({ connection: nats.connection }),
      pollInterval: '10m',
      onEvent: (e) => {
        if (e.type === 'sent') sent.push(...e.messages.map((m) => m.id))
        if (e.type === 'error') errors.push(e.error)
      },
    })
    relay.start()
    try {
      await eventually(() => errors.length > 0, 'the first LISTEN to fail')
      const listening = async () =>
        (await db.pool.query(`SELECT 1 FROM pg_stat_activity WHERE query = $1`, [`LISTEN "${late.channel}"`])).rows.length === 1
      await eventually(listening, 'the relay to LISTEN once the database answers', 10_000)
      const { id } = await inTransaction(db.pool, (tx) => late.add(tx, { topic: nats.subject('late'), payload: 1 }))
      await eventually(() => sent.includes(id), 'the relay to publish after NOTIFY (its poll is 10 minutes)', 10_000)
    } finally {
      await relay.stop()
    }
  })

  it('listens again after its LISTEN connection is killed, and publishes what was committed meanwhile', async () => {
    const sent: string[] = []
    const relay = new OutboxRelay({
      outbox,
      publisher: new NatsPublisher({ connection: nats.connection }),
      pollInterval: '10m',
      onEvent: (e) => {
        if (e.type === 'sent') sent.push(...e.messages.map((m) => m.id))
      },
    })
    relay.start()
    try {
      const listening = async () =>
        (await db.pool.query(`SELECT pid FROM pg_stat_activity WHERE query = $1`, [`LISTEN "${outbox.channel}"`])).rows as Array<{
          pid: number
        }>
      await eventually(async () => (await listening()).length === 1, 'the relay to LISTEN')
      const [{ pid }] = (await listening()) as [{ pid: number }]
      await db.pool.query('SELECT pg_terminate_backend($1)', [pid])
      const { id: during } = await inTransaction(db.pool, (tx) => outbox.add(tx, { topic: nats.subject('relisten'), payload: 1 }))
      await eventually(() => sent.includes(during), 'the relay to catch up after listening again (its poll is 10 minutes)', 20_000)
      await eventually(async () => (await listening()).some((row) => row.pid !== pid), 'a new LISTEN connection')
      const { id: after } = await inTransaction(db.pool, (tx) => outbox.add(tx, { topic: nats.subject('relisten'), payload: 2 }))
      await eventually(() => sent.includes(after), 'the relay to publish after the new NOTIFY', 20_000)
    } finally {
      await relay.stop()
    }
  })
})

const mysqlDatabase = databases.find((d) => d.dialect === 'mysql')

describe.skipIf(mysqlDatabase?.skip !== undefined)(
  'outbox and inbox on MySQL/MariaDB: schema errors, limits and data-layer transactions',
  () => {
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 })
    const prefix = `mxo_${Math.random().toString(36).slice(2, 8)}`
    const drop = async () => {
      const [rows] = await pool.query(
        'SELECT table_name AS name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?',
        [`${prefix}\\_%`],
      )
      for (const { name } of rows as Array<{ name: string }>) await pool.query(`DROP TABLE IF EXISTS \`${name}\``)
    }
    afterAll(async () => {
      await drop()
      await pool.end()
    })
    const inTx = async <T>(fn: (tx: mysql.PoolConnection) => Promise<T>): Promise<T> => {
      const connection = await pool.getConnection()
      try {
        await connection.query('START TRANSACTION')
        const value = await fn(connection)
        await connection.query('COMMIT')
        return value
      } catch (error) {
        await connection.query('ROLLBACK')
        throw error
      } finally {
        connection.release()
      }
    }

    it('reports a missing table as STORE_SCHEMA naming migrate(), for add, the relay claim, stats and the inbox', async () => {
      const outbox = new MySqlOutbox({ pool, table: `${prefix}_missing` })
      const inbox = new MySqlInbox({ pool, consumer: 'c', table: `${prefix}_missing_inbox` })
      const schemaError = (what: string) => ({
        name: 'IdempotencyError',
        code: 'STORE_SCHEMA',
        message: expect.stringContaining(`await ${what}.migrate()`),
      })
      await expect(inTx((tx) => outbox.add(tx, { topic: 't', payload: 1 }))).rejects.toMatchObject(schemaError('outbox'))
      await expect(outbox.storage().claim('r', 10, 1_000)).rejects.toMatchObject(schemaError('outbox'))
      await expect(outbox.stats()).rejects.toMatchObject(schemaError('outbox'))
      await expect(inbox.handle({ id: 'm', payload: 'x' }, () => 1)).rejects.toMatchObject(schemaError('inbox'))
      await expect(inTx((tx) => inbox.record(tx, { id: 'm', payload: 'x' }))).rejects.toMatchObject(schemaError('inbox'))
    })

    it('migrates idempotently from several processes at once and refuses a schema newer than it knows', async () => {
      const table = `${prefix}_concurrent`
      await Promise.all(Array.from({ length: 4 }, () => new MySqlOutbox({ pool, table }).migrate()))
      await Promise.all(Array.from({ length: 4 }, () => new MySqlInbox({ pool, consumer: 'c', table: `${table}_in` }).migrate()))
      const [rows] = await pool.query(`SELECT name, value FROM \`${table}_meta\` ORDER BY name`)
      expect(rows).toEqual([
        { name: 'claim_lock', value: '' },
        { name: 'schema_version', value: '1' },
      ])
      await pool.query(`UPDATE \`${table}_meta\` SET value = '99' WHERE name = 'schema_version'`)
      await expect(new MySqlOutbox({ pool, table }).migrate()).rejects.toMatchObject({
        code: 'STORE_SCHEMA',
        message: expect.stringContaining('Upgrade idemkey'),
      })
    })

    it('keeps IDs and partition keys byte for byte: IDs that differ only in case or a trailing space are two events', async () => {
      const outbox = new MySqlOutbox({ pool, table: `${prefix}_bytes` })
      await outbox.migrate()
      const ids = ['evt', 'EVT', 'evt ', 'évt']
      const added = await inTx(async (tx) => {
        const out = []
        for (const id of ids) out.push(await outbox.add(tx, { id, topic: 't', payload: id, partitionKey: id }))
        return out
      })
      expect(added.map((a) => a.created)).toEqual([true, true, true, true])
      const claimed = await outbox.storage().claim('r', 10, 60_000)
      expect(claimed.map((m) => [m.id, m.partitionKey])).toEqual(ids.map((id) => [id, id]))
      const inbox = new MySqlInbox({ pool, consumer: 'bytes', table: `${prefix}_bytes_in` })
      await inbox.migrate()
      for (const id of ids) expect(await inbox.handle({ id, payload: 'p' }, () => id)).toEqual({ status: 'applied', value: id })
    })

    it('refuses what its columns cannot hold and bad options with INVALID_ARGUMENT or INVALID_OPTION, before writing anything', async () => {
      const outbox = new MySqlOutbox({ pool, table: `${prefix}_limits` })
      await outbox.migrate()
      await expect(inTx((tx) => outbox.add(tx, { topic: 't', payload: 1, partitionKey: 'k'.repeat(1021) }))).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: expect.stringContaining('at most 1020'),
      })
      expect(await outbox.stats()).toEqual({ pending: 0, sent: 0, dead: 0 })
      const inbox = new MySqlInbox({ pool, consumer: 'c', table: `${prefix}_limits_in` })
      await expect(inbox.handle({ id: 'x'.repeat(1021), payload: 'p' }, () => 1)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
      const bad = [
        () => new MySqlOutbox({ pool, table: 'x; DROP TABLE y' }),
        () => new MySqlOutbox({ pool, table: 't'.repeat(60) }),
        () => new MySqlOutbox({ pool: {} as never }),
        () => new MySqlOutbox({ pool, ordering: 'random' as never }),
        () => new MySqlInbox({ pool, consumer: 'c'.repeat(256) }),
        () => new MySqlInbox({ pool, consumer: 'c', transactions: { ...rawTransactions(pool), dialect: 'postgres' } }),
      ]
      for (const make of bad) expect(make).toThrow(expect.objectContaining({ name: 'IdempotencyError', code: 'INVALID_OPTION' }))
    })

    it('claims at the session isolation level when the server refuses writes at READ COMMITTED (binlog_format = STATEMENT, 1665)', async () => {
      const table = `${prefix}_binlog`
      await new MySqlOutbox({ pool, table }).migrate()
      // Fault injection in front of the real server: a write after SET TRANSACTION … READ COMMITTED fails
      // as a statement-logging server answers it.
      let readCommittedSets = 0
      const statementLogging = {
        query: pool.query.bind(pool),
        execute: pool.execute.bind(pool),
        async getConnection() {
          const connection = await pool.getConnection()
          let readCommitted = false
          return {
            execute: connection.execute.bind(connection),
            release: () => connection.release(),
            async query(sql: string, values?: unknown[]) {
              if (sql.includes('READ COMMITTED')) {
                readCommittedSets++
                readCommitted = true
              }
              if (/^\s*(COMMIT|ROLLBACK)/.test(sql)) readCommitted = false
              if (readCommitted && /^\s*UPDATE/.test(sql)) {
                throw Object.assign(new Error('Binary logging not possible. Transaction level READ-COMMITTED is unsafe for STATEMENT'), {
                  errno: 1665,
                })
              }
              return connection.query(sql, values as never[])
            },
          }
        },
      }
      const outbox = new MySqlOutbox({ pool: statementLogging as never, table })
      await inTx((tx) => outbox.add(tx, { id: 'one', topic: 't', payload: 1 }))
      await inTx((tx) => outbox.add(tx, { id: 'two', topic: 't', payload: 2 }))
      const storage = outbox.storage()
      expect((await storage.claim('r', 1, 60_000)).map((m) => m.id)).toEqual(['one'])
      expect((await storage.claim('r', 1, 60_000)).map((m) => m.id)).toEqual(['two'])
      expect(readCommittedSets).toBe(1)
    })

    it('adds and records through a `transactions` adapter: the event and the message ID commit with the business write, or roll back with it', async () => {
      const transactions = rawTransactions(pool)
      const outbox = new MySqlOutbox({ pool, table: `${prefix}_tool`, transactions })
      const inbox = new MySqlInbox({ pool, consumer: 'tool', table: `${prefix}_tool_in`, transactions })
      await outbox.migrate()
      await inbox.migrate()
      const orders = `${prefix}_tool_orders`
      await pool.query(`CREATE TABLE \`${orders}\` (id VARCHAR(64) PRIMARY KEY) ENGINE = InnoDB`)
      const work = (key: string, fail: boolean) =>
        transactions.transaction(async (tx) => {
          expect(await inbox.record(tx, { id: `msg-${key}`, payload: 'p' })).toBe('new')
          await transactions.execute(tx, `INSERT INTO \`${orders}\` (id) VALUES (?)`, [key])
          const added = await outbox.add(tx, { topic: 'orders.created', payload: { key }, idempotencyKey: key })
          if (fail) throw new Error('rolled back on purpose')
          return added
        })
      expect(await work('kept', false)).toMatchObject({ created: true })
      await expect(work('dropped', true)).rejects.toThrow('on purpose')
      const [rows] = await pool.query(`SELECT id FROM \`${orders}\``)
      expect(rows).toEqual([{ id: 'kept' }])
      expect(await outbox.stats()).toEqual({ pending: 1, sent: 0, dead: 0 })
      expect(await transactions.transaction((tx) => inbox.record(tx, { id: 'msg-kept', payload: 'p' }))).toBe('duplicate')
      await expect(transactions.transaction((tx) => inbox.record(tx, { id: 'msg-kept', payload: 'other' }))).rejects.toBeInstanceOf(
        InboxMismatchError,
      )
      expect(await transactions.transaction((tx) => inbox.record(tx, { id: 'msg-dropped', payload: 'p' }))).toBe('new')
      // A replayed request adds nothing, through the tool too.
      expect(
        await transactions.transaction((tx) =>
          outbox.add(tx, { topic: 'orders.created', payload: { key: 'kept' }, idempotencyKey: 'kept' }),
        ),
      ).toMatchObject({ created: false })
    })
  },
)

/**
 * A `SqlTransactions` written the way a user would for a tool idemkey has no adapter for (here mysql2
 * itself, with the transaction object wrapped so it is not a connection): what the adapters in
 * `idemkey/knex`, `idemkey/drizzle`, … do.
 */
function rawTransactions(pool: mysql.Pool): SqlTransactions<{ connection: mysql.PoolConnection }> {
  return {
    tool: 'mysql2-wrapped',
    dialect: 'mysql',
    async transaction(fn) {
      const connection = await pool.getConnection()
      try {
        await connection.query('START TRANSACTION')
        const value = await fn({ connection })
        await connection.query('COMMIT')
        return value
      } catch (error) {
        await connection.query('ROLLBACK')
        throw error
      } finally {
        connection.release()
      }
    },
    async execute(tx, sql, values) {
      const [result] = await tx.connection.query(sql, values as never[])
      return { count: Number((result as { affectedRows?: number }).affectedRows ?? 0) }
    },
  }
}
