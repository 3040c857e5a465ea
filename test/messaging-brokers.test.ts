/**
 * Each publisher against its real broker: what it puts on the wire, that it reports only confirmed
 * messages as sent, and what happens when the broker refuses, returns or is unreachable.
 */
import { randomUUID } from 'node:crypto'
import amqp from 'amqplib'
import { Redis } from 'ioredis'
import { connect } from 'nats'
import { NatsPublisher } from '../src/messaging/brokers/nats/index.js'
import { consumeRabbitMq, RabbitMqPublisher } from '../src/messaging/brokers/rabbitmq/index.js'
import { consumeRedisStreams, RedisStreamsPublisher } from '../src/messaging/brokers/redis-streams/index.js'
import { type OutboxMessage, OutboxRelay, PublishError, PublishMismatchError, type RelayEvent } from '../src/messaging/outbox/index.js'
import { createStream } from './fixtures/messaging/nats.js'
import { eventually } from './fixtures/messaging/pg.js'
import { sqlDatabases, type TestDb } from './fixtures/messaging/sql.js'
import { serviceSkipReason } from './helpers/services.js'

const databases = await sqlDatabases()
const rabbitSkip = await serviceSkipReason('RabbitMQ', 5672)
const redisSkip = await serviceSkipReason('Redis', 6379)
const natsSkip = await serviceSkipReason('NATS', 4222)
const AMQP = 'amqp://guest:guest@127.0.0.1:5672'

function message(overrides: Partial<OutboxMessage> = {}): OutboxMessage {
  return {
    id: `m-${randomUUID()}`,
    topic: 'unused',
    payload: Buffer.from('{"amount":5}'),
    contentType: 'application/json',
    headers: { tenant: 'acme' },
    partitionKey: null,
    seq: 1,
    attempts: 1,
    createdAtMs: Date.now(),
    ...overrides,
  }
}

const dbs = new Map<string, TestDb>()
beforeAll(async () => {
  for (const database of databases) if (database.skip === undefined) dbs.set(database.name, await database.open('brokers'))
})
afterAll(async () => {
  for (const db of dbs.values()) await db.drop()
})

/** A case that keeps outbox rows or inbox IDs: run once per SQL database (PostgreSQL, MariaDB). */
function itOnEachDatabase(name: string, fn: (db: TestDb) => Promise<void>): void {
  for (const database of databases) {
    it.skipIf(database.skip !== undefined)(`${name} (${database.name})`, () => fn(dbs.get(database.name) as TestDb))
  }
}

