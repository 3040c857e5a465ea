import type { Redis } from 'ioredis'
import { type Duration, parsePositiveDuration } from '../../../core/duration.js'
import { assertFunctions, assertOptionalPositiveInteger } from '../../../core/validate.js'
import { IdempotencyError } from '../../../errors.js'
import { type OutboxMessage, type Publisher, type PublishResult, publishFailed, withTimeout } from '../../message.js'

/** Options of {@link RedisStreamsPublisher}. */
export interface RedisStreamsPublisherOptions {
  /** An ioredis client. */
  redis: Redis
  /** The stream key of a message. @default (message) => message.topic */
  stream?: (message: OutboxMessage) => string
  /** Trim each stream to about this many entries (`MAXLEN ~`). Unset: never trim. */
  maxLen?: number
  /**
   * Trim each stream by time instead: entries older than about this are dropped (`MINID ~`, from the
   * entry IDs' millisecond part) at each publish. Give the consumers' helper the same `maxAge`: it
   * checks the inbox's retention against it. Not with `maxLen` (XADD trims one way).
   */
  maxAge?: Duration
  /** How long to wait for the replies of a batch. @default '10s' */
  timeout?: Duration
}

/**
 * Publishes to Redis Streams: one `XADD` per message, pipelined, with the message ID in the entry's
 * `id` field (next to `payload`, `content-type` and `headers`). A message counts as sent on its
 * XADD reply. Redis has no dedup of its own: a row published again after a relay crash is a second
 * entry with the same `id`, which the inbox skips. Durability is Redis's: see `appendfsync`.
 *
 * @example
 * const publisher = new RedisStreamsPublisher({ redis: new Redis(6379, '127.0.0.1'), maxLen: 1_000_000 })
 */
export class RedisStreamsPublisher implements Publisher {
  readonly name = 'redis-streams'
  readonly #redis: Redis
  readonly #stream: (message: OutboxMessage) => string
  readonly #maxLen: number | undefined
  readonly #maxAgeMs: number | undefined
  readonly #timeoutMs: number

  constructor(options: RedisStreamsPublisherOptions) {
    if (typeof options?.redis?.pipeline !== 'function') {
      throw new IdempotencyError('INVALID_OPTION', 'RedisStreamsPublisher needs { redis }: an ioredis client.')
    }
    this.#redis = options.redis
    assertFunctions('RedisStreamsPublisher', { stream: options.stream })
    assertOptionalPositiveInteger(options.maxLen, 'RedisStreamsPublisher maxLen')
    this.#stream = options.stream ?? ((message) => message.topic)
    if (options.maxLen !== undefined && options.maxAge !== undefined) {
      throw new IdempotencyError('INVALID_OPTION', 'RedisStreamsPublisher: give maxLen or maxAge, not both (XADD trims by one of them).')
    }
    this.#maxLen = options.maxLen
    // A maxAge of 0 would trim each entry as it is added, before any consumer reads it.
    this.#maxAgeMs = options.maxAge === undefined ? undefined : parsePositiveDuration(options.maxAge, 'maxAge')
    // A timeout of 0 fails every publish at once (each message then retried to the dead letters).
    this.#timeoutMs = parsePositiveDuration(options.timeout ?? '10s', 'timeout')
  }

  async publish(messages: readonly OutboxMessage[]): Promise<PublishResult[]> {
    if (messages.length === 0) return []
    const pipeline = this.#redis.pipeline()
    const trim = this.#trim()
    for (const m of messages) {
      pipeline.xadd(
        this.#stream(m),
        ...(trim as [string, string, number]),
        '*',
        'id',
        m.id,
        'payload',
        Buffer.from(m.payload),
        'content-type',
        m.contentType,
        'headers',
        JSON.stringify(m.headers),
      )
    }
    const first = messages[0] as OutboxMessage
    try {
      const replies = await withTimeout(pipeline.exec(), this.#timeoutMs, () =>
        publishFailed('Redis', first, new Error(`no reply within ${this.#timeoutMs} ms`), 'timeout'),
      )
      return messages.map((m, i): PublishResult => {
        const [err] = replies?.[i] ?? [new Error('no reply')]
        return err ? { ok: false, error: publishFailed('Redis', m, err, 'nacked'), retryable: true } : { ok: true }
      })
    } catch (error) {
      return messages.map((m) => ({ ok: false, error: publishFailed('Redis', m, error), retryable: true }))
    }
  }

  /** The XADD trimming arguments: by length, by age (the oldest entry ID to keep), or none. */
  #trim(): Array<string | number> {
    if (this.#maxLen !== undefined) return ['MAXLEN', '~', this.#maxLen]
    if (this.#maxAgeMs !== undefined) return ['MINID', '~', `${Math.max(0, Date.now() - this.#maxAgeMs)}-0`]
    return []
  }
}
