/**
 * The consumer helpers' concurrency against the real brokers (issue 16): messages of one partition
 * key applied in order while keys run in parallel, never more than `concurrency` effects at once,
 * acks only after the effect's commit (a commit that fails is not acked, comes back and is applied
 * once), and `stop()` waiting for the messages in hand.
 */
import { randomUUID } from 'node:crypto'
import amqp from 'amqplib'
import { Redis } from 'ioredis'
import { consumeNats, NatsPublisher } from '../src/messaging/brokers/nats/index.js'
import { consumeRabbitMq, RabbitMqPublisher } from '../src/messaging/brokers/rabbitmq/index.js'
import { consumeRedisStreams, RedisStreamsPublisher } from '../src/messaging/brokers/redis-streams/index.js'
import type { ConsumeOptions, RunningConsumer } from '../src/messaging/consumer-options.js'
import type { InboxMessage } from '../src/messaging/inbox/types.js'
import type { OutboxMessage } from '../src/messaging/outbox/index.js'
import { createStream } from './fixtures/messaging/nats.js'
import { eventually } from './fixtures/messaging/pg.js'
import { sqlDatabases, type TestDb, type TestInbox } from './fixtures/messaging/sql.js'
import { serviceSkipReason } from './helpers/services.js'

const databases = await sqlDatabases()
const skips = {
  nats: await serviceSkipReason('NATS', 4222),
  redis: await serviceSkipReason('Redis', 6379),
  rabbitmq: await serviceSkipReason('RabbitMQ', 5672),
}

type Options = Omit<ConsumeOptions<unknown>, 'inbox'> & { inbox: TestInbox }

/** One broker: publish messages (each with a `key` header), start its helper, say whether anything is left unacked. */
interface Harness {
  publish(messages: Array<{ id: string; key: string; payload: string }>): Promise<void>
  start(options: Options): Promise<RunningConsumer>
  /** Messages delivered and not acked, or not yet delivered. */
  outstanding(): Promise<number>
  /**
   * The IDs of the messages the helper dead-lettered (RabbitMQ: the dead-letter queue; Redis: the
   * dead-letter stream; NATS: terminated, seen by the advisory nats-server 2.10+ sends; undefined on an
   * older server, which announces no termination).
   */
  deadLettered(): Promise<string[] | undefined>
  drop(): Promise<void>
}

const byKey = (m: InboxMessage) => m.headers?.key ?? null

function outboxMessage(id: string, topic: string, key: string, payload: string): OutboxMessage {
  return {
    id,
    topic,
    payload: Buffer.from(payload),
    contentType: 'application/json',
    headers: { key },
    partitionKey: key,
    seq: 1,
    attempts: 1,
    createdAtMs: Date.now(),
  }
}