describe.skipIf(rabbitSkip !== undefined)('RabbitMQ publisher and consumer', () => {
  let connection: amqp.ChannelModel
  let queue: string
  beforeEach(async () => {
    connection = await amqp.connect(AMQP)
    queue = `idemkey.test.${randomUUID()}`
    const ch = await connection.createChannel()
    await ch.assertQueue(queue, { durable: false })
    await ch.close()
  })
  afterEach(async () => {
    const ch = await connection.createChannel()
    await ch.deleteQueue(queue)
    await connection.close()
  })

  it('counts a message as sent on its publisher confirm, with messageId, headers and content type on the wire', async () => {
    const publisher = new RabbitMqPublisher({ channel: await connection.createConfirmChannel() })
    const sent = message({ topic: queue })
    expect(await publisher.publish([sent])).toEqual([{ ok: true }])
    const ch = await connection.createChannel()
    const got = await ch.get(queue, { noAck: true })
    if (got === false) throw new Error('the queue is empty: the confirmed message is not there')
    expect(got.properties.messageId).toBe(sent.id)
    expect(got.properties.headers).toMatchObject({ tenant: 'acme' })
    expect(got.properties.contentType).toBe('application/json')
    expect(got.content.toString()).toBe('{"amount":5}')
  })

  it('reports a message no queue takes as unroutable instead of confirmed, and fails a closed channel per message', async () => {
    const channel = await connection.createConfirmChannel()
    const publisher = new RabbitMqPublisher({ channel })
    const [lost, kept] = await publisher.publish([message({ topic: `no-such-queue-${randomUUID()}` }), message({ topic: queue })])
    expect(lost).toMatchObject({ ok: false, retryable: true })
    expect(lost?.ok === false && (lost.error as PublishError).reason).toBe('unroutable')
    expect(kept).toEqual({ ok: true })
    await channel.close()
    const results = await publisher.publish([message({ topic: queue }), message({ topic: queue })])
    expect(results.map((r) => r.ok)).toEqual([false, false])
    expect(results[0]?.ok === false && results[0].error).toBeInstanceOf(PublishError)
  })

  itOnEachDatabase(
    'reports a message the broker nacks (a full queue that rejects publishes) as nacked, and keeps its outbox row',
    async (db) => {
      const full = `idemkey.full.${randomUUID()}`
      const ch = await connection.createChannel()
      await ch.assertQueue(full, { durable: false, arguments: { 'x-max-length': 1, 'x-overflow': 'reject-publish' } })
      try {
        const outbox = db.outbox({ table: db.table('rabbit_nack_outbox'), ordering: 'none' })
        await outbox.migrate()
        await db.inTransaction(async (tx) => {
          for (let i = 0; i < 2; i++) await outbox.add(tx, { topic: full, payload: { i } })
        })
        const failures: Error[] = []
        const relay = new OutboxRelay({
          outbox,
          publisher: new RabbitMqPublisher({ channel: await connection.createConfirmChannel() }),
          onEvent: (e) => {
            if (e.type === 'failed') failures.push(e.error)
          },
        })
        await relay.runOnce()
        expect(await outbox.stats()).toEqual({ pending: 1, sent: 1, dead: 0 })
        expect(failures).toHaveLength(1)
        expect(failures[0]).toMatchObject({ code: 'STORE_UNAVAILABLE', reason: 'nacked' })
        expect((await ch.checkQueue(full)).messageCount).toBe(1)
      } finally {
        await ch.deleteQueue(full)
      }
    },
  )

  itOnEachDatabase('keeps outbox rows pending while the broker returns them, and sends them once a queue exists', async (db) => {
    const outbox = db.outbox({ table: db.table('rabbit_outbox') })
    await outbox.migrate()
    const late = `idemkey.late.${randomUUID()}`
    await db.inTransaction((tx) => outbox.add(tx, { topic: late, payload: { late: true } }))
    const relay = new OutboxRelay({
      outbox,
      publisher: new RabbitMqPublisher({ channel: await connection.createConfirmChannel() }),
      backoffInitial: '1ms',
    })
    await relay.runOnce()
    expect(await outbox.stats()).toMatchObject({ pending: 1, sent: 0 })
    const ch = await connection.createChannel()
    await ch.assertQueue(late, { durable: false, autoDelete: false })
    await eventually(async () => (await relay.runOnce()) === 1, 'the backoff to end')
    expect(await outbox.stats()).toMatchObject({ pending: 0, sent: 1 })
    expect((await ch.checkQueue(late)).messageCount).toBe(1)
    await ch.deleteQueue(late)
  })

  itOnEachDatabase('rejects a message whose ID was applied with another payload, reports it, and applies the rest once', async (db) => {
    const inbox = db.inbox({ consumer: 'rabbit', table: db.table('rabbit_inbox') })
    await inbox.migrate()
    const publisher = new RabbitMqPublisher({ channel: await connection.createConfirmChannel() })
    const id = `dup-${randomUUID()}`
    await publisher.publish([
      message({ id, topic: queue, payload: Buffer.from('{"v":1}') }),
      message({ id, topic: queue, payload: Buffer.from('{"v":1}') }),
      message({ id, topic: queue, payload: Buffer.from('{"v":2}') }),
    ])
    const applied: string[] = []
    const errors: unknown[] = []
    const running = await consumeRabbitMq({
      channel: await connection.createChannel(),
      queue,
      inbox,
      prefetch: 1,
      onError: (e) => errors.push(e),
      handler: (_tx, m) => {
        applied.push(Buffer.from(m.payload).toString())
      },
    })
    const ch = await connection.createChannel()
    await eventually(async () => (await ch.checkQueue(queue)).messageCount === 0 && errors.length === 1, 'the queue to drain')
    await running.stop()
    expect(applied).toEqual(['{"v":1}'])
    expect(errors[0]).toMatchObject({ code: 'FINGERPRINT_MISMATCH', messageId: id })
  })

  itOnEachDatabase('acks messages settled together with multiple acks, and leaves none unacked', async (db) => {
    const inbox = db.inbox({ consumer: 'rabbit-acks', table: db.table('rabbit_acks_inbox') })
    await inbox.migrate()
    const publisher = new RabbitMqPublisher({ channel: await connection.createConfirmChannel() })
    const sent = Array.from({ length: 300 }, (_, i) => message({ topic: queue, payload: Buffer.from(`{"i":${i}}`) }))
    expect((await publisher.publish(sent)).every((r) => r.ok)).toBe(true)
    const channel = await connection.createChannel()
    const frames = { single: 0, multiple: 0 }
    const ack = channel.ack.bind(channel)
    channel.ack = (msg, allUpTo) => {
      frames[allUpTo ? 'multiple' : 'single']++
      ack(msg, allUpTo)
    }
    let applied = 0
    const running = await consumeRabbitMq({ channel, queue, inbox, concurrency: 4, partitionKey: null, handler: () => void applied++ })
    await eventually(async () => applied === 300, 'every message to be applied')
    await running.stop()
    // Unacked messages go back to the queue when their channel closes: none may be left.
    await channel.close()
    const ch = await connection.createChannel()
    expect((await ch.checkQueue(queue)).messageCount).toBe(0)
    expect(frames.multiple).toBeGreaterThan(0)
    expect(frames.single + frames.multiple).toBeLessThan(300 / 2)
  })
})

