/**
 * The consumer helpers refuse a delay or a count that would not work as a delay or a count, before
 * they touch the broker: a string, NaN or negative delay redelivered a failed message at once (a
 * loop against the broker), one past 24.8 days likewise (Node fires such a timer after 1 ms), a
 * Redis `blockMs` of 0 blocked for ever (so `stop()` never returned), and a count of 0 stalled the
 * consumer waiting for room it never got.
 */
import { describe, expect, it } from 'vitest'
import { consumeNats, NatsPublisher } from './brokers/nats/index.js'
import { consumeRabbitMq, RabbitMqPublisher } from './brokers/rabbitmq/index.js'
import { consumeRedisStreams, RedisStreamsPublisher } from './brokers/redis-streams/index.js'
import { delayOption, positive } from './consumer-options.js'
import type { Inbox } from './inbox/types.js'

/** A broker handle that fails the test if the helper reaches it. */
const untouchable = new Proxy(
  {},
  {
    get(_, name) {
      throw new Error(`the helper touched the broker (${String(name)}) before checking its options`)
    },
  },
)
const inbox = { consumer: 'c', retentionMs: 86_400_000 } as unknown as Inbox<unknown>
const handler = () => {}
const refused = (message: string) => expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(message) })

describe('consumer options', () => {
  it('delayOption takes a number of ms from its minimum to 2^31-1 and refuses strings, NaN, negatives and longer delays, naming the option', () => {
    expect(delayOption(undefined, 1000, 'requeueDelayMs')).toBe(1000)
    expect(delayOption(0, 1000, 'requeueDelayMs')).toBe(0)
    expect(delayOption(2 ** 31 - 1, 1000, 'requeueDelayMs')).toBe(2 ** 31 - 1)
    for (const bad of ['5s', Number.NaN, -1, 2 ** 31, Number.POSITIVE_INFINITY]) {
      expect(() => delayOption(bad as number, 1000, 'requeueDelayMs')).toThrow(refused('requeueDelayMs is a delay in milliseconds'))
    }
    expect(() => delayOption(0, 1000, 'blockMs', 1)).toThrow(refused('blockMs is a delay in milliseconds from 1 to'))
    expect(() => delayOption('5s' as unknown as number, 1000, 'nakDelayMs')).toThrow('got "5s"')
  })

  it('positive takes whole numbers from 1 and refuses 0, fractions and NaN', () => {
    expect(positive(undefined, 256, 'count')).toBe(256)
    for (const bad of [0, 1.5, Number.NaN, -3])
      expect(() => positive(bad, 256, 'count')).toThrow(refused('count must be a positive integer'))
  })

  it('consumeRabbitMq refuses a bad requeueDelayMs or prefetch before using the channel', async () => {
    const channel = untouchable as never
    await expect(consumeRabbitMq({ channel, queue: 'q', inbox, handler, requeueDelayMs: '1s' as unknown as number })).rejects.toEqual(
      refused('requeueDelayMs'),
    )
    await expect(consumeRabbitMq({ channel, queue: 'q', inbox, handler, requeueDelayMs: 30 * 86_400_000 })).rejects.toEqual(
      refused('about 24.8 days'),
    )
    await expect(consumeRabbitMq({ channel, queue: 'q', inbox, handler, prefetch: 0 })).rejects.toEqual(
      refused('prefetch must be a positive integer'),
    )
  })

  it('consumeNats refuses a bad nakDelayMs before using the connection', async () => {
    await expect(
      consumeNats({ connection: untouchable as never, stream: 's', consumer: 'c', inbox, handler, nakDelayMs: -5 }),
    ).rejects.toEqual(refused('nakDelayMs'))
  })

  it('consumeRedisStreams refuses blockMs 0 (Redis blocks for ever), a bad claimIdleMs or count, before using the connection', async () => {
    const redis = untouchable as never
    const base = { redis, stream: 's', group: 'g', consumer: 'c', inbox, handler }
    await expect(consumeRedisStreams({ ...base, blockMs: 0 })).rejects.toEqual(refused('blockMs is a delay in milliseconds from 1'))
    await expect(consumeRedisStreams({ ...base, claimIdleMs: Number.NaN })).rejects.toEqual(refused('claimIdleMs'))
    await expect(consumeRedisStreams({ ...base, count: 0 })).rejects.toEqual(refused('count must be a positive integer'))
  })

  it('every consumer helper refuses a maxAttempts that is no positive integer, and Redis a deadLetterStream that is its own stream, before using the broker', async () => {
    const redis = untouchable as never
    const base = { inbox, handler, maxAttempts: 0 }
    await expect(consumeRabbitMq({ ...base, channel: untouchable as never, queue: 'q' })).rejects.toEqual(
      refused('maxAttempts must be a positive integer'),
    )
    await expect(consumeNats({ ...base, connection: untouchable as never, stream: 's', consumer: 'c' })).rejects.toEqual(
      refused('maxAttempts must be a positive integer'),
    )
    const streams = { redis, stream: 's', group: 'g', consumer: 'c', inbox, handler }
    await expect(consumeRedisStreams({ ...streams, maxAttempts: 2.5 })).rejects.toEqual(refused('maxAttempts must be a positive integer'))
    await expect(consumeRedisStreams({ ...streams, deadLetterStream: 's' })).rejects.toEqual(
      refused('deadLetterStream must be the name of another stream'),
    )
    await expect(consumeRedisStreams({ ...streams, deadLetterStream: '' })).rejects.toEqual(refused('deadLetterStream'))
  })

  it('publishers refuse a timeout of 0 (every publish failed at once, and each message went on to the dead letters), a Redis maxAge or maxLen of 0 (each entry trimmed as it is added), and a subject, routing key or stream that is no function', () => {
    const connection = { jetstream: () => ({}) } as never
    const channel = { on: () => {}, publish: () => true, waitForConfirms: async () => {} } as never
    const redis = { pipeline: () => ({}) } as never
    expect(() => new NatsPublisher({ connection })).not.toThrow()
    expect(() => new RabbitMqPublisher({ channel })).not.toThrow()
    expect(() => new RedisStreamsPublisher({ redis })).not.toThrow()
    expect(() => new NatsPublisher({ connection, timeout: 0 })).toThrow(refused('timeout must be longer than 0'))
    expect(() => new NatsPublisher({ connection, timeout: '30d' })).toThrow(refused('longer than 24.8 days'))
    expect(() => new RabbitMqPublisher({ channel, timeout: '0s' })).toThrow(refused('timeout must be longer than 0'))
    expect(() => new RedisStreamsPublisher({ redis, timeout: 0 })).toThrow(refused('timeout must be longer than 0'))
    expect(() => new RedisStreamsPublisher({ redis, maxAge: 0 })).toThrow(refused('maxAge must be longer than 0'))
    expect(() => new RedisStreamsPublisher({ redis, maxLen: 0 })).toThrow(
      refused('RedisStreamsPublisher maxLen must be a positive integer'),
    )
    expect(() => new NatsPublisher({ connection, subject: 'orders' as never })).toThrow(
      refused('NatsPublisher: subject must be a function'),
    )
    expect(() => new RabbitMqPublisher({ channel, routingKey: 'orders' as never })).toThrow(
      refused('RabbitMqPublisher: routingKey must be a function'),
    )
    expect(() => new RedisStreamsPublisher({ redis, stream: 'orders' as never })).toThrow(
      refused('RedisStreamsPublisher: stream must be a function'),
    )
  })
})