const harnesses: Record<keyof typeof skips, () => Promise<Harness>> = {
  async nats() {
    const nats = await createStream()
    await nats.addConsumer('c', 1_000)
    const publisher = new NatsPublisher({ connection: nats.connection })
    const jsm = await nats.connection.jetstreamManager()
    // JetStream announces each terminated message (with its stream sequence) in an advisory.
    const terminated: number[] = []
    const advisories = nats.connection.subscribe(`$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.${nats.stream}.c`, {
      callback: (_, msg) => terminated.push((msg.json() as { stream_seq: number }).stream_seq),
    })
    await nats.connection.flush()
    return {
      async publish(messages) {
        // A subject per key: the helper's default partition key.
        const results = await publisher.publish(messages.map((m) => outboxMessage(m.id, nats.subject(`k.${m.key}`), m.key, m.payload)))
        expect(results.every((r) => r.ok)).toBe(true)
      },
      start: (options) => consumeNats({ connection: nats.connection, stream: nats.stream, consumer: 'c', nakDelayMs: 50, ...options }),
      async outstanding() {
        const info = await jsm.consumers.info(nats.stream, 'c')
        return info.num_pending + info.num_ack_pending
      },
      async deadLettered() {
        await nats.connection.flush()
        const [major = 0, minor = 0] = (nats.connection.info?.version ?? '').split('.').map(Number)
        if (major < 2 || (major === 2 && minor < 10)) return undefined
        const stored = await Promise.all(terminated.map((seq) => jsm.streams.getMessage(nats.stream, { seq })))
        return stored.map((m) => m.header.get('Nats-Msg-Id'))
      },
      drop: () => {
        advisories.unsubscribe()
        return nats.drop()
      },
    }
  },
  async redis() {
    const redis = new Redis(6379, '127.0.0.1')
    const reader = new Redis(6379, '127.0.0.1')
    const stream = `idemkey:test:consumers:${randomUUID()}`
    const publisher = new RedisStreamsPublisher({ redis })
    await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
    return {
      async publish(messages) {
        const results = await publisher.publish(messages.map((m) => outboxMessage(m.id, stream, m.key, m.payload)))
        expect(results.every((r) => r.ok)).toBe(true)
      },
      start: (options) =>
        consumeRedisStreams({
          redis: reader,
          stream,
          group: 'g',
          consumer: 'c1',
          blockMs: 100,
          claimIdleMs: 200,
          partitionKey: byKey,
          ...options,
        }),
      async outstanding() {
        const [pending] = (await redis.xpending(stream, 'g')) as [number]
        const groups = (await redis.xinfo('GROUPS', stream)) as unknown[][]
        const lag = groups[0]?.[groups[0].indexOf('lag') + 1]
        return Number(pending) + Number(lag ?? 0)
      },
      async deadLettered() {
        const entries = await redis.xrange(`${stream}:dead-letter`, '-', '+')
        return entries.map(([, fields]) => {
          expect(fields).toEqual(expect.arrayContaining(['dead-letter-stream', stream, 'dead-letter-group', 'g']))
          return fields[fields.indexOf('id') + 1] as string
        })
      },
      async drop() {
        await redis.del(stream, `${stream}:dead-letter`)
        redis.disconnect()
        reader.disconnect()
      },
    }
  },
  async rabbitmq() {
    const connection = await amqp.connect('amqp://guest:guest@127.0.0.1:5672')
    const queue = `idemkey.test.consumers.${randomUUID()}`
    const admin = await connection.createChannel()
    // Rejected messages go to `<queue>.dead` through the default exchange.
    await admin.assertQueue(`${queue}.dead`, { durable: false, autoDelete: false })
    await admin.assertQueue(queue, { durable: false, autoDelete: false, deadLetterExchange: '', deadLetterRoutingKey: `${queue}.dead` })
    const publisher = new RabbitMqPublisher({ channel: await connection.createConfirmChannel() })
    let channel: amqp.Channel | undefined
    return {
      async publish(messages) {
        const results = await publisher.publish(messages.map((m) => outboxMessage(m.id, queue, m.key, m.payload)))
        expect(results.every((r) => r.ok)).toBe(true)
      },
      async start(options) {
        channel = await connection.createChannel()
        return consumeRabbitMq({ channel, queue, requeueDelayMs: 50, partitionKey: byKey, ...options })
      },
      async outstanding() {
        // Unacked messages go back to the queue when their channel closes.
        await channel?.close().catch(() => {})
        channel = undefined
        return (await admin.checkQueue(queue)).messageCount
      },
      async deadLettered() {
        const ids: string[] = []
        for (let msg = await admin.get(`${queue}.dead`, { noAck: true }); msg; msg = await admin.get(`${queue}.dead`, { noAck: true }))
          ids.push(msg.properties.messageId as string)
        return ids
      },
      async drop() {
        await admin.deleteQueue(queue)
        await admin.deleteQueue(`${queue}.dead`)
        await connection.close()
      },
    }
  },
}

/** What is left unacked once the broker has applied the acks it received (asynchronously: up to a second). */
async function settledOutstanding(harness: Harness): Promise<number> {
  let outstanding = await harness.outstanding()
  for (let i = 0; i < 20 && outstanding > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    outstanding = await harness.outstanding()
  }
  return outstanding
}

/** A statement that holds the effect's transaction for `seconds`. */
const sleepSql = (db: TestDb, seconds: number) => (db.dialect === 'postgres' ? `SELECT pg_sleep(${seconds})` : `SELECT SLEEP(${seconds})`)