describe.skipIf(redisSkip !== undefined)('Redis Streams publisher and consumer', () => {
  let redis: Redis
  let stream: string
  beforeEach(() => {
    redis = new Redis(6379, '127.0.0.1')
    stream = `idemkey:test:${randomUUID()}`
  })
  afterEach(async () => {
    await redis.del(stream)
    redis.disconnect()
  })

  it('writes the message ID, payload, content type and headers into the stream entry on XADD', async () => {
    const publisher = new RedisStreamsPublisher({ redis })
    const sent = message({ topic: stream })
    expect(await publisher.publish([sent])).toEqual([{ ok: true }])
    const entries = await redis.xrange(stream, '-', '+')
    expect(entries).toHaveLength(1)
    const fields = entries[0]?.[1] ?? []
    const map = Object.fromEntries(fields.flatMap((v, i) => (i % 2 === 0 ? [[v, fields[i + 1]]] : [])))
    expect(map).toEqual({ id: sent.id, payload: '{"amount":5}', 'content-type': 'application/json', headers: '{"tenant":"acme"}' })
  })

  it('fails every message of the batch as not confirmed when Redis refuses the connection', async () => {
    // Port 1 on loopback: nothing listens, the connection is refused.
    const down = new Redis(1, '127.0.0.1', {
      lazyConnect: true,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    })
    const results = await new RedisStreamsPublisher({ redis: down, timeout: '3s' }).publish([message(), message()])
    expect(results.map((r) => r.ok)).toEqual([false, false])
    expect(results[0]?.ok === false && results[0].error).toBeInstanceOf(PublishError)
    down.disconnect()
  })

  itOnEachDatabase('applies a republished entry once: the second copy with the same ID is skipped by the inbox', async (db) => {
    const inbox = db.inbox({ consumer: 'redis', table: db.table('redis_inbox') })
    await inbox.migrate()
    const publisher = new RedisStreamsPublisher({ redis })
    const sent = message({ topic: stream })
    await publisher.publish([sent])
    await publisher.publish([sent]) // a relay that died before marking the row sent
    const applied: string[] = []
    const reader = new Redis(6379, '127.0.0.1')
    const running = await consumeRedisStreams({
      redis: reader,
      stream,
      group: 'g',
      consumer: 'c1',
      inbox,
      blockMs: 200,
      handler: (_tx, m) => void applied.push(m.id),
    })
    await eventually(async () => {
      const [pending] = (await redis.xpending(stream, 'g')) as [number]
      const groups = (await redis.xinfo('GROUPS', stream)) as unknown[][]
      return Number(pending) === 0 && groups[0]?.[groups[0].indexOf('entries-read') + 1] === 2
    }, 'both entries to be read and acked')
    await running.stop()
    reader.disconnect()
    expect(applied).toEqual([sent.id])
  })
})

