/**
 * `idemkey/rabbitmq`: publish outbox rows to RabbitMQ with publisher confirms and consume
 * them through an inbox. Needs the optional peer dependency `amqplib`.
 *
 * @example
 * import { RabbitMqPublisher, consumeRabbitMq } from 'idemkey/rabbitmq'
 */
export type { ConsumeOptions, RunningConsumer } from '../../consumer-options.js'
export { type ConsumeRabbitMqOptions, consumeRabbitMq, rabbitMqInboxMessage } from './rabbitmq-consumer.js'
export { RabbitMqPublisher, type RabbitMqPublisherOptions } from './rabbitmq-publisher.js'
