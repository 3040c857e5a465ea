import { type JetStreamClient, type NatsConnection, headers as natsHeaders } from 'nats'
import { type Duration, parseDuration } from '../../../core/duration.js'
import { IdempotencyError } from '../../../errors.js'
import { type OutboxMessage, type Publisher, type PublishResult, publishFailed } from '../../message.js'

/** Options of {@link NatsPublisher}. */
export interface NatsPublisherOptions {
  /** An open `nats` connection; the server must have JetStream and a stream covering the subjects. */
  connection: NatsConnection
  /** The subject of a message. @default (message) => message.topic */
  subject?: (message: OutboxMessage) => string
  /** How long to wait for each PubAck. Keep it well under the relay's lease. @default '10s' */
  timeout?: Duration
}

/**
 * Publishes to NATS JetStream and counts a message as sent only on its PubAck. Sets `Nats-Msg-Id`
 * to the message ID, so JetStream drops a copy published again within the stream's
 * `duplicate_window` (a relay that died before marking the row sent). The whole batch is in
 * flight at once; acks come back per message.
 *
 * @example
 * const publisher = new NatsPublisher({ connection: await connect({ servers: '127.0.0.1:4222' }) })
 */
export class NatsPublisher implements Publisher {
  readonly name = 'nats'
  readonly #js: JetStreamClient
  readonly #subject: (message: OutboxMessage) => string
  readonly #timeoutMs: number

  constructor(options: NatsPublisherOptions) {
    if (typeof options?.connection?.jetstream !== 'function') {
      throw new IdempotencyError('INVALID_OPTION', 'NatsPublisher needs { connection }: an open connection from the `nats` package.')
    }
    this.#js = options.connection.jetstream()
    this.#subject = options.subject ?? ((message) => message.topic)
    this.#timeoutMs = parseDuration(options.timeout ?? '10s', 'timeout')
  }

  async publish(messages: readonly OutboxMessage[]): Promise<PublishResult[]> {
    return Promise.all(messages.map((message) => this.#publishOne(message)))
  }

  async #publishOne(message: OutboxMessage): Promise<PublishResult> {
    try {
      const h = natsHeaders()
      for (const [name, value] of Object.entries(message.headers)) h.set(name, value)
      h.set('Content-Type', message.contentType)
      await this.#js.publish(this.#subject(message), message.payload, { msgID: message.id, headers: h, timeout: this.#timeoutMs })
      return { ok: true }
    } catch (error) {
      const code = (error as { code?: string }).code
      const text = error instanceof Error ? error.message : String(error)
      if (code === 'MAX_PAYLOAD_EXCEEDED' || /max.?payload/i.test(text)) {
        return { ok: false, error: publishFailed('NATS', message, error, 'too_large'), retryable: false }
      }
      if (code === '503' || /no responders/i.test(text)) {
        // No stream listens on this subject: the broker stored nothing.
        return { ok: false, error: publishFailed('NATS', message, error, 'unroutable'), retryable: true }
      }
      const reason = code === 'TIMEOUT' || /timeout/i.test(text) ? 'timeout' : 'unreachable'
      return { ok: false, error: publishFailed('NATS', message, error, reason), retryable: true }
    }
  }
}
