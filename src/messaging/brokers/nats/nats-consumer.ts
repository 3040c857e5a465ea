import { AckPolicy, type ConsumerMessages, type JsMsg, type NatsConnection } from 'nats'
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

/** Options of {@link consumeNats}. */
export interface ConsumeNatsOptions<Tx> extends ConsumeOptions<Tx> {
  connection: NatsConnection
  /** Stream name. */
  stream: string
  /** A durable consumer on that stream (explicit ack), created beforehand. */
  consumer: string
  /** Delay before a failed message is redelivered, in ms. @default 1000 */
  nakDelayMs?: number
  /**
   * Messages pulled per request (JetStream delivers them in batches); also the most messages held
   * unacked (running or waiting for their key). Keep the consumer's `ack_wait` well above the time
   * that many effects take. @default concurrency x batchSize (256)
   */
  maxMessages?: number
}

/** The inbox view of a JetStream message: ID from `Nats-Msg-Id`, else stream and sequence. */
export function natsInboxMessage(msg: JsMsg): InboxMessage {
  const headers: Record<string, string> = {}
  for (const [name, values] of msg.headers ?? []) headers[name] = values[0] ?? ''
  return { id: msg.headers?.get('Nats-Msg-Id') || `${msg.info.stream}:${msg.seq}`, payload: msg.data, topic: msg.subject, headers }
}

/**
 * Consumes a JetStream consumer through an inbox: a message is acked only after its transaction
 * committed (or when it is a known duplicate). A failed effect is nak'ed and comes back (after
 * `maxAttempts` failures, it is terminated); a message
 * whose ID was seen with another payload is terminated and reported, never applied.
 * Up to `concurrency` effects run at once; messages of one subject (or `partitionKey`) run in order.
 * A consumer with `ack_policy: all` (one ack covers every earlier message) is handled one message at a time.
 *
 * @example
 * const running = await consumeNats({ connection, stream: 'ORDERS', consumer: 'billing', inbox, handler })
 * await running.stop()
 */
export async function consumeNats<Tx>(options: ConsumeNatsOptions<Tx>): Promise<RunningConsumer> {
  const nakDelayMs = delayOption(options.nakDelayMs, 1000, 'nakDelayMs')
  maxAttemptsOption(options)
  const consumer = await options.connection.jetstream().consumers.get(options.stream, options.consumer)
  const info = await consumer.info(true).catch(() => undefined)
  // The stream keeps a message (and may redeliver it) for up to max_age (nanoseconds; 0: no limit).
  const stream = await (await options.connection.jetstreamManager()).streams.info(options.stream).catch(() => undefined)
  const maxAgeNs = stream?.config.max_age ?? 0
  if (maxAgeNs > 0)
    checkInboxWindow(options.inbox.consumer, `JetStream stream "${options.stream}" (max_age)`, options.inbox.retentionMs, maxAgeNs / 1e6)
  // With AckAll, acking a later message would ack earlier ones whose effect has not committed.
  const concurrency = info?.config.ack_policy === AckPolicy.All ? 1 : consumerConcurrency(options)
  const maxMessages = positive(options.maxMessages, defaultInHand(options, concurrency), 'maxMessages')
  const dispatcher = createDispatcher(
    options,
    concurrency,
    `terminated (JetStream does not deliver it again; nats-server 2.10+ announces it in a MSG_TERMINATED advisory; the stream keeps it)`,
  )
  const settle = (msg: JsMsg, verdict: Verdict) => {
    try {
      if (verdict === 'ack') msg.ack()
      // No reason with the TERM: a server before 2.10 takes "+TERM <reason>" for no ack at all.
      else if (verdict === 'reject' || verdict === 'dead') msg.term()
      else msg.nak(nakDelayMs)
    } catch (error) {
      // The connection is closing: JetStream redelivers after ack_wait; the inbox skips the copy. One
      // given up on is given up again at its next failure (the dispatcher hears it was not terminated).
      if (verdict === 'dead') throw error
    }
  }
  const messages: ConsumerMessages = await consumer.consume({ max_messages: maxMessages })
  const done = (async () => {
    for await (const msg of messages) {
      const message = natsInboxMessage(msg)
      dispatcher.push(
        keyOf(options, message, (m) => m.topic),
        message,
        (verdict) => settle(msg, verdict),
        msg.info.redelivered,
      )
      await dispatcher.room(maxMessages)
    }
    await dispatcher.idle()
  })()
  return {
    done,
    async stop() {
      await messages.close()
      await done
      // Acks are fire-and-forget publishes: a round trip makes sure the server has them before stop() resolves.
      await options.connection.flush().catch(() => {})
    },
  }
}
