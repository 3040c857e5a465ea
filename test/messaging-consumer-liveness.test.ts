/**
 * Consumer helpers against real brokers with an inbox in memory: what happens to an entry the helper
 * cannot read, to a stream that lost its consumer group, and to a consumer whose channel closed.
 */
import { randomUUID } from 'node:crypto'
import amqp from 'amqplib'
import { Redis } from 'ioredis'
import { IdempotencyError, isIdempotencyError } from '../src/errors.js'
import type { Inbox, InboxMessage } from '../src/messaging/inbox/types.js'
import { consumeRabbitMq } from '../src/messaging/publishers/rabbitmq/index.js'
import { consumeRedisStreams } from '../src/messaging/publishers/redis-streams/index.js'
import { eventually } from './fixtures/messaging/pg.js'
import { serviceSkipReason } from './helpers/services.js'

const skips = {
  redis: await serviceSkipReason('Redis', 6379),
  rabbitmq: await serviceSkipReason('RabbitMQ', 5672),
}

/** An inbox in memory: applies each ID once, refuses a message without ID as the real ones do. */
function memoryInbox(): Inbox<undefined> & { applied: string[] } {
  const applied: string[] = []
  return {
    consumer: 'liveness',
    applied,
    async handle(message, effect) {
      if (!message.id) throw new IdempotencyError('INVALID_ARGUMENT', 'no message ID')
      if (applied.includes(message.id)) return { status: 'duplicate' }
      const value = await effect(undefined, message)
      applied.push(message.id)
      return { status: 'applied', value }
    },
  }
}

describe.skipIf(skips.redis !== undefined)('consumeRedisStreams: an entry it cannot read', () => {
  it('acks and reports an entry whose headers are not JSON, instead of leaving it pending for ever', async () => {
    const redis = new Redis(6379, '127.0.0.1')
    const reader = new Redis(6379, '127.0.0.1')
    const stream = `idemkey:test:liveness:${randomUUID()}`
    onTestFinished(async () => {
      await redis.del(stream)
      redis.disconnect()
      reader.disconnect()
    })
    await redis.xadd(stream, '*', 'id', 'bad-1', 'payload', 'x', 'headers', '{not json')
    await redis.xadd(stream, '*', 'id', 'good-1', 'payload', 'y')
    const inbox = memoryInbox()
    const errors: Array<{ error: unknown; message: InboxMessage }> = []
    const running = await consumeRedisStreams({
      redis: reader,
      stream,
      group: 'g',
      consumer: 'c1',
      blockMs: 100,
      claimIdleMs: 200,
      inbox,
      handler: () => {},
      onError: (error, message) => errors.push({ error, message }),
    })
    await eventually(
      async () => {
        const [pending] = (await redis.xpending(stream, 'g')) as [number]
        return inbox.applied.includes('good-1') && Number(pending) === 0
      },
      'the good entry applied and nothing left pending',
      5_000,
    )
    await running.stop()
    expect(inbox.applied).toEqual(['good-1'])
    const refused = errors.find((e) => e.message.id === 'bad-1')
    expect(isIdempotencyError(refused?.error) && refused.error.code).toBe('INVALID_ARGUMENT')
  })
})

describe.skipIf(skips.redis !== undefined)('consumeRedisStreams: a stream that lost its group', () => {
  it('creates its group again when Redis lost it (a restart without persistence) and consumes what comes next', async () => {
    const redis = new Redis(6379, '127.0.0.1')
    const reader = new Redis(6379, '127.0.0.1')
    const stream = `idemkey:test:liveness:${randomUUID()}`
    onTestFinished(async () => {
      await redis.del(stream)
      redis.disconnect()
      reader.disconnect()
    })
    const inbox = memoryInbox()
    const running = await consumeRedisStreams({
      redis: reader,
      stream,
      group: 'g',
      consumer: 'c1',
      blockMs: 100,
      claimIdleMs: 200,
      inbox,
      handler: () => {},
      onError: () => {},
    })
    await redis.xadd(stream, '*', 'id', 'before', 'payload', 'x')
    await eventually(() => inbox.applied.includes('before'), 'the first entry applied')
    // What a Redis restart without AOF or RDB leaves: no stream, no group. The producers go on writing.
    await redis.del(stream)
    await redis.xadd(stream, '*', 'id', 'after', 'payload', 'y')
    await eventually(() => inbox.applied.includes('after'), 'the entry written after the loss applied', 5_000)
    await running.stop()
  })
})

describe.skipIf(skips.rabbitmq !== undefined)('consumeRabbitMq: a channel the broker closed', () => {
  it('resolves done when its channel closes, so a supervisor can start a new consumer', async () => {
    const connection = await amqp.connect('amqp://guest:guest@127.0.0.1:5672')
    onTestFinished(() => connection.close().catch(() => {}))
    const queue = `idemkey.test.liveness.${randomUUID()}`
    const admin = await connection.createChannel()
    await admin.assertQueue(queue, { durable: false, autoDelete: true })
    const channel = await connection.createChannel()
    channel.on('error', () => {}) // the 404 below closes it
    const running = await consumeRabbitMq({ channel, queue, inbox: memoryInbox(), handler: () => {}, probeMessageTtl: false })
    // Any channel-level error closes the channel, and with it the consumer, as a broker restart does.
    await channel.checkQueue(`idemkey.test.missing.${randomUUID()}`).catch(() => {})
    const outcome = await Promise.race([
      running.done.then(() => 'done'),
      new Promise((resolve) => setTimeout(() => resolve('still waiting'), 2_000)),
    ])
    expect(outcome).toBe('done')
    await running.stop()
    await admin.deleteQueue(queue)
  })
})
