/**
 * The CDC relay's publish loop: takes committed rows from a replication stream's queue in batches,
 * publishes them with per-partition order and backoff, and confirms a transaction on the stream once
 * the broker has it and everything before it.
 */
import type { OutboxMessage, Publisher, PublishResult } from '../../messaging/message.js'
import type { RelayEvent } from '../../messaging/outbox/relay.js'
import type { CdcItem, CdcStream } from './postgres-cdc-stream.js'

/** The events the publish loop reports. */
export type CdcPublishEvent = Extract<RelayEvent, { type: 'published' | 'failed' | 'error' }>

export interface CdcPublishLoopOptions {
  relayId: string
  publisher: Publisher
  batchSize: number
  maxAttempts: number
  backoffInitialMs: number
  backoffMaxMs: number
  emit(event: CdcPublishEvent): void
  /** Marks a message the broker keeps refusing as dead in the outbox table. */
  markDead(message: OutboxMessage, error: Error): Promise<void>
  /** Sleeps `ms`, or less when the relay stops or the stream closes. */
  sleep(ms: number): Promise<void>
  stopping(): boolean
}

export class CdcPublishLoop {
  readonly #options: CdcPublishLoopOptions

  constructor(options: CdcPublishLoopOptions) {
    this.#options = options
  }

  /** Publishes what the stream queues until it closes. */
  async run(stream: CdcStream): Promise<void> {
    const { batchSize, relayId, emit } = this.#options
    while (!stream.closed) {
      if (stream.queue.length === 0) {
        await stream.nextItems()
        continue
      }
      const items = takeBatch(stream.queue, batchSize)
      if (stream.queue.length <= batchSize) stream.resume()
      stream.inFlight = true
      try {
        const messages = items.flatMap((item) => (item.message ? [item.message] : []))
        const delivered = await this.#deliver(stream, messages)
        const ack = items.findLast((item) => item.ackLsn !== undefined)?.ackLsn
        if (delivered && ack) stream.advance(ack)
      } catch (error) {
        emit({ type: 'error', relayId, error })
      } finally {
        stream.inFlight = false
      }
    }
  }

  /**
   * Publishes in waves: every message without a partition key at once, and the head of each
   * partition's chain; a retryable failure holds its chain (and the confirmed position) and is retried
   * with backoff, so a later event never overtakes an earlier one. Returns false when the connection
   * closed first: the slot will stream those rows again.
   */
  async #deliver(stream: CdcStream, batch: OutboxMessage[]): Promise<boolean> {
    const { relayId, emit } = this.#options
    const chains = partitionChains(batch)
    const attempts = new Map<string, number>()
    const sent: OutboxMessage[] = []
    let retries = 0
    for (;;) {
      const active = chains.filter((chain) => chain.length > 0)
      if (active.length === 0) break
      const heads = active.map((chain) => chain[0] as OutboxMessage)
      const results = await this.#publish(heads.map((m) => ({ ...m, attempts: (attempts.get(m.id) ?? 0) + 1 })))
      let failed = false
      for (const [i, message] of heads.entries()) {
        const result = results[i] ?? { ok: false, error: new Error('the publisher returned no result for this message'), retryable: true }
        const chain = active[i] as OutboxMessage[]
        if (result.ok) {
          sent.push(message)
          chain.shift()
          continue
        }
        const tries = (attempts.get(message.id) ?? 0) + 1
        attempts.set(message.id, tries)
        const dead = !result.retryable || tries >= this.#options.maxAttempts
        const retryInMs = dead ? 0 : this.#backoff(retries + 1)
        emit({ type: 'failed', relayId, message: { ...message, attempts: tries }, error: result.error, dead, retryInMs })
        if (dead) {
          chain.shift()
          await this.#options.markDead(message, result.error)
        } else failed = true
      }
      if (!failed) continue
      if (stream.closed || this.#options.stopping()) return false
      await this.#options.sleep(this.#backoff(++retries))
    }
    if (sent.length > 0) emit({ type: 'published', relayId, messages: sent })
    return true
  }

  async #publish(messages: OutboxMessage[]): Promise<PublishResult[]> {
    try {
      return await this.#options.publisher.publish(messages)
    } catch (error) {
      const err = error instanceof Error ? error : new Error(String(error))
      return messages.map(() => ({ ok: false, error: err, retryable: true }))
    }
  }

  #backoff(attempt: number): number {
    const { backoffInitialMs, backoffMaxMs } = this.#options
    const ceiling = Math.min(backoffMaxMs, backoffInitialMs * 2 ** Math.max(0, attempt - 1))
    return Math.round(ceiling / 2 + (Math.random() * ceiling) / 2)
  }
}

/** Up to `batchSize` messages from the front of the queue, with the transaction ends among them. */
function takeBatch(queue: CdcItem[], batchSize: number): CdcItem[] {
  let count = 0
  let end = 0
  while (end < queue.length) {
    const item = queue[end] as CdcItem
    if (item.message) {
      if (count === batchSize) break
      count++
    }
    end++
  }
  return queue.splice(0, end)
}

/** A chain per partition key in batch order, and a chain of one for each message without a key. */
function partitionChains(batch: OutboxMessage[]): OutboxMessage[][] {
  const chains: OutboxMessage[][] = []
  const byKey = new Map<string, OutboxMessage[]>()
  for (const message of batch) {
    if (message.partitionKey === null) chains.push([message])
    else {
      const chain = byKey.get(message.partitionKey)
      if (chain) chain.push(message)
      else {
        const fresh = [message]
        byKey.set(message.partitionKey, fresh)
        chains.push(fresh)
      }
    }
  }
  return chains
}
