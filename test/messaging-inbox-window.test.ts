/**
 * The inbox window against the broker's horizon: a consumer helper whose inbox forgets IDs sooner
 * than the broker can still deliver a message (a JetStream stream's max_age, a RabbitMQ queue's
 * message TTL, a Redis stream's trimming by time) warns once, by name (IDEMKEY_INBOX_WINDOW); one whose
 * retention covers the horizon, or a broker without one, does not.
 */
import { randomUUID } from 'node:crypto'
import { DatabaseSync } from 'node:sqlite'
import amqp from 'amqplib'
import { Redis } from 'ioredis'
import { AckPolicy, connect, nanos } from 'nats'
import { consumeNats } from '../src/messaging/brokers/nats/index.js'
import { consumeRabbitMq } from '../src/messaging/brokers/rabbitmq/index.js'
import { parseInequivalence, readQueueMessageTtl } from '../src/messaging/brokers/rabbitmq/queue-ttl.js'
import { consumeRedisStreams, RedisStreamsPublisher } from '../src/messaging/brokers/redis-streams/index.js'
import { SqliteInbox } from '../src/messaging/inbox/index.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = {
  nats: await serviceSkipReason('NATS', 4222),
  rabbitmq: await serviceSkipReason('RabbitMQ', 5672),
  redis: await serviceSkipReason('Redis', 6379),
}

/** Collects the IDEMKEY_INBOX_WINDOW warnings emitted while `run` runs (and one turn after). */
async function windowWarnings(run: () => Promise<void>): Promise<string[]> {
  const warnings: string[] = []
  const onWarning = (warning: Error) => {
    if ((warning as Error & { code?: string }).code === 'IDEMKEY_INBOX_WINDOW') warnings.push(warning.message)
  }
  process.on('warning', onWarning)
  try {
    await run()
    // process.emitWarning delivers on the next tick.
    await new Promise((resolve) => setImmediate(resolve))
  } finally {
    process.off('warning', onWarning)
  }
  return warnings
}

/** A SQLite inbox (in `db`) keeping IDs for `retention`. */
function sqliteInbox(db: DatabaseSync, consumer: string, retention: string): SqliteInbox {
  const inbox = new SqliteInbox({ database: db, consumer, retention })
  inbox.migrate()
  return inbox
}

describe.skipIf(skip.nats !== undefined)('the inbox window against a JetStream stream max_age', () => {
  it('warns once, naming the inbox and the stream, when the inbox keeps IDs for less than max_age; not when it covers it', async () => {
    const connection = await connect({ servers: '127.0.0.1:4222' })
    const jsm = await connection.jetstreamManager()
    const name = `WINDOW_${randomUUID().slice(0, 8).toUpperCase()}`
    const bare = `${name}_NOAGE`
    await jsm.streams.add({ name, subjects: [`${name.toLowerCase()}.>`], max_age: nanos(2 * 3_600_000) })
    await jsm.streams.add({ name: bare, subjects: [`${bare.toLowerCase()}.>`] })
    for (const stream of [name, bare]) await jsm.consumers.add(stream, { durable_name: 'c', ack_policy: AckPolicy.Explicit })
    const warnings: Error[] = []
    const onWarning = (warning: Error) => {
      if ((warning as Error & { code?: string }).code === 'IDEMKEY_INBOX_WINDOW') warnings.push(warning)
    }
    process.on('warning', onWarning)
    const db = new DatabaseSync(':memory:')
    const inbox = (consumer: string, retention: string) => {
      const created = new SqliteInbox({ database: db, consumer, retention })
      created.migrate()
      return created
    }
    const start = (stream: string, consumer: string, retention: string) =>
      consumeNats({ connection, stream, consumer: 'c', inbox: inbox(consumer, retention), handler: () => undefined })
    try {
      const short = await start(name, 'billing-short', '1h')
      const again = await start(name, 'billing-short', '1h')
      const covered = await start(name, 'billing-covered', '3h')
      const unlimited = await start(bare, 'billing-unlimited', '1h')
      await new Promise((resolve) => setImmediate(resolve))
      expect(warnings.map((w) => w.message)).toEqual([
        expect.stringMatching(
          new RegExp(
            `^Inbox "billing-short" keeps processed message IDs for 1\\.0 h, but JetStream stream "${name}" \\(max_age\\) can redeliver a message for up to 2\\.0 h`,
          ),
        ),
      ])
      expect(warnings[0]?.message).toContain("retention: '2h'")
      for (const running of [short, again, covered, unlimited]) await running.stop()
    } finally {
      process.off('warning', onWarning)
      for (const stream of [name, bare]) await jsm.streams.delete(stream).catch(() => {})
      await connection.close()
      db.close()
    }
  })
})

