import type { Channel, ConsumeMessage } from 'amqplib'
import { type Duration, parseDuration } from '../../../core/duration.js'
import {
  type ConsumeOptions,
  checkInboxWindow,
  consumerConcurrency,
  defaultInHand,
  delayOption,
  keyOf,
  maxAttemptsOption,
  positive,
  type RunningConsumer,
} from '../../consumer-options.js'
import { createDispatcher, type Verdict } from '../../dispatcher.js'
import type { InboxMessage } from '../../inbox/types.js'
import { type AckEntry, AckWindow } from './ack-window.js'
import { readQueueMessageTtl } from './queue-ttl.js'

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
  /**
   * How long after publishing the queue may still deliver a message, when the helper cannot read it:
   * a message TTL set by a policy, or a dead-letter loop that brings expired messages back (then the
   * whole loop's). Given, the helper does not probe the queue. The inbox's retention is checked
   * against it (docs/messaging.md, "Choosing the inbox retention").
   */
  redeliveryHorizon?: Duration
  /**
   * Read the queue's `x-message-ttl` argument at start, to warn when the inbox forgets IDs sooner
   * (`IDEMKEY_INBOX_WINDOW`). AMQP has no call for a queue's arguments: the helper re-declares the
   * queue with a different TTL on a throwaway channel and reads the refusal, which leaves one or two
   * channel errors ("inequivalent arg") in the broker's log per start and needs `configure`
   * permission on the queue (without it, nothing is checked). `false` skips it.
   * @default true
   */
  probeMessageTtl?: boolean
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
 * transaction committed (or as a known duplicate), the acks of messages settled together sent as one
 * multiple ack; a failed one is requeued after a delay (after `maxAttempts` failures, rejected); one that
 * redelivery cannot fix (same ID, other payload; no `messageId`) is rejected without requeue (to
 * the queue's dead-letter exchange, if it has one) and reported.
 * Up to `concurrency` effects run at once; messages of one routing key (or `partitionKey`) run in
 * delivery order (a requeued message comes back behind later ones). `done` resolves when the
 * channel closes (or the broker cancels the consumer): consume again on a new channel.
 *
 * @example
 * const running = await consumeRabbitMq({ channel, queue: 'billing', inbox, handler })
 */
export async function consumeRabbitMq<Tx>(options: ConsumeRabbitMqOptions<Tx>): Promise<RunningConsumer> {
  const { channel } = options
  const concurrency = consumerConcurrency(options)
  const requeueDelayMs = delayOption(options.requeueDelayMs, 1000, 'requeueDelayMs')
  const prefetch = positive(options.prefetch, defaultInHand(options, concurrency), 'prefetch')
  maxAttemptsOption(options)
  await checkQueueWindow(options)
  await channel.prefetch(prefetch)
  const dispatcher = createDispatcher(
    options,
    concurrency,
    `rejected without requeue, to the dead-letter exchange of queue "${options.queue}" (dropped by RabbitMQ if it has none)`,
  )
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
  // Acks go out as one multiple ack per run of settled messages (ack-window.ts).
  const acks = new AckWindow(channel)
  const settleVerdict = (entry: AckEntry, verdict: Verdict) => {
    if (verdict === 'ack') settle(() => acks.ack(entry))
    else if (verdict === 'reject' || verdict === 'dead') settle(() => acks.reject(entry))
    else {
      settle(() => acks.holdForRequeue(entry))
      const requeue = new Promise((resolve) => setTimeout(resolve, requeueDelayMs)).then(() => settle(() => acks.requeue(entry)))
      requeues.add(requeue)
      void requeue.then(() => requeues.delete(requeue))
    }
  }
  const { consumerTag } = await channel.consume(
    options.queue,
    (msg) => {
      if (msg === null) {
        // Cancelled by the broker: the messages in hand still settle, their acks go out, then done.
        void dispatcher.idle().then(() => {
          settle(() => acks.flush())
          resolveDone()
        })
        return
      }
      const message = rabbitMqInboxMessage(msg)
      const entry = acks.delivered(msg)
      dispatcher.push(
        keyOf(options, message, (m) => m.topic),
        message,
        (verdict) => settleVerdict(entry, verdict),
        msg.fields.redelivered,
      )
    },
    { noAck: false },
  )
  // A closed channel (the connection dropped, the broker closed it) delivers nothing more and amqplib
  // does not call the consumer: without this, `done` never resolved and a supervisor never restarted it.
  // The messages in hand still run; their acks cannot go out, so the broker redelivers them (the inbox skips them).
  const closed = () => {
    void dispatcher
      .idle()
      .then(() => Promise.all(requeues))
      .then(() => resolveDone())
  }
  channel.once('close', closed)
  void done.then(() => channel.removeListener('close', closed))
  return {
    done,
    async stop() {
      await channel.cancel(consumerTag).catch(() => {})
      await dispatcher.idle()
      await Promise.all(requeues)
      settle(() => acks.flush())
      resolveDone()
    },
  }
}

/**
 * Warns (once, by name) when the inbox forgets IDs before the queue stops delivering a message: a
 * queue with a message TTL drops (or dead-letters) a message that long after it was enqueued, a
 * requeued one keeping its first expiry; a queue without one can deliver it at any later time, so
 * there is no bound to check against.
 */
async function checkQueueWindow<Tx>(options: ConsumeRabbitMqOptions<Tx>): Promise<void> {
  const retentionMs = options.inbox.retentionMs
  if (options.redeliveryHorizon !== undefined) {
    const horizonMs = parseDuration(options.redeliveryHorizon, 'redeliveryHorizon')
    checkInboxWindow(options.inbox.consumer, `RabbitMQ queue "${options.queue}" (redeliveryHorizon)`, retentionMs, horizonMs)
    return
  }
  // No retention to compare (a custom inbox): not worth a channel error in the broker's log.
  if (retentionMs === undefined || options.probeMessageTtl === false) return
  const ttlMs = await readQueueMessageTtl(options.channel, options.queue)
  if (typeof ttlMs === 'number')
    checkInboxWindow(options.inbox.consumer, `RabbitMQ queue "${options.queue}" (x-message-ttl)`, retentionMs, ttlMs)
}
