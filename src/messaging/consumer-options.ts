/**
 * What the three broker consumer helpers take, checked: their options and defaults, the partition
 * key of a message, and the warning when the inbox forgets IDs sooner than the broker redelivers.
 */
import { assertOptionalPositiveInteger } from '../core/validate.js'
import type { Inbox, InboxMessage } from './inbox/types.js'

export { delayOption } from '../core/duration.js'

/** Effects running at once unless told otherwise. */
export const DEFAULT_CONSUMER_CONCURRENCY = 16
/** Messages per inbox transaction at most, unless told otherwise. */
export const DEFAULT_CONSUMER_BATCH_SIZE = 16

/** Options every consumer helper takes. */
export interface ConsumeOptions<Tx> {
  inbox: Inbox<Tx>
  /** The effect: runs in the inbox's transaction, with the message. */
  handler: (tx: Tx, message: InboxMessage) => Promise<unknown> | unknown
  /** Called when a message fails (it comes back later) or is refused for good (mismatch, no ID). */
  onError?: (error: unknown, message: InboxMessage) => void
  /**
   * Effects (inbox transactions) running at once, at most. Give the inbox's pool at least this many
   * connections, or the extra effects wait for one. `1` handles one message at a time, in delivery order.
   * @default 16
   */
  concurrency?: number
  /**
   * The ordering key of a message: messages with the same key are applied one after another, in
   * delivery order; messages with different keys (or with `null`) run in parallel. `null` for every
   * message drops the ordering constraint. Default per helper: the subject (NATS), the routing key
   * (RabbitMQ); no ordering on Redis Streams (every entry of a stream shares its only key, the stream).
   *
   * @example
   * partitionKey: (message) => message.headers?.['order-id'] ?? null
   */
  partitionKey?: ((message: InboxMessage) => string | null | undefined) | null
  /**
   * Messages handled in one inbox transaction at most, when several are waiting and the inbox has
   * `handleBatch` (PgInbox does): one commit for all, effects one after another. If the batch fails,
   * its messages are handled one at a time, so only the failing one is retried. `1` turns batching off.
   * @default 16
   */
  batchSize?: number
  /**
   * After a message fails (its effect or commit threw; the broker will deliver it again), its
   * partition key is held: the messages of that key in hand are returned to the broker unapplied,
   * and those that arrive later are returned too, until the failed message comes back (or this
   * long has passed, e.g. because the broker dead-lettered it). So a later message of a key is never
   * applied before an earlier one that failed. Keep it above the broker's redelivery delay.
   * @default 30_000
   */
  failureHoldMs?: number
  /**
   * How many times a message's effect may fail before the helper gives up on it: the failure that
   * reaches this count dead-letters the message instead of retrying it (RabbitMQ: rejected without
   * requeue, to the queue's dead-letter exchange if it has one; Redis Streams: moved to the
   * `deadLetterStream`; NATS: terminated), `onError` hears a `RETRIES_EXHAUSTED` error, and the
   * messages behind it in its key go on. Counted in the inbox's database (`recordFailure`) by every
   * process of this consumer, across restarts; by this process alone with an inbox that cannot
   * (docs/messaging.md, "A message that always fails"). Unset: retried until it succeeds.
   */
  maxAttempts?: number
  /**
   * With `maxAttempts` and an inbox that records failures (PgInbox, MySqlInbox, SqliteInbox): a message the
   * broker delivers again (RabbitMQ: `redelivered`; NATS: delivered before; Redis Streams: claimed) runs
   * isolated, once the effects running have ended, alone, with its attempt recorded before it runs. So an
   * effect that kills the process each time, which no failure counts, is given up on after `maxAttempts`
   * runs (+1: its first run, cut short, is not counted), and only the message that was running is blamed.
   * Redeliveries run one at a time. `false`: they run as any other message, and only the failures seen
   * count (docs/messaging.md, "A message that always fails").
   * @default true
   */
  isolateRedelivered?: boolean
}

/** A running consumer. */
export interface RunningConsumer {
  /** Stops taking messages and waits for the ones in hand (their effects commit and are acked). */
  stop(): Promise<void>
  /** Resolves when the consumer has stopped. */
  readonly done: Promise<void>
}

/** A count option: a positive integer, else `INVALID_OPTION` (0 would stall the consumer: it waits for room it never gets). */
export function positive(value: number | undefined, fallback: number, name: string): number {
  assertOptionalPositiveInteger(value, `consumer: ${name}`)
  return value ?? fallback
}

/** The `concurrency` option, checked. */
export function consumerConcurrency(options: { concurrency?: number }): number {
  return positive(options.concurrency, DEFAULT_CONSUMER_CONCURRENCY, 'concurrency')
}

/**
 * How many messages a helper holds unacked by default (its XREADGROUP COUNT, JetStream pull batch,
 * RabbitMQ prefetch): enough for every worker to take a full batch, `concurrency x batchSize`.
 */
export function defaultInHand(options: { concurrency?: number; batchSize?: number }, concurrency = consumerConcurrency(options)): number {
  return concurrency * positive(options.batchSize, DEFAULT_CONSUMER_BATCH_SIZE, 'batchSize')
}

/** The `maxAttempts` option, checked: a positive integer, or unset (no limit). */
export function maxAttemptsOption(options: { maxAttempts?: number }): number | undefined {
  assertOptionalPositiveInteger(options.maxAttempts, 'consumer: maxAttempts')
  return options.maxAttempts
}

/** How long a failed message's key is held unless told otherwise. */
export const DEFAULT_FAILURE_HOLD_MS = 30_000

/** The partition key of a message, by the caller's function or the helper's default. */
export function keyOf<Tx>(
  options: ConsumeOptions<Tx>,
  message: InboxMessage,
  fallback: (message: InboxMessage) => string | null | undefined,
): string | null {
  const fn = options.partitionKey === undefined ? fallback : options.partitionKey
  if (fn === null) return null
  return fn(message) ?? null
}

const warnedWindows = new Set<string>()

/**
 * Warns once per consumer and stream when the inbox forgets IDs sooner than the broker may still
 * redeliver a message (docs/messaging.md, "Sizing the inbox window"): a redelivery after the inbox
 * dropped the ID would be applied again. `horizonMs` is the broker's redelivery horizon; undefined
 * when the broker sets none it can tell.
 */
export function checkInboxWindow(
  consumer: string,
  source: string,
  retentionMs: number | undefined,
  horizonMs: number | undefined,
): boolean {
  if (retentionMs === undefined || horizonMs === undefined || horizonMs <= 0 || retentionMs >= horizonMs) return false
  const id = `${consumer}\n${source}`
  if (warnedWindows.has(id)) return true
  warnedWindows.add(id)
  const hours = (ms: number) => `${(ms / 3_600_000).toFixed(ms < 3_600_000 ? 2 : 1)} h`
  process.emitWarning(
    `Inbox "${consumer}" keeps processed message IDs for ${hours(retentionMs)}, but ${source} can redeliver a message for up to ${hours(horizonMs)}: a redelivery after ${hours(retentionMs)} would be applied twice. Keep the inbox's retention at least as long as the broker's horizon (retention: '${Math.ceil(horizonMs / 3_600_000)}h'), or shorten the broker's.`,
    { code: 'IDEMKEY_INBOX_WINDOW' },
  )
  return true
}
