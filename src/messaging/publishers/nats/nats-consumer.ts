import type { ConsumerMessages, JsMsg, NatsConnection } from 'nats'
import type { InboxMessage } from '../../inbox/types.js'
import { type ConsumeOptions, processMessage, type RunningConsumer } from '../shared.js'

/** Options of {@link consumeNats}. */
export interface ConsumeNatsOptions<Tx> extends ConsumeOptions<Tx> {
  connection: NatsConnection
  /** Stream name. */
  stream: string
  /** A durable consumer on that stream (explicit ack), created beforehand. */
  consumer: string
  /** Delay before a failed message is redelivered, in ms. @default 1000 */
  nakDelayMs?: number
  /** Messages fetched ahead. @default 64 */
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
 * committed (or when it is a known duplicate). A failed effect is nak'ed and comes back; a message
 * whose ID was seen with another payload is terminated and reported, never applied.
 *
 * @example
 * const running = await consumeNats({ connection, stream: 'ORDERS', consumer: 'billing', inbox, handler })
 * await running.stop()
 */
export async function consumeNats<Tx>(options: ConsumeNatsOptions<Tx>): Promise<RunningConsumer> {
  const consumer = await options.connection.jetstream().consumers.get(options.stream, options.consumer)
  const messages: ConsumerMessages = await consumer.consume({ max_messages: options.maxMessages ?? 64 })
  const done = (async () => {
    for await (const msg of messages) {
      const verdict = await processMessage(options, natsInboxMessage(msg))
      try {
        if (verdict === 'ack') msg.ack()
        else if (verdict === 'reject') msg.term()
        else msg.nak(options.nakDelayMs ?? 1000)
      } catch {
        // The connection is closing: JetStream redelivers after ack_wait; the inbox skips the copy.
      }
    }
  })()
  return {
    done,
    async stop() {
      await messages.close()
      await done
    },
  }
}
