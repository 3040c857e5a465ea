import { hostname } from 'node:os'
import { type Duration, parseDuration, parsePositiveDuration } from '../../core/duration.js'
import { longTimeout } from '../../core/long-timer.js'
import { assertFunctions, assertMethods, assertOptionalPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import type { OutboxMessage, Publisher, PublishResult } from '../message.js'
import type { RelayStorage, RowFailure } from './storage.js'

/** First pause before a failed LISTEN is tried again; it doubles per failure (up to `backoffMax`). */
const LISTEN_RETRY_MS = 1_000

/** What the relay reports, for logs and metrics. */
export type RelayEvent =
  | { type: 'claimed'; relayId: string; count: number }
  /** The broker confirmed these; they are about to be marked sent. */
  | { type: 'published'; relayId: string; messages: readonly OutboxMessage[] }
  | { type: 'sent'; relayId: string; messages: readonly OutboxMessage[] }
  | { type: 'failed'; relayId: string; message: OutboxMessage; error: Error; dead: boolean; retryInMs: number }
  /** The relay itself hit an error (database down); it keeps running and tries again. */
  | { type: 'error'; relayId: string; error: unknown }

/** Options of {@link OutboxRelay}. */
export interface OutboxRelayOptions {
  /** The outbox to drain: a `PgOutbox`, a `MySqlOutbox`, a `SqliteOutbox`, or any {@link RelayStorage}. */
  outbox: { storage(): RelayStorage } | RelayStorage
  publisher: Publisher
  /** Rows claimed per batch. @default 256 */
  batchSize?: number
  /**
   * How long a claim lasts. A relay that dies keeps its rows this long, then another relay takes
   * them. Keep it well above the publisher's timeout, or a slow publish can overlap a retry. @default '30s'
   */
  lease?: Duration
  /** Poll this often when no notification comes (SQLite, or a lost LISTEN connection). @default '1s' */
  pollInterval?: Duration
  /** Attempts before a row is moved to the dead-letter state. @default 10 */
  maxAttempts?: number
  /** First retry delay; doubles per attempt, with jitter. @default '1s' */
  backoffInitial?: Duration
  /** Longest retry delay. @default '5m' */
  backoffMax?: Duration
  /**
   * Batches in flight at once in this relay: the next claim runs while the broker confirms the last
   * batch. Safe with partition ordering (claims exclude rows behind a leased one). @default 1
   */
  concurrency?: number
  /** Names this relay in `locked_by`. @default '<hostname>:<pid>:<random>' */
  relayId?: string
  onEvent?: (event: RelayEvent) => void
}

/**
 * Publishes committed outbox rows: claims a batch under a lease (`FOR UPDATE SKIP LOCKED` on
 * PostgreSQL, so several relays run side by side), publishes it, marks sent exactly the rows the
 * broker confirmed, retries the others with exponential backoff and dead-letters a row after
 * `maxAttempts`. Wakes on LISTEN/NOTIFY where the outbox offers it, and polls as a fallback.
 *
 * Delivery is at least once: a relay that dies after the broker confirmed but before it marked the
 * rows sent leaves them to be published again after the lease. The stable message ID lets the
 * broker (NATS dedup window) and the consumer's inbox drop the copy.
 *
 * @example
 * const relay = new OutboxRelay({ outbox, publisher: new NatsPublisher({ connection }) })
 * relay.start()
 * // on shutdown
 * await relay.stop()
 */
export class OutboxRelay {
  readonly relayId: string
  readonly #storage: RelayStorage
  readonly #publisher: Publisher
  readonly #batchSize: number
  readonly #leaseMs: number
  readonly #pollMs: number
  readonly #maxAttempts: number
  readonly #backoffInitialMs: number
  readonly #backoffMaxMs: number
  readonly #onEvent: (event: RelayEvent) => void
  #running: Promise<void> | undefined
  #stopping = false
  #wakeGeneration = 0
  readonly #sleepers = new Set<() => void>()
  readonly #concurrency: number

  constructor(options: OutboxRelayOptions) {
    if (!options?.outbox || !options.publisher) {
      throw new IdempotencyError('INVALID_OPTION', 'OutboxRelay needs { outbox, publisher }.')
    }
    assertMethods('OutboxRelay', 'publisher', options.publisher, ['publish'])
    assertFunctions('OutboxRelay', { onEvent: options.onEvent })
    this.#storage = 'storage' in options.outbox ? options.outbox.storage() : options.outbox
    this.#publisher = options.publisher
    assertOptionalPositiveInteger(options.batchSize, 'OutboxRelay batchSize')
    assertOptionalPositiveInteger(options.concurrency, 'OutboxRelay concurrency')
    assertOptionalPositiveInteger(options.maxAttempts, 'OutboxRelay maxAttempts')
    this.#batchSize = options.batchSize ?? 256
    this.#concurrency = options.concurrency ?? 1
    // A lease of 0 leaves a claimed row free for every other relay at once; a poll interval of 0 is a busy loop.
    this.#leaseMs = parsePositiveDuration(options.lease ?? '30s', 'lease')
    this.#pollMs = parsePositiveDuration(options.pollInterval ?? '1s', 'pollInterval')
    this.#maxAttempts = options.maxAttempts ?? 10
    this.#backoffInitialMs = parsePositiveDuration(options.backoffInitial ?? '1s', 'backoffInitial')
    this.#backoffMaxMs = parseDuration(options.backoffMax ?? '5m', 'backoffMax')
    this.relayId = options.relayId ?? `${hostname()}:${process.pid}:${Math.random().toString(36).slice(2, 8)}`
    this.#onEvent = options.onEvent ?? (() => {})
  }

  /** Starts the loop in the background. Errors are reported through `onEvent` and retried. */
  start(): void {
    if (this.#running) return
    this.#stopping = false
    this.#running = this.#loop()
  }

  /** Finishes the batch in flight, then stops. Rows not yet claimed stay for the next relay. */
  async stop(): Promise<void> {
    this.#stopping = true
    for (const wake of [...this.#sleepers]) wake()
    await this.#running
    this.#running = undefined
  }

  /** Wakes the loop now (e.g. after an `add()` on SQLite, which has no NOTIFY). */
  wake(): void {
    this.#wakeGeneration++
    for (const wake of [...this.#sleepers]) wake()
  }

  /** Claims and publishes one batch. Returns how many rows were claimed. */
  async runOnce(): Promise<number> {
    const batch = await this.#storage.claim(this.relayId, this.#batchSize, this.#leaseMs)
    if (batch.length === 0) return 0
    this.#emit({ type: 'claimed', relayId: this.relayId, count: batch.length })
    await this.#publishBatch(batch)
    return batch.length
  }

  async #loop(): Promise<void> {
    let unlisten: (() => Promise<void>) | undefined
    const listening = this.#listen().then((stop) => {
      unlisten = stop
    })
    await Promise.all(Array.from({ length: this.#concurrency }, () => this.#worker()))
    await listening
    await unlisten?.().catch(() => {})
  }

  /**
   * Starts the storage's LISTEN, beside the workers' polls. A first attempt that fails (the database
   * not up yet when the relay starts) is retried with backoff until it succeeds or the relay stops:
   * the storage re-listens by itself only after a LISTEN it once had breaks.
   */
  async #listen(): Promise<(() => Promise<void>) | undefined> {
    if (!this.#storage.listen) return undefined
    for (let failures = 0; !this.#stopping; failures++) {
      try {
        const unlisten = await this.#storage.listen(() => this.wake())
        // Rows committed while nobody listened are the polls' to find; with a long poll, look now.
        if (failures > 0) this.wake()
        return unlisten
      } catch (error) {
        this.#emit({ type: 'error', relayId: this.relayId, error })
        await this.#idle(Math.min(this.#backoffMaxMs, LISTEN_RETRY_MS * 2 ** Math.min(failures, 5)))
      }
    }
    return undefined
  }

  async #worker(): Promise<void> {
    let failures = 0
    while (!this.#stopping) {
      const generation = this.#wakeGeneration
      let claimed = 0
      try {
        claimed = await this.runOnce()
        failures = 0
      } catch (error) {
        failures++
        this.#emit({ type: 'error', relayId: this.relayId, error })
      }
      if (this.#stopping) break
      if (claimed >= this.#batchSize && failures === 0) continue
      // A notification during the batch may be for rows this claim did not see yet.
      if (generation !== this.#wakeGeneration && failures === 0) continue
      await this.#idle(failures > 0 ? Math.min(this.#backoffMaxMs, this.#pollMs * 2 ** Math.min(failures, 6)) : this.#pollMs)
    }
  }

  #idle(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        cancel()
        this.#sleepers.delete(done)
        resolve()
      }
      const cancel = longTimeout(done, ms)
      this.#sleepers.add(done)
    })
  }

  // Rows of one partition go out in waves, one per wave and in order; after a failure the rest of
  // that partition is released untouched, so a later event never overtakes an earlier one.
  async #publishBatch(batch: OutboxMessage[]): Promise<void> {
    const free: OutboxMessage[] = []
    const chains = new Map<string, OutboxMessage[]>()
    for (const message of batch) {
      if (message.partitionKey === null) free.push(message)
      else {
        const chain = chains.get(message.partitionKey)
        if (chain) chain.push(message)
        else chains.set(message.partitionKey, [message])
      }
    }
    const sent: OutboxMessage[] = []
    const failed: RowFailure[] = []
    const blocked = new Set<string>()
    const released: number[] = []
    for (let wave = 0; ; wave++) {
      const messages = wave === 0 ? [...free] : []
      for (const [key, chain] of chains) if (!blocked.has(key) && chain[wave]) messages.push(chain[wave] as OutboxMessage)
      if (messages.length === 0) break
      const results = await this.#publish(messages)
      for (const [i, message] of messages.entries()) {
        const result = results[i] ?? { ok: false, error: new Error('the publisher returned no result for this message'), retryable: true }
        if (result.ok) {
          sent.push(message)
          continue
        }
        const dead = !result.retryable || message.attempts >= this.#maxAttempts
        const retryInMs = dead ? 0 : this.#backoff(message.attempts)
        failed.push({ seq: message.seq, error: result.error.message, retryInMs, dead })
        this.#emit({ type: 'failed', relayId: this.relayId, message, error: result.error, dead, retryInMs })
        if (message.partitionKey !== null) {
          blocked.add(message.partitionKey)
          for (const later of (chains.get(message.partitionKey) ?? []).slice(wave + 1)) released.push(later.seq)
        }
      }
    }
    if (sent.length > 0) {
      this.#emit({ type: 'published', relayId: this.relayId, messages: sent })
      await this.#storage.markSent(sent.map((m) => m.seq))
      this.#emit({ type: 'sent', relayId: this.relayId, messages: sent })
    }
    await this.#storage.markFailed(this.relayId, failed)
    await this.#storage.release(this.relayId, released)
  }

  async #publish(messages: OutboxMessage[]): Promise<PublishResult[]> {
    try {
      return await this.#publisher.publish(messages)
    } catch (error) {
      // A publisher should report per message; if it throws, nothing counts as confirmed.
      const err = error instanceof Error ? error : new Error(String(error))
      return messages.map(() => ({ ok: false, error: err, retryable: true }))
    }
  }

  #backoff(attempts: number): number {
    const ceiling = Math.min(this.#backoffMaxMs, this.#backoffInitialMs * 2 ** Math.max(0, attempts - 1))
    return Math.round(ceiling / 2 + (Math.random() * ceiling) / 2)
  }

  #emit(event: RelayEvent): void {
    try {
      this.#onEvent(event)
    } catch {
      // A throwing metrics hook must not stop the relay.
    }
  }
}
