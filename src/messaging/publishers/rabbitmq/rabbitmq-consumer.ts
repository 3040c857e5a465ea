import type { Channel, ConsumeMessage } from 'amqplib'
import type { InboxMessage } from '../../inbox/types.js'
import {
  type ConsumeOptions,
  consumerConcurrency,
  createDispatcher,
  defaultInHand,
  keyOf,
  type RunningConsumer,
  type Verdict,
} from '../shared.js'

/** Options of {@link consumeRabbitMq}. */
export interface ConsumeRabbitMqOptions<Tx> extends ConsumeOptions<Tx> {
  /** A channel (plain or confirm) on which to consume. */
  channel: Channel
  queue: string
  /**
   * Unacked messages in hand at once (running or waiting for their key); the broker delivers no
   * more until some are acked. @default concurrency x batchSize (256)
   */
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
 * Up to `concurrency` effects run at once; messages of one routing key (or `partitionKey`) run in
 * delivery order (a requeued message comes back behind later ones).
 *
 * @example
 * const running = await consumeRabbitMq({ channel, queue: 'billing', inbox, handler })
 */
export async function consumeRabbitMq<Tx>(options: ConsumeRabbitMqOptions<Tx>): Promise<RunningConsumer> {
  const { channel } = options
  const concurrency = consumerConcurrency(options)
  await channel.prefetch(options.prefetch ?? defaultInHand(options, concurrency))
  const dispatcher = createDispatcher(options, concurrency)
  let resolveDone: () => void = () => {}
  const done = new Promise<void>((resolve) => {
    resolveDone = resolve
  })
  // Failed messages waiting out requeueDelayMs: they hold no effect slot, but stop() waits for them.
  const requeues = new Set<Promise<void>>()
  const settle = (action: () => void) => {
    try {
      action()
    } catch {
      // The channel closed: the broker requeues every unacked message itself.
    }
  }
  const settleVerdict = (msg: ConsumeMessage, verdict: Verdict) => {
    if (verdict === 'ack') settle(() => channel.ack(msg))
    else if (verdict === 'reject') settle(() => channel.nack(msg, false, false))
    else {
      const requeue = new Promise((resolve) => setTimeout(resolve, options.requeueDelayMs ?? 1000)).then(() =>
        settle(() => channel.nack(msg, false, true)),
      )
      requeues.add(requeue)
      void requeue.then(() => requeues.delete(requeue))
    }
  }
  const { consumerTag } = await channel.consume(
    options.queue,
    (msg) => {
      if (msg === null) {
        void dispatcher.idle().then(resolveDone) // cancelled by the broker
        return
      }
      const message = rabbitMqInboxMessage(msg)
      dispatcher.push(
        keyOf(options, message, (m) => m.topic),
        message,
        (verdict) => settleVerdict(msg, verdict),
      )
    },
    { noAck: false },
  )
  return {
    done,
    async stop() {
      await channel.cancel(consumerTag).catch(() => {})
      await dispatcher.idle()
      await Promise.all(requeues)
      resolveDone()
    },
  }
}
