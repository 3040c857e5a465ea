import type { Clock } from './clock.js'
import type { IdempotencyStore } from './store.js'

/** Waits for a change of one record: woken by the store's notification, or after the poll interval. */
export class Waiter {
  #changed = false
  #wake: AbortController | undefined
  readonly #unsubscribe: (() => void) | undefined

  constructor(store: IdempotencyStore, scope: string, key: string) {
    this.#unsubscribe = store.watch?.(scope, key, () => {
      this.#changed = true
      this.#wake?.abort()
    })
  }

  async wait(clock: Clock, ms: number): Promise<void> {
    if (this.#changed) {
      this.#changed = false
      return
    }
    this.#wake = new AbortController()
    try {
      await clock.sleep(ms, this.#wake.signal)
    } catch {
      // Woken by a notification.
    }
    this.#changed = false
  }

  close(): void {
    this.#unsubscribe?.()
  }
}
