import { type JetStreamClient, type JetStreamManager, type NatsConnection, headers as natsHeaders, type PubAck } from 'nats'
import { type Duration, parsePositiveDuration, parseTimerDuration } from '../../../core/duration.js'
import { assertFunctions } from '../../../core/validate.js'
import { IdempotencyError } from '../../../errors.js'
import { type OutboxMessage, type Publisher, PublishMismatchError, type PublishResult, publishFailed } from '../../message.js'

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
 * A PubAck that says `duplicate` is checked against the message the stream stored under that ID
 * (read back by its sequence number): the same payload and content type is a copy and counts as
 * sent; another payload is two events sharing one ID, reported as a {@link PublishMismatchError}
 * (not retryable: the relay dead-letters the row) instead of a confirm JetStream would drop. If the
 * stored message is gone (acked from a work-queue or interest stream, purged, past `max_age`),
 * there is nothing to compare with and the duplicate counts as sent. Reading it back needs the
 * publisher's credentials to allow `$JS.API.STREAM.MSG.GET.<stream>`; until then such a duplicate
 * is retried.
 *
 * @example
 * const publisher = new NatsPublisher({ connection: await connect({ servers: '127.0.0.1:4222' }) })
 */
export class NatsPublisher implements Publisher {
  readonly name = 'nats'
  readonly #js: JetStreamClient
  readonly #subject: (message: OutboxMessage) => string
  readonly #timeoutMs: number
  readonly #connection: NatsConnection
  #jsm: Promise<JetStreamManager> | undefined

  constructor(options: NatsPublisherOptions) {
    if (typeof options?.connection?.jetstream !== 'function') {
      throw new IdempotencyError('INVALID_OPTION', 'NatsPublisher needs { connection }: an open connection from the `nats` package.')
    }
    this.#connection = options.connection
    this.#js = options.connection.jetstream()
    assertFunctions('NatsPublisher', { subject: options.subject })
    this.#subject = options.subject ?? ((message) => message.topic)
    // A timeout of 0 fails every publish at once (each message then retried to the dead letters).
    this.#timeoutMs = parsePositiveDuration(parseTimerDuration(options.timeout ?? '10s', 'timeout'), 'timeout')
  }

  async publish(messages: readonly OutboxMessage[]): Promise<PublishResult[]> {
    return Promise.all(messages.map((message) => this.#publishOne(message)))
  }

  async #publishOne(message: OutboxMessage): Promise<PublishResult> {
    try {
      const h = natsHeaders()
      for (const [name, value] of Object.entries(message.headers)) h.set(name, value)
      h.set('Content-Type', message.contentType)
      const ack = await this.#js.publish(this.#subject(message), message.payload, {
        msgID: message.id,
        headers: h,
        timeout: this.#timeoutMs,
      })
      return ack.duplicate ? await this.#checkDuplicate(message, ack) : { ok: true }
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

  // JetStream dropped this publish because its ID is in the duplicate window; the ack's seq is the
  // stored message's. Same bytes and content type: a copy, sent. Anything else: a mismatch.
  async #checkDuplicate(message: OutboxMessage, ack: PubAck): Promise<PublishResult> {
    let stored: { data: Uint8Array; header?: { get(name: string): string } }
    try {
      this.#jsm ??= this.#connection.jetstreamManager().catch((error: unknown) => {
        this.#jsm = undefined
        throw error
      })
      stored = await (await this.#jsm).streams.getMessage(ack.stream, { seq: ack.seq })
    } catch (error) {
      const apiError = (error as { api_error?: { err_code?: number; code?: number } }).api_error
      if (apiError?.err_code === 10037 || apiError?.code === 404) return { ok: true }
      return { ok: false, error: publishFailed('NATS', message, error, 'unreachable'), retryable: true }
    }
    if (Buffer.compare(Buffer.from(stored.data), Buffer.from(message.payload)) !== 0) {
      return {
        ok: false,
        error: new PublishMismatchError('NATS', message.id, `another payload (stream ${ack.stream}, seq ${ack.seq})`),
        retryable: false,
      }
    }
    const storedType = stored.header?.get('Content-Type') ?? ''
    if (storedType !== message.contentType) {
      const detail = `content type "${storedType}", not "${message.contentType}" (stream ${ack.stream}, seq ${ack.seq})`
      return { ok: false, error: new PublishMismatchError('NATS', message.id, detail), retryable: false }
    }
    return { ok: true }
  }
}