describe.skipIf(skip.rabbitmq !== undefined)('the inbox window against a RabbitMQ queue message TTL', () => {
  it('warns once, naming the inbox and the queue, when the inbox keeps IDs for less than x-message-ttl; not when it covers it, nor without a TTL', async () => {
    const connection = await amqp.connect('amqp://guest:guest@127.0.0.1:5672')
    const admin = await connection.createChannel()
    const prefix = `h2-window-${randomUUID().slice(0, 8)}`
    const ttl = `${prefix}-ttl` // classic, durable, x-expires too: the probe adopts what differs
    const quorum = `${prefix}-quorum` // the probe adopts x-queue-type
    const bare = `${prefix}-bare`
    await admin.assertQueue(ttl, { durable: true, arguments: { 'x-message-ttl': 2 * 3_600_000, 'x-expires': 86_400_000 } })
    await admin.assertQueue(quorum, { durable: true, arguments: { 'x-queue-type': 'quorum', 'x-message-ttl': 2 * 3_600_000 } })
    await admin.assertQueue(bare, { durable: false })
    const db = new DatabaseSync(':memory:')
    const channels: amqp.Channel[] = []
    const start = async (queue: string, consumer: string, retention: string, more: object = {}) => {
      const channel = await connection.createChannel()
      channels.push(channel)
      return consumeRabbitMq({
        channel,
        queue,
        inbox: sqliteInbox(db, `${prefix}-${consumer}`, retention),
        handler: () => undefined,
        ...more,
      })
    }
    try {
      const warnings = await windowWarnings(async () => {
        const running = [
          await start(ttl, 'short', '1h'),
          await start(ttl, 'short', '1h'),
          await start(ttl, 'covered', '3h'),
          await start(quorum, 'quorum-short', '90m'),
          await start(bare, 'no-ttl', '1h'),
          await start(ttl, 'not-probed', '1h', { probeMessageTtl: false }),
          await start(bare, 'told', '1h', { redeliveryHorizon: '2h' }),
        ]
        for (const consumer of running) await consumer.stop()
      })
      expect(warnings).toEqual([
        expect.stringMatching(
          new RegExp(
            `^Inbox "${prefix}-short" keeps processed message IDs for 1\\.0 h, but RabbitMQ queue "${ttl}" \\(x-message-ttl\\) can redeliver a message for up to 2\\.0 h`,
          ),
        ),
        expect.stringMatching(
          new RegExp(`^Inbox "${prefix}-quorum-short" keeps .* for 1\\.5 h, but RabbitMQ queue "${quorum}" \\(x-message-ttl\\)`),
        ),
        expect.stringMatching(
          new RegExp(
            `^Inbox "${prefix}-told" keeps .* but RabbitMQ queue "${bare}" \\(redeliveryHorizon\\) can redeliver a message for up to 2\\.0 h`,
          ),
        ),
      ])
      expect(warnings[0]).toContain("retention: '2h'")
      // What the probe reads, and that it creates no queue and breaks no channel but its own.
      expect(await readQueueMessageTtl(admin, quorum)).toBe(2 * 3_600_000)
      expect(await readQueueMessageTtl(admin, bare)).toBeNull()
      // An exclusive queue of the helper's own connection is read too; a server-named one (amq.gen-…) cannot be declared at all.
      await admin.assertQueue(`${prefix}-own`, { exclusive: true, arguments: { 'x-message-ttl': 60_000 } })
      expect(await readQueueMessageTtl(admin, `${prefix}-own`)).toBe(60_000)
      const named = await admin.assertQueue('', { exclusive: true, arguments: { 'x-message-ttl': 60_000 } })
      expect(await readQueueMessageTtl(admin, named.queue)).toBeUndefined()
      expect(await readQueueMessageTtl(admin, `${prefix}-missing`)).toBeUndefined()
      const check = await connection.createChannel()
      check.on('error', () => {}) // NOT_FOUND closes it
      await expect(check.checkQueue(`${prefix}-missing`)).rejects.toThrow(/NOT_FOUND/)
    } finally {
      for (const channel of channels) await channel.close().catch(() => {})
      for (const queue of [ttl, quorum, bare]) await admin.deleteQueue(queue).catch(() => {})
      await connection.close()
      db.close()
    }
  })
})

