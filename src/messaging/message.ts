/**
 * What the outbox, the relay, the publishers and the inbox share: the message on its way to a
 * broker, the publisher contract and the typed errors. Imports no driver.
 */
import { createHash } from 'node:crypto'
import { longTimeout } from '../core/long-timer.js'
import { assertPositiveInteger } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'

/** Headers travel as plain strings on every broker. */
export type MessageHeaders = Record<string, string>

/** One outbox row on its way to a broker. */
export interface OutboxMessage {
  /** Stable message ID: the same event always carries the same ID, across retries and relays. */
  readonly id: string
  /** Subject (NATS), routing key (RabbitMQ) or stream key (Redis) unless the publisher maps it. */
  readonly topic: string
  /** The payload bytes, as written by `outbox.add()` (JSON unless a `Uint8Array` was given). */
  readonly payload: Uint8Array
  /** `application/json` or `application/octet-stream`. */
  readonly contentType: string
  readonly headers: MessageHeaders
  /** Rows with the same partition key are published in the order they were added. */
  readonly partitionKey: string | null
  /** This row's position in the outbox (ascending in commit-ish order; gaps are normal). */
  readonly seq: number
  /** How many times a relay has claimed this row, this claim included. */
  readonly attempts: number
  readonly createdAtMs: number
}

/** What a publisher says about one message: confirmed by the broker, or not. */
export type PublishResult = { ok: true } | { ok: false; error: Error; retryable: boolean }

/**
 * A broker behind one small interface. `publish` returns one result per message, in order; a
 * message counts as sent only when its result is `ok`, which a publisher answers only after the
 * broker confirmed it (JetStream PubAck, RabbitMQ publisher confirm, Redis XADD reply).
 * It must not throw for a single message's failure: it reports it in that message's result.
 *
 * @example
 * const publisher: Publisher = new NatsPublisher({ connection })
 * const results = await publisher.publish(messages)
 */
export interface Publisher {
  readonly name: string
  publish(messages: readonly OutboxMessage[]): Promise<PublishResult[]>
}

/** Why a publish failed. */
export type PublishFailure = 'unreachable' | 'nacked' | 'timeout' | 'too_large' | 'unroutable'

/**
 * A broker did not confirm a message. Its code is `STORE_UNAVAILABLE` (the broker is the store of
 * the message); `reason` says more. The outbox row stays pending and is retried with backoff.
 */
export class PublishError extends IdempotencyError {
  readonly reason: PublishFailure
  readonly messageId: string
  constructor(reason: PublishFailure, messageId: string, message: string, options?: { cause?: unknown }) {
    super('STORE_UNAVAILABLE', message, options)
    this.reason = reason
    this.messageId = messageId
  }
}

/** A message ID seen before with another payload: flagged, never silently skipped. */
export class InboxMismatchError extends IdempotencyError {
  readonly consumer: string
  readonly messageId: string
  constructor(consumer: string, messageId: string) {
    super(
      'FINGERPRINT_MISMATCH',
      `Inbox "${consumer}" already processed message "${messageId}" with a different payload. Two different events share one ID: ` +
        'check how the producer derives message IDs (pass `n` to outbox.add for several events of one topic per request). The message was not applied.',
    )
    this.consumer = consumer
    this.messageId = messageId
  }
}

/**
 * The broker already holds a message with this ID and another payload (NATS JetStream's duplicate
 * window dropped the new one). Two different events share one ID; republishing cannot fix it, so the
 * relay dead-letters the row at once and reports it (`failed`, `dead: true`). Code `FINGERPRINT_MISMATCH`.
 */
export class PublishMismatchError extends IdempotencyError {
  readonly broker: string
  readonly messageId: string
  constructor(broker: string, messageId: string, detail: string) {
    super(
      'FINGERPRINT_MISMATCH',
      `${broker}: message "${messageId}" was dropped as a duplicate, but the message stored under that ID has ${detail}. Two different events ` +
        'share one ID: check how the producer derives message IDs (pass `n` to outbox.add for several events of one topic per request). ' +
        'JetStream dropped this one; the outbox row is dead-lettered, not retried.',
    )
    this.broker = broker
    this.messageId = messageId
  }
}

