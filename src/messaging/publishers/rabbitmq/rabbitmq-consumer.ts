import type { Channel, ConsumeMessage } from 'amqplib'
import type { InboxMessage } from '../../inbox/types.js'
import { type ConsumeOptions, processMessage, type RunningConsumer } from '../shared.js'

/** Options of {@link consumeRabbitMq}. */
export interface ConsumeRabbitMqOptions<Tx> extends ConsumeOptions<Tx> {
  /** A channel (plain or confirm) on which to consume. */
  channel: Channel
  queue: string
  /** Unacked messages in hand at once. @default 32 */
  prefetch?: number
  /** Delay before a failed message is requeued, in ms. @default 1000 */
  requeueDelayMs?: number
}

/** The inbox view of an AMQP message: ID from `messageId`. */
export function rabbitMqInboxMessage(msg: ConsumeMessage): InboxMessage {
  const headers: Record<string, string> = {}
  for (const [name, value] of Object.entries(msg.properties.headers ?? {})) headers[name] = String(value)
  return {
    id: typeof msg.properties.messageId === 'string' ? msg.properties.messageId : '',
    payload: msg.content,
    topic: msg.fields.routingKey,
    headers,
  }
}

/**
 * Consumes a RabbitMQ queue through an inbox, with manual acks: a message is acked only after its
 * transaction committed (or as a known duplicate); a failed one is requeued after a delay; one that
 * redelivery cannot fix (same ID, other payload; no `messageId`) is rejected without requeue (to
 * the queue's dead-letter exchange, if it has one) and reported.
 *
 * @example
 * const running = await consumeRabbitMq({ channel, queue: 'billing', inbox, handler })
 */
export async function consumeRabbitMq<Tx>(options: ConsumeRabbitMqOptions<Tx>): Promise<RunningConsumer> {
  const { channel } = options
  await channel.prefetch(options.prefetch ?? 32)
  const inFlight = new Set<Promise<void>>()
  let resolveDone: () => void = () => {}
  const done = new Promise<void>((resolve) => {
    resolveDone = resolve
  })
  const handle = async (msg: ConsumeMessage) => {
    const verdict = await processMessage(options, rabbitMqInboxMessage(msg))
    try {
      if (verdict === 'ack') channel.ack(msg)
      else if (verdict === 'reject') channel.nack(msg, false, false)
      else await new Promise((resolve) => setTimeout(resolve, options.requeueDelayMs ?? 1000)).then(() => channel.nack(msg, false, true))
    } catch {
      // The channel closed: the broker requeues every unacked message itself.
    }
  }
  const { consumerTag } = await channel.consume(
    options.queue,
    (msg) => {
      if (msg === null) return resolveDone() // cancelled by the broker
      const task = handle(msg).finally(() => inFlight.delete(task))
      inFlight.add(task)
    },
    { noAck: false },
  )
  return {
    done,
    async stop() {
      await channel.cancel(consumerTag).catch(() => {})
      await Promise.all(inFlight)
      resolveDone()
    },
  }
}