describe.skipIf(skip.redis !== undefined)('the inbox window against a Redis stream trimmed by time', () => {
  it('warns once, naming the inbox and the stream, when the inbox keeps IDs for less than the maxAge the consumer is given; not when it covers it, nor without one', async () => {
    const redis = new Redis(6379, '127.0.0.1')
    const prefix = `h2-window-${randomUUID().slice(0, 8)}`
    const stream = `${prefix}:orders`
    const db = new DatabaseSync(':memory:')
    const clients: Redis[] = []
    const start = (consumer: string, retention: string, maxAge?: string) => {
      const client = redis.duplicate()
      clients.push(client)
      const inbox = sqliteInbox(db, `${prefix}-${consumer}`, retention)
      return consumeRedisStreams({
        redis: client,
        stream,
        group: consumer,
        consumer: 'c1',
        inbox,
        handler: () => undefined,
        blockMs: 50,
        maxAge,
      })
    }
    try {
      const warnings = await windowWarnings(async () => {
        const running = [
          await start('short', '1h', '2h'),
          await start('short', '1h', '2h'),
          await start('covered', '3h', '2h'),
          await start('untrimmed', '1h'),
        ]
        for (const consumer of running) await consumer.stop()
      })
      expect(warnings).toEqual([
        expect.stringMatching(
          new RegExp(
            `^Inbox "${prefix}-short" keeps processed message IDs for 1\\.0 h, but Redis stream "${stream}" \\(maxAge\\) can redeliver a message for up to 2\\.0 h`,
          ),
        ),
      ])
    } finally {
      for (const client of clients) client.disconnect()
      await redis.del(stream)
      redis.disconnect()
      db.close()
    }
  })

  it('the publisher with maxAge trims the stream by time (MINID): entries older than maxAge go, the new ones stay', async () => {
    const redis = new Redis(6379, '127.0.0.1')
    const stream = `h2-window-${randomUUID().slice(0, 8)}:trimmed`
    try {
      // 150 entries three hours old: more than one stream node (100 entries), which `~` trimming drops whole.
      const old = Date.now() - 3 * 3_600_000
      for (let i = 0; i < 150; i++) await redis.xadd(stream, `${old}-${i + 1}`, 'id', `old-${i}`)
      const publisher = new RedisStreamsPublisher({ redis, stream: () => stream, maxAge: '2h' })
      const [result] = await publisher.publish([
        {
          id: 'fresh',
          topic: 'orders',
          payload: new Uint8Array(),
          contentType: 'application/json',
          headers: {},
          partitionKey: null,
          seq: 1,
          attempts: 1,
          createdAtMs: Date.now(),
        },
      ])
      expect(result).toEqual({ ok: true })
      expect(await redis.xlen(stream)).toBeLessThan(151)
      const [[, fields] = []] = await redis.xrevrange(stream, '+', '-', 'COUNT', 1)
      expect(fields?.[1]).toBe('fresh')
      expect(() => new RedisStreamsPublisher({ redis, maxAge: '2h', maxLen: 10 })).toThrow(/maxLen or maxAge/)
    } finally {
      await redis.del(stream)
      redis.disconnect()
    }
  })
})

describe("reading RabbitMQ's refusal of an inequivalent queue declaration", () => {
  it('takes the property and its current value from each wording the broker uses', () => {
    const refusal = (tail: string) =>
      `Operation failed: QueueDeclare; 406 (PRECONDITION-FAILED) with message "PRECONDITION_FAILED - ${tail}"`
    expect(
      parseInequivalence(
        refusal(
          "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received none but current is the value '7200000' of type 'signedint'",
        ),
      ),
    ).toEqual({ field: 'x-message-ttl', current: '7200000', type: 'signedint' })
    expect(
      parseInequivalence(refusal("inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received '1' but current is '7200000'")),
    ).toEqual({
      field: 'x-message-ttl',
      current: '7200000',
      type: undefined,
    })
    expect(
      parseInequivalence(
        refusal("inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '1' of type 'byte' but current is none"),
      ),
    ).toEqual({ field: 'x-message-ttl', current: null, type: undefined })
    expect(
      parseInequivalence(refusal("inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'")),
    ).toEqual({
      field: 'durable',
      current: 'false',
      type: undefined,
    })
    expect(parseInequivalence('ACCESS_REFUSED - access to queue q in vhost / refused for user app')).toBeUndefined()
  })
})
