import type { ConfirmChannel, Message } from 'amqplib'
import { type Duration, parsePositiveDuration } from '../../../core/duration.js'
import { assertFunctions } from '../../../core/validate.js'
import { IdempotencyError } from '../../../errors.js'
import { type OutboxMessage, PublishError, type Publisher, type PublishResult, publishFailed, withTimeout } from '../../message.js'

/** Options of {@link RabbitMqPublisher}. */
export interface RabbitMqPublisherOptions {
  /** A confirm channel (`connection.createConfirmChannel()`): each publish waits for the broker's ack. */
  channel: ConfirmChannel
  /** Exchange to publish to; `''` is the default exchange, which routes by queue name. @default '' */
  exchange?: string
  /** Routing key of a message. @default (message) => message.topic */
  routingKey?: (message: OutboxMessage) => string
  /** Persistent messages survive a broker restart (on durable queues). @default true */
  persistent?: boolean
  /** How long to wait for the confirms of a batch. @default '10s' */
  timeout?: Duration
}

/**
 * Publishes to RabbitMQ with publisher confirms and counts a message as sent only on its ack.
 * Sets `messageId` to the message ID. Publishes with `mandatory`, so a message no queue takes is
 * returned and reported as `unroutable` instead of being confirmed and dropped.
 *
 * @example
 * const channel = await (await amqp.connect('amqp://127.0.0.1')).createConfirmChannel()
 * const publisher = new RabbitMqPublisher({ channel, exchange: 'orders' })
 */
export class RabbitMqPublisher implements Publisher {
  readonly name = 'rabbitmq'
  readonly #channel: ConfirmChannel
  readonly #exchange: string
  readonly #routingKey: (message: OutboxMessage) => string
  readonly #persistent: boolean
  readonly #timeoutMs: number
  readonly #returned = new Set<string>()

  constructor(options: RabbitMqPublisherOptions) {
    if (typeof options?.channel?.publish !== 'function' || typeof options.channel.waitForConfirms !== 'function') {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'RabbitMqPublisher needs { channel }: a confirm channel from connection.createConfirmChannel().',
      )
    }
    this.#channel = options.channel
    this.#exchange = options.exchange ?? ''
    assertFunctions('RabbitMqPublisher', { routingKey: options.routingKey })
    this.#routingKey = options.routingKey ?? ((message) => message.topic)
    this.#persistent = options.persistent ?? true
    // A timeout of 0 fails every publish at once (each message then retried to the dead letters).
    this.#timeoutMs = parsePositiveDuration(options.timeout ?? '10s', 'timeout')
    // The broker sends basic.return before the ack of the same message, so the set is filled in time.
    this.#channel.on('return', (returned: Message) => {
      const id = returned.properties.messageId
      if (typeof id === 'string') this.#returned.add(id)
    })
  }

  async publish(messages: readonly OutboxMessage[]): Promise<PublishResult[]> {
    return Promise.all(
      messages.map((message) =>
        withTimeout(this.#publishOne(message), this.#timeoutMs, () =>
          publishFailed('RabbitMQ', message, new Error('no confirm in time'), 'timeout'),
        ).catch((error: unknown): PublishResult => ({ ok: false, error: publishFailed('RabbitMQ', message, error), retryable: true })),
      ),
    )
  }

  #publishOne(message: OutboxMessage): Promise<PublishResult> {
    return new Promise((resolve) => {
      try {
        this.#channel.publish(
          this.#exchange,
          this.#routingKey(message),
          Buffer.from(message.payload),
          {
            messageId: message.id,
            headers: message.headers,
            contentType: message.contentType,
            persistent: this.#persistent,
            mandatory: true,
          },
          (err) => {
            if (err) return resolve({ ok: false, error: publishFailed('RabbitMQ', message, err, 'nacked'), retryable: true })
            if (this.#returned.delete(message.id)) {
              const error = new PublishError(
                'unroutable',
                message.id,
                `RabbitMQ returned message "${message.id}": no queue is bound for "${this.#routingKey(message)}" on exchange "${this.#exchange}". Bind a queue; the row stays pending.`,
              )
              return resolve({ ok: false, error, retryable: true })
            }
            resolve({ ok: true })
          },
        )
      } catch (error) {
        // A closed channel throws at once: nothing was sent.
        resolve({ ok: false, error: publishFailed('RabbitMQ', message, error), retryable: true })
      }
    })
  }
}