describe.skipIf(natsSkip !== undefined)('NATS publisher faults', () => {
  itOnEachDatabase(
    'flags a re-published ID with another payload inside the duplicate window instead of confirming it, and the relay dead-letters it',
    async (db) => {
      const nats = await createStream()
      try {
        const publisher = new NatsPublisher({ connection: nats.connection })
        const first = message({ topic: nats.subject('orders'), payload: Buffer.from('{"amount":5}') })
        expect(await publisher.publish([first])).toEqual([{ ok: true }])
        // The same message again (a relay that died before marking it sent): JetStream drops it, and so it is sent.
        expect(await publisher.publish([{ ...first, seq: 2, attempts: 2 }])).toEqual([{ ok: true }])
        // Same ID, other payload or content type: JetStream drops it too, but it is not the same event.
        const [other, binary] = await publisher.publish([
          { ...first, payload: Buffer.from('{"amount":6}') },
          { ...first, contentType: 'application/octet-stream' },
        ])
        for (const result of [other, binary]) {
          expect(result).toMatchObject({ ok: false, retryable: false })
          const error = (result as { error: Error }).error
          expect(error).toBeInstanceOf(PublishMismatchError)
          expect(error).toMatchObject({ code: 'FINGERPRINT_MISMATCH', messageId: first.id, broker: 'NATS' })
        }
        expect(await nats.count()).toBe(1)
        // What is not caught: once the stored copy is gone (acked from a work-queue stream, deleted,
        // past max_age) there is nothing to compare with, and JetStream still drops the new payload.
        const gone = message({ topic: nats.subject('gone') })
        expect(await publisher.publish([gone])).toEqual([{ ok: true }])
        const jsm = await nats.connection.jetstreamManager()
        await jsm.streams.deleteMessage(nats.stream, 2)
        expect(await publisher.publish([{ ...gone, payload: Buffer.from('{"amount":8}') }])).toEqual([{ ok: true }])
        expect(await nats.count()).toBe(1)

        // Through the relay: the row is dead-lettered at once and reported, not retried forever.
        const outbox = db.outbox({ table: db.table('nats_dup_outbox') })
        await outbox.migrate()
        await db.inTransaction((tx) => outbox.add(tx, { id: first.id, topic: nats.subject('orders'), payload: { amount: 7 } }))
        const failed: RelayEvent[] = []
        const relay = new OutboxRelay({
          outbox,
          publisher,
          onEvent: (e) => {
            if (e.type === 'failed') failed.push(e)
          },
        })
        expect(await relay.runOnce()).toBe(1)
        expect(await outbox.stats()).toEqual({ pending: 0, sent: 0, dead: 1 })
        expect(failed).toEqual([expect.objectContaining({ dead: true, error: expect.any(PublishMismatchError) })])
        expect(await relay.runOnce()).toBe(0)
        expect(await nats.count()).toBe(1)
      } finally {
        await nats.drop()
      }
    },
  )

  itOnEachDatabase(
    'dead-letters at once a message larger than the server max_payload, and fails a closed connection without losing rows',
    async (db) => {
      const nats = await createStream()
      try {
        const outbox = db.outbox({ table: db.table('nats_outbox'), maxPayloadBytes: 4 * 1024 * 1024 })
        await outbox.migrate()
        const maxPayload = nats.connection.info?.max_payload ?? 1024 * 1024
        await db.inTransaction((tx) => outbox.add(tx, { topic: nats.subject('big'), payload: new Uint8Array(maxPayload + 1) }))
        const relay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
        await relay.runOnce()
        expect(await outbox.stats()).toEqual({ pending: 0, sent: 0, dead: 1 })

        await db.inTransaction((tx) => outbox.add(tx, { topic: nats.subject('later'), payload: { ok: 1 } }))
        const closed = await connect({ servers: '127.0.0.1:4222' })
        await closed.close()
        const downRelay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: closed }), backoffInitial: '1ms' })
        await downRelay.runOnce()
        expect(await outbox.stats()).toEqual({ pending: 1, sent: 0, dead: 1 })
        const upRelay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection: nats.connection }) })
        await eventually(async () => (await upRelay.runOnce()) === 1, 'the backoff to end')
        expect(await outbox.stats()).toEqual({ pending: 0, sent: 1, dead: 1 })
        expect(await nats.count()).toBe(1)
      } finally {
        await nats.drop()
      }
    },
  )
})
