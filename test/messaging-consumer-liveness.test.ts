/**
 * Consumer helpers against real brokers with an inbox in memory: what happens to an entry the helper
 * cannot read, to a stream that lost its consumer group, and to a consumer whose channel closed.
 */
import { randomUUID } from 'node:crypto'
import amqp from 'amqplib'
import { Redis } from 'ioredis'
import { isIdempotencyError } from '../src/errors.js'
import { consumeRabbitMq } from '../src/messaging/brokers/rabbitmq/index.js'
import { consumeRedisStreams } from '../src/messaging/brokers/redis-streams/index.js'
import type { InboxMessage } from '../src/messaging/inbox/types.js'
import { eventually } from './fixtures/messaging/pg.js'
import { memoryInbox } from './helpers/memory-inbox.js'
import { serviceSkipReason } from './helpers/services.js'

const skips = {
  redis: await serviceSkipReason('Redis', 6379),
  rabbitmq: await serviceSkipReason('RabbitMQ', 5672),
}

/**
 * A stream of its own on the local Redis, deleted with `extraKeys` when the test ends: a client for the
 * test, and the consumer's options (its own client, for the blocking reads; short delays).
 */
function redisStream(...extraKeys: string[]) {
  const redis = new Redis(6379, '127.0.0.1')
  const reader = new Redis(6379, '127.0.0.1')
  const stream = `idemkey:test:liveness:${randomUUID()}`
  onTestFinished(async () => {
    await redis.del(stream, ...extraKeys.map((suffix) => `${stream}${suffix}`))
    redis.disconnect()
    reader.disconnect()
  })
  const options = { redis: reader, stream, group: 'g', consumer: 'c1', blockMs: 100, claimIdleMs: 200 }
  return { redis, stream, options }
}