for (const database of databases) {
  describe.skipIf(database.skip !== undefined)(`consumer helpers with the inbox on ${database.name}`, () => {
    let db: TestDb
    beforeAll(async () => {
      db = await database.open('consumers')
    })
    afterAll(async () => {
      await db?.drop()
    })

    for (const broker of Object.keys(harnesses) as Array<keyof typeof skips>) {
      describe.skipIf(skips[broker] !== undefined)(`${broker} consumer helper, concurrently`, () => {
        let harness: Harness
        beforeEach(async () => {
          harness = await harnesses[broker]()
        })
        afterEach(async () => {
          await harness.drop()
        })

        /**
         * An inbox, a log table of committed effects (in commit order per key: one key's effects never
         * overlap), and `perKey` messages for each of `keys` keys, interleaved, each `{ key, n }`.
         */
        async function keyedRun(consumer: string, keys: number, perKey: number) {
          const name = `${broker}_${consumer}_${randomUUID().slice(0, 8)}`
          const inbox = db.inbox({ consumer, table: db.table(name) })
          await inbox.migrate()
          const log = db.table(`${name}_log`)
          const serial = db.dialect === 'postgres' ? 'bigserial' : 'bigint AUTO_INCREMENT'
          await db.query(`CREATE TABLE ${log} (seq ${serial} PRIMARY KEY, k varchar(16) NOT NULL, n int NOT NULL)`)
          const messages = Array.from({ length: keys * perKey }, (_, i) => {
            const key = `k${i % keys}`
            const n = Math.floor(i / keys)
            return { id: `${key}-${n}-${randomUUID()}`, key, payload: JSON.stringify({ key, n }) }
          })
          return { inbox, log, messages }
        }

        it('applies the messages of one key in order while keys interleave, with never more than `concurrency` effects at once', async () => {
          const name = `${broker}_order_${randomUUID().slice(0, 8)}`
          const inbox = db.inbox({ consumer: 'order', table: db.table(name) })
          await inbox.migrate()
          const keys = 8
          const perKey = 20
          const messages = Array.from({ length: keys * perKey }, (_, i) => {
            const key = `k${i % keys}`
            const n = Math.floor(i / keys)
            return { id: `${key}-${n}-${randomUUID()}`, key, payload: JSON.stringify({ key, n }) }
          })
          await harness.publish(messages)
          const applied: Array<{ key: string; n: number }> = []
          let active = 0
          let maxActive = 0
          const running = await harness.start({
            inbox,
            concurrency: 4,
            batchSize: 3,
            async handler(tx, m) {
              active++
              maxActive = Math.max(maxActive, active)
              try {
                await db.exec(tx, sleepSql(db, 0.002))
                applied.push(JSON.parse(Buffer.from(m.payload).toString()) as { key: string; n: number })
              } finally {
                active--
              }
            },
          })
          await eventually(() => applied.length === messages.length, 'every message to be applied')
          await running.stop()
          for (let k = 0; k < keys; k++) {
            expect(applied.filter((a) => a.key === `k${k}`).map((a) => a.n)).toEqual(Array.from({ length: perKey }, (_, n) => n))
          }
          expect(maxActive).toBeLessThanOrEqual(4)
          expect(maxActive).toBeGreaterThan(1)
          // Keys interleave: the first messages applied are not all of one key.
          expect(new Set(applied.slice(0, keys).map((a) => a.key)).size).toBeGreaterThan(1)
          expect(await harness.outstanding()).toBe(0)
        })

        it(`acks only after the commit: a message whose ${database.dialect === 'postgres' ? 'commit' : 'transaction'} fails is not acked, comes back and is applied once`, async () => {
          const name = `${broker}_ack_${randomUUID().slice(0, 8)}`
          const inbox = db.inbox({ consumer: 'ack', table: db.table(name) })
          await inbox.migrate()
          const effects = db.table(`${name}_effects`)
          // PostgreSQL: a deferred unique constraint, so the effect's INSERT passes and the COMMIT fails.
          // MySQL has no deferred constraints: there the INSERT fails inside the effect, after the log row
          // was written, and the inbox must roll that row back.
          const deferred = db.dialect === 'postgres' ? ' DEFERRABLE INITIALLY DEFERRED' : ''
          await db.query(`CREATE TABLE ${effects} (id varchar(255), UNIQUE (id)${deferred})`)
          await db.query(`CREATE TABLE ${effects}_log (id varchar(255))`)
          const messages = Array.from({ length: 30 }, (_, i) => ({ id: `m${i}-${randomUUID()}`, key: `k${i % 3}`, payload: `{"i":${i}}` }))
          const victim = messages[7]?.id as string
          await db.query(`INSERT INTO ${effects} (id) VALUES ('poison')`)
          let victimCalls = 0
          const errors: unknown[] = []
          const running = await harness.start({
            inbox,
            concurrency: 3,
            onError: (error) => errors.push(error),
            async handler(tx, m) {
              await db.exec(tx, `INSERT INTO ${effects}_log (id) VALUES ($1)`, [m.id])
              if (m.id === victim && ++victimCalls <= 2) await db.exec(tx, `INSERT INTO ${effects} (id) VALUES ('poison')`)
              else await db.exec(tx, `INSERT INTO ${effects} (id) VALUES ($1)`, [m.id])
            },
          })
          await harness.publish(messages)
          await eventually(async () => {
            const rows = await db.query<{ n: unknown }>(`SELECT count(*) AS n FROM ${effects}`)
            return Number(rows[0]?.n) === messages.length + 1
          }, 'every effect to commit')
          await running.stop()
          const rows = await db.query<{ n: unknown }>(`SELECT id, count(*) AS n FROM ${effects}_log GROUP BY id`)
          // Every logged effect committed exactly once (rolled-back attempts left no log row).
          expect(rows).toHaveLength(messages.length)
          expect(rows.every((r) => Number(r.n) === 1)).toBe(true)
          expect(victimCalls).toBeGreaterThanOrEqual(3)
          expect(errors.length).toBeGreaterThanOrEqual(1)
          expect(await harness.outstanding()).toBe(0)
        })

        it('never applies a later message of a key before an earlier one that failed: the key is held until it comes back', async () => {
          const { inbox, log, messages } = await keyedRun('hold', 3, 10)
          const keys = 3
          const perKey = 10
          const victim = messages.find((m) => m.key === 'k1' && m.payload.includes('"n":2'))?.id as string
          let victimCalls = 0
          await harness.publish(messages)
          const running = await harness.start({
            inbox,
            concurrency: 3,
            async handler(tx, m) {
              if (m.id === victim && ++victimCalls <= 2) throw new Error('injected: the effect fails on its first two attempts')
              const { key, n } = JSON.parse(Buffer.from(m.payload).toString()) as { key: string; n: number }
              await db.exec(tx, `INSERT INTO ${log} (k, n) VALUES ($1, $2)`, [key, n])
            },
          })
          await eventually(async () => {
            const rows = await db.query<{ n: unknown }>(`SELECT count(*) AS n FROM ${log}`)
            return Number(rows[0]?.n) === messages.length
          }, 'every message to be applied')
          await running.stop()
          const rows = await db.query<{ k: string; n: number }>(`SELECT k, n FROM ${log} ORDER BY seq`)
          for (let k = 0; k < keys; k++) {
            expect(rows.filter((r) => r.k === `k${k}`).map((r) => r.n)).toEqual(Array.from({ length: perKey }, (_, n) => n))
          }
          expect(victimCalls).toBe(3)
          expect(await settledOutstanding(harness)).toBe(0)
        })

        it('gives up on a message whose effect always fails after maxAttempts: dead-lettered, reported once, and the rest of its key applied in order', async () => {
          const { inbox, log, messages } = await keyedRun('dead', 2, 6)
          const poison = messages.find((m) => m.key === 'k0' && m.payload.includes('"n":1'))?.id as string
          let poisonCalls = 0
          const exhausted: Array<{ code?: string; id: string }> = []
          await harness.publish(messages)
          const running = await harness.start({
            inbox,
            concurrency: 2,
            // One message per transaction: a batch that fails runs its messages again one by one, which
            // would call the poison handler twice per delivery.
            batchSize: 1,
            maxAttempts: 3,
            onError: (error, m) => {
              if ((error as { code?: string }).code === 'RETRIES_EXHAUSTED') exhausted.push({ code: 'RETRIES_EXHAUSTED', id: m.id })
            },
            async handler(tx, m) {
              if (m.id === poison) {
                poisonCalls++
                throw new Error('injected: this effect always fails')
              }
              const { key, n } = JSON.parse(Buffer.from(m.payload).toString()) as { key: string; n: number }
              await db.exec(tx, `INSERT INTO ${log} (k, n) VALUES ($1, $2)`, [key, n])
            },
          })
          await eventually(async () => {
            const rows = await db.query<{ n: unknown }>(`SELECT count(*) AS n FROM ${log}`)
            return Number(rows[0]?.n) === messages.length - 1 && exhausted.length > 0
          }, 'every other message to be applied and the poison one given up')
          // Given up for good: it does not come back (the redelivery delays here are 50-200 ms).
          await new Promise((resolve) => setTimeout(resolve, 500))
          await running.stop()
          expect(poisonCalls).toBe(3)
          expect(exhausted).toEqual([{ code: 'RETRIES_EXHAUSTED', id: poison }])
          const rows = await db.query<{ k: string; n: number }>(`SELECT k, n FROM ${log} ORDER BY seq`)
          expect(rows.filter((r) => r.k === 'k0').map((r) => r.n)).toEqual([0, 2, 3, 4, 5])
          expect(rows.filter((r) => r.k === 'k1').map((r) => r.n)).toEqual([0, 1, 2, 3, 4, 5])
          let dead = await harness.deadLettered()
          for (let i = 0; i < 20 && dead?.length === 0; i++) {
            await new Promise((resolve) => setTimeout(resolve, 50))
            dead = await harness.deadLettered()
          }
          if (dead !== undefined) expect(dead).toEqual([poison])
          expect(await settledOutstanding(harness)).toBe(0)
        })

        it('counts maxAttempts across a restart: the failures recorded in the inbox carry over to the next consumer process', async () => {
          const { inbox, messages } = await keyedRun('restart', 1, 1)
          const poison = (messages[0] as { id: string }).id
          let poisonCalls = 0
          const exhausted: string[] = []
          const options = {
            inbox,
            batchSize: 1,
            maxAttempts: 3,
            onError: (error: unknown, m: { id: string }) => {
              if ((error as { code?: string }).code === 'RETRIES_EXHAUSTED') exhausted.push(m.id)
            },
            handler() {
              poisonCalls++
              throw new Error('injected: this effect always fails')
            },
          }
          await harness.publish(messages)
          const first = await harness.start(options)
          // Polled often: the next delivery comes 50 ms or more after a failure (the harnesses' delays).
          await eventually(() => poisonCalls >= 2, 'two failed attempts', 10_000, 5)
          await first.stop()
          const counted = poisonCalls
          // The next process: the attempts left are what the inbox has not recorded yet.
          const next = await harness.start(options)
          await eventually(() => exhausted.length > 0, 'the message given up on', 10_000)
          await new Promise((resolve) => setTimeout(resolve, 300))
          await next.stop()
          expect(counted).toBe(2)
          expect(poisonCalls).toBe(3)
          expect(exhausted).toEqual([poison])
          let dead = await harness.deadLettered()
          for (let i = 0; i < 20 && dead?.length === 0; i++) {
            await new Promise((resolve) => setTimeout(resolve, 50))
            dead = await harness.deadLettered()
          }
          if (dead !== undefined) expect(dead).toEqual([poison])
        })

        it('stop() waits for the effects in hand, which commit and are acked', async () => {
          const name = `${broker}_stop_${randomUUID().slice(0, 8)}`
          const inbox = db.inbox({ consumer: 'stop', table: db.table(name) })
          await inbox.migrate()
          const messages = Array.from({ length: 6 }, (_, i) => ({ id: `s${i}-${randomUUID()}`, key: `k${i}`, payload: `{"i":${i}}` }))
          let started = 0
          let finished = 0
          const running = await harness.start({
            inbox,
            concurrency: 6,
            batchSize: 1,
            async handler(tx) {
              started++
              await db.exec(tx, sleepSql(db, 0.3))
              finished++
            },
          })
          await harness.publish(messages)
          await eventually(() => started === messages.length, 'every effect to start')
          await running.stop()
          expect(finished).toBe(messages.length)
          // The server applies acks it received asynchronously: give its bookkeeping a moment to show them.
          expect(await settledOutstanding(harness)).toBe(0)
        })
      })
    }
  })
}
