/**
 * `idemkey/nats`: publish outbox rows to NATS JetStream and consume them through an inbox.
 * Needs the optional peer dependency `nats`.
 *
 * @example
 * import { NatsPublisher, consumeNats } from 'idemkey/nats'
 */
export type { ConsumeOptions, RunningConsumer } from '../../consumer-options.js'
export { type ConsumeNatsOptions, consumeNats, natsInboxMessage } from './nats-consumer.js'
export { NatsPublisher, type NatsPublisherOptions } from './nats-publisher.js'