describe.skipIf(skips.redis !== undefined)('consumeRedisStreams: an entry it cannot read', () => {
  it('acks and reports an entry whose headers are not JSON, instead of leaving it pending for ever', async () => {
    const { redis, stream, options } = redisStream()
    await redis.xadd(stream, '*', 'id', 'bad-1', 'payload', 'x', 'headers', '{not json')
    await redis.xadd(stream, '*', 'id', 'good-1', 'payload', 'y')
    const inbox = memoryInbox('liveness')
    const errors: Array<{ error: unknown; message: InboxMessage }> = []
    const running = await consumeRedisStreams({
      ...options,
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

describe.skipIf(skips.redis !== undefined)('consumeRedisStreams: a dead-lettering that fails', () => {
  it('leaves the entry pending (never acknowledged without its copy), and gives it up again at its next failure once the move can land', async () => {
    const { redis, stream, options } = redisStream(':dead-letter')
    const deadLetters = `${stream}:dead-letter`
    // A key of another type where the dead letters go: XADD fails there (WRONGTYPE).
    await redis.set(deadLetters, 'not a stream')
    const entryId = (await redis.xadd(stream, '*', 'id', 'poison-1', 'payload', 'x')) as string
    let calls = 0
    const exhausted: string[] = []
    const moveErrors: string[] = []
    const running = await consumeRedisStreams({
      ...options,
      maxAttempts: 2,
      inbox: memoryInbox('liveness'),
      handler: () => {
        calls++
        throw new Error('injected: this effect always fails')
      },
      onError: (error, message) => {
        if (isIdempotencyError(error) && error.code === 'RETRIES_EXHAUSTED') exhausted.push(message.id)
        else if (/WRONGTYPE/.test(String((error as Error).message))) moveErrors.push(message.id)
      },
    })
    await eventually(() => moveErrors.length > 0, 'the dead-letter move to fail', 5_000)
    // Still pending, not acknowledged: a MULTI went on past the failed XADD and acknowledged it.
    const pending = (await redis.xpending(stream, 'g', '-', '+', 10)) as Array<[string, string, number, number]>
    expect(pending.map(([id]) => id)).toEqual([entryId])
    await redis.del(deadLetters)
    await eventually(
      async () => (await redis.xlen(deadLetters)) === 1 && Number(((await redis.xpending(stream, 'g')) as [number])[0]) === 0,
      'the entry moved to the dead letters and acknowledged',
      5_000,
    )
    await running.stop()
    const moved = (await redis.xrange(deadLetters, '-', '+')) as Array<[string, string[]]>
    expect(moved.map(([, fields]) => fields)).toEqual([
      [
        'id',
        'poison-1',
        'payload',
        'x',
        'dead-letter-stream',
        stream,
        'dead-letter-entry',
        entryId,
        'dead-letter-group',
        'g',
        'dead-letter-consumer',
        'c1',
      ],
    ])
    // Two failures gave it up; after that, each failure gave it up again (one per failed move, then the
    // move that landed), instead of starting the count over.
    expect(exhausted.length).toBe(moveErrors.length + 1)
    expect(calls).toBe(1 + exhausted.length)
  })
})

describe.skipIf(skips.redis !== undefined)('consumeRedisStreams: maxDeliveries', () => {
  it('dead-letters without running an entry delivered more often than maxDeliveries (a consumer that died on it each time), and runs one within it', async () => {
    const { redis, stream, options } = redisStream(':dead-letter')
    await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
    const crasher = (await redis.xadd(stream, '*', 'id', 'crasher', 'payload', 'x')) as string
    const fine = (await redis.xadd(stream, '*', 'id', 'fine', 'payload', 'y')) as string
    // What consumers that died mid-effect leave: both read by one (1 delivery), then claimed again
    // by the next ones, the crasher three times (4 deliveries), the other once (2).
    await redis.xreadgroup('GROUP', 'g', 'dead-1', 'COUNT', 10, 'STREAMS', stream, '>')
    for (const id of [crasher, crasher, crasher, fine]) await redis.xclaim(stream, 'g', 'dead-2', 0, id)
    const ran: string[] = []
    const exhausted: string[] = []
    const running = await consumeRedisStreams({
      ...options,
      maxDeliveries: 3,
      inbox: memoryInbox('liveness'),
      handler: (_tx, message) => {
        ran.push(message.id)
      },
      onError: (error, message) => {
        if (isIdempotencyError(error) && error.code === 'RETRIES_EXHAUSTED') exhausted.push(`${message.id}: ${error.message}`)
      },
    })
    await eventually(
      async () => (await redis.xlen(`${stream}:dead-letter`)) === 1 && Number(((await redis.xpending(stream, 'g')) as [number])[0]) === 0,
      'the crasher dead-lettered and the other applied, nothing pending',
      5_000,
    )
    await running.stop()
    // Claimed once more by this consumer: 5 deliveries for the crasher, over 3; 3 for the other, within.
    expect(ran).toEqual(['fine'])
    expect(exhausted).toEqual([
      expect.stringMatching(/^crasher: consumer: message "crasher" was delivered 5 times, over maxDeliveries \(3\)/),
    ])
    const moved = (await redis.xrange(`${stream}:dead-letter`, '-', '+')) as Array<[string, string[]]>
    expect(moved.map(([, fields]) => fields.slice(0, 2))).toEqual([['id', 'crasher']])
  })

  it('refuses a maxDeliveries that is not a positive integer', async () => {
    const { options } = redisStream()
    for (const bad of [0, 2.5, -1]) {
      await expect(
        consumeRedisStreams({ ...options, maxDeliveries: bad, inbox: memoryInbox('liveness'), handler: () => {} }),
      ).rejects.toThrow(/maxDeliveries must be a positive integer/)
    }
  })
})

describe.skipIf(skips.redis !== undefined)('consumeRedisStreams: a stream that lost its group', () => {
  it('creates its group again when Redis lost it (a restart without persistence) and consumes what comes next', async () => {
    const { redis, stream, options } = redisStream()
    const inbox = memoryInbox('liveness')
    const running = await consumeRedisStreams({
      ...options,
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
    const running = await consumeRabbitMq({ channel, queue, inbox: memoryInbox('liveness'), handler: () => {}, probeMessageTtl: false })
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
