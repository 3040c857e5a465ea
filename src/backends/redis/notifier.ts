import type { Unsubscribe } from '../../core/store.js'
import type { RedisClientLike, RedisSubscriberLike } from './client.js'

/**
 * Wake-ups for waiters: one subscriber connection per store, opened on the first watch, with one
 * channel per watched record. The scripts PUBLISH on a record's channel when it is completed,
 * released or evicted.
 *
 * A SUBSCRIBE takes a round trip, and a change in that window would be missed; so each watcher is
 * called once when its subscription is in place ("it may have changed"): the ledger then looks at
 * the record again. Lost messages are harmless either way: waiters poll as well.
 */
export class Notifier {
  readonly #client: RedisClientLike
  #subscriber: RedisSubscriberLike | undefined
  /** channel → listeners */
  readonly #listeners = new Map<string, Set<() => void>>()
  /** Listener sets whose SUBSCRIBE failed (Redis was down): the next watcher of the channel subscribes again. */
  readonly #unsubscribed = new WeakSet<Set<() => void>>()
  #closed = false
  readonly #probeMs: number | undefined
  #probeTimer: NodeJS.Timeout | undefined

  /**
   * `probeMs`: for the store's own client (whose `socketTimeout` drops a connection that leaves a
   * command unanswered), a PING on the subscriber that often while anyone waits. A subscribed
   * connection only receives: gone half-open, nothing fails on it and messages stop for good; the
   * unanswered PING makes ioredis drop it, reconnect and subscribe again.
   */
  constructor(client: RedisClientLike, probeMs?: number) {
    this.#client = client
    this.#probeMs = probeMs
  }

  /**
   * `flag` marks the record as waited on (so its changes are published at all); the watcher's "may
   * have changed" call waits for both the flag and the subscription, so no change after it goes unannounced.
   */
  watch(channel: string, onChange: () => void, flag?: () => Promise<unknown>): Unsubscribe {
    if (this.#closed) return () => {}
    let listeners = this.#listeners.get(channel)
    if (!listeners) {
      listeners = new Set()
      this.#listeners.set(channel, listeners)
      this.#subscribe(channel, listeners, flag)
    } else if (this.#unsubscribed.has(listeners)) {
      // Its SUBSCRIBE failed, and ioredis subscribes again after a reconnect only to what it had: ask again.
      this.#unsubscribed.delete(listeners)
      this.#subscribe(channel, listeners, flag)
    }
    listeners.add(onChange)
    this.#scheduleProbe()
    return () => {
      listeners.delete(onChange)
      if (listeners.size > 0 || this.#listeners.get(channel) !== listeners) return
      this.#listeners.delete(channel)
      this.#subscriber?.unsubscribe(channel).catch(() => {})
    }
  }

  #subscribe(channel: string, listeners: Set<() => void>, flag: (() => Promise<unknown>) | undefined): void {
    Promise.all([this.#connection().subscribe(channel), flag?.()]).then(
      () => {
        for (const listener of [...listeners]) listener()
      },
      () => {
        // The subscriber is down: these waiters poll, and the channel's next watcher subscribes again.
        this.#unsubscribed.add(listeners)
      },
    )
  }

  #scheduleProbe(): void {
    if (this.#probeMs === undefined || this.#probeTimer !== undefined || this.#closed) return
    this.#probeTimer = setTimeout(() => {
      this.#probeTimer = undefined
      if (this.#listeners.size === 0 || this.#closed) return
      // A failed PING means the connection was dropped (and is being replaced): nothing to do here.
      this.#subscriber?.ping?.().catch(() => {})
      this.#scheduleProbe()
    }, this.#probeMs)
    this.#probeTimer.unref()
  }

  /** Closes the subscriber connection; watchers are dropped. */
  async close(): Promise<void> {
    this.#closed = true
    clearTimeout(this.#probeTimer)
    this.#probeTimer = undefined
    this.#listeners.clear()
    const subscriber = this.#subscriber
    this.#subscriber = undefined
    if (!subscriber) return
    try {
      await subscriber.quit()
    } catch {
      subscriber.disconnect()
    }
  }

  #connection(): RedisSubscriberLike {
    if (!this.#subscriber) {
      const subscriber = this.#client.duplicate()
      subscriber.on('error', () => {
        // ioredis reconnects and subscribes again by itself; meanwhile waiters poll.
      })
      subscriber.on('message', (channel) => {
        const listeners = this.#listeners.get(channel)
        if (listeners) for (const listener of [...listeners]) listener()
      })
      this.#subscriber = subscriber
    }
    return this.#subscriber
  }
}
