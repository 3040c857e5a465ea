/**
 * `idemkey/redis-streams`: publish outbox rows to Redis Streams and consume them through
 * a consumer group and an inbox. Needs the optional peer dependency `ioredis`.
 *
 * @example
 * import { RedisStreamsPublisher, consumeRedisStreams } from 'idemkey/redis-streams'
 */
export type { ConsumeOptions, RunningConsumer } from '../../consumer-options.js'
export { type ConsumeRedisStreamsOptions, consumeRedisStreams } from './redis-streams-consumer.js'
export { RedisStreamsPublisher, type RedisStreamsPublisherOptions } from './redis-streams-publisher.js'