/** Wraps a driver error from a broker as a {@link PublishError}. */
export function publishFailed(
  broker: string,
  message: OutboxMessage,
  cause: unknown,
  reason: PublishFailure = 'unreachable',
): PublishError {
  if (cause instanceof PublishError) return cause
  const text = cause instanceof Error ? cause.message : String(cause)
  return new PublishError(
    reason,
    message.id,
    `${broker}: message "${message.id}" to "${message.topic}" was not confirmed (${reason}): ${text}. The outbox row stays pending and will be retried.`,
    { cause },
  )
}

/** Runs `promise` with a deadline; rejects with `onTimeout()` when it passes. */
export function withTimeout<T>(promise: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  let cancel = () => {}
  const deadline = new Promise<never>((_, reject) => {
    cancel = longTimeout(() => reject(onTimeout()), ms)
  })
  return Promise.race([promise, deadline]).finally(() => cancel())
}

/** A plain SQL identifier, optionally schema-qualified, quoted for PostgreSQL or SQLite. */
export function quoteName(name: string, what: string): string {
  // A name that is no string (a number from a config file) is refused as any other bad name, not with a TypeError.
  const parts = typeof name === 'string' ? name.split('.') : []
  if (parts.length === 0 || parts.length > 2 || !parts.every((p) => /^[A-Za-z_][A-Za-z0-9_]{0,62}$/.test(p))) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${what} "${name}" must be a plain SQL identifier (letters, digits, underscore), optionally "schema.table".`,
    )
  }
  return parts.map((p) => `"${p}"`).join('.')
}

/** PostgreSQL's identifier limit (NAMEDATALEN - 1), in bytes. LISTEN truncates longer names; pg_notify refuses them. */
export const PG_MAX_IDENTIFIER_BYTES = 63

/**
 * A name derived from an outbox or inbox table (a NOTIFY channel, an index, a function):
 * `<base>_<suffix>` when it fits in 63 bytes, as it always was; otherwise a readable prefix of
 * `base`, a short hash of `source` (the full `schema.table`, so distinct tables get distinct names)
 * and the suffix. NOTIFY and LISTEN must both use this one function.
 */
export function fitPgName(base: string, suffix: string, source: string = base): string {
  const whole = `${base}_${suffix}`
  if (Buffer.byteLength(whole) <= PG_MAX_IDENTIFIER_BYTES) return whole
  const hash = createHash('sha256').update(source).digest('hex').slice(0, 12)
  // base is ASCII (quoteName allows letters, digits and underscores only), so chars are bytes.
  const prefix = base.slice(0, PG_MAX_IDENTIFIER_BYTES - suffix.length - hash.length - 2)
  return `${prefix}_${hash}_${suffix}`
}

/**
 * The name of a table that belongs beside `table` (`schema.table` or `table`): `<table>_<suffix>` in the
 * same schema, fitted to 63 bytes by {@link fitPgName}. Unquoted parts, for the dialect to quote.
 */
export function besideParts(table: string, suffix: string): string[] {
  const parts = table.split('.')
  const base = parts.pop() as string
  return [...parts, fitPgName(base, suffix, table)]
}

/** {@link besideParts}, quoted for PostgreSQL and SQLite ({@link quoteName}). */
export function besideTable(table: string, suffix: string, what: string): string {
  return quoteName(besideParts(table, suffix).join('.'), what)
}

/**
 * Whether `error` says a table does not exist: PostgreSQL's 42P01, MySQL's and MariaDB's 1146, SQLite's
 * "no such table". An inbox migrated before its failures table came has none.
 */
export function isMissingTable(error: unknown): boolean {
  const { code, errno, message } = (error ?? {}) as { code?: unknown; errno?: unknown; message?: unknown }
  return code === '42P01' || errno === 1146 || /no such table/.test(String(message))
}

/** Rows the purges delete per statement unless told otherwise: short locks, bounded WAL per commit. */
export const PURGE_BATCH_SIZE = 10_000

/** The batch size of a purge call: the caller's, checked, or {@link PURGE_BATCH_SIZE}. */
export function purgeBatchSize(options: { batchSize?: number }): number {
  const batchSize = options.batchSize ?? PURGE_BATCH_SIZE
  assertPositiveInteger(batchSize, 'batchSize')
  return batchSize
}

/** Thrown inside a tool's transaction to roll it back (a tool rolls back when its function throws), with what the transaction answers. */
export class RolledBack {
  constructor(readonly value: unknown) {}
}
