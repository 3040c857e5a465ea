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
  #closed = false

  constructor(client: RedisClientLike) {
    this.#client = client
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
      const subscribed = listeners
      Promise.all([this.#connection().subscribe(channel), flag?.()]).then(
        () => {
          for (const listener of [...subscribed]) listener()
        },
        () => {
          // The subscriber is down: waiters poll.
        },
      )
    }
    listeners.add(onChange)
    return () => {
      listeners.delete(onChange)
      if (listeners.size > 0 || this.#listeners.get(channel) !== listeners) return
      this.#listeners.delete(channel)
      this.#subscriber?.unsubscribe(channel).catch(() => {})
    }
  }

  /** Closes the subscriber connection; watchers are dropped. */
  async close(): Promise<void> {
    this.#closed = true
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
