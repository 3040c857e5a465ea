import type { AcquireResult, IdempotencyStore, ListFilter, Outcome, StoredRecord, Unsubscribe } from '../core/store.js'
import { storeUnavailable } from '../errors.js'

/**
 * A store opened on first use and reopened after a failed open, at most once per `retryMs`.
 * It lets the proxy start while its store is down: until the store opens, every call fails with
 * `STORE_UNAVAILABLE`, which the HTTP layer answers with `503` (fail closed).
 *
 * @example new ReconnectingStore('postgres', true, async () => { const s = await openStore(url); await s.migrate(); return s.store })
 */
export class ReconnectingStore implements IdempotencyStore {
  readonly name: string
  readonly serverClock: boolean
  readonly #open: () => Promise<IdempotencyStore>
  readonly #retryMs: number
  #store: IdempotencyStore | undefined
  #opening: Promise<IdempotencyStore> | undefined
  #failedAtMs = 0
  #lastError: unknown
  #closed = false

  constructor(name: string, serverClock: boolean, open: () => Promise<IdempotencyStore>, retryMs = 1_000) {
    this.name = name
    this.serverClock = serverClock
    this.#open = open
    this.#retryMs = retryMs
  }

  /** Whether the store is open now. */
  get connected(): boolean {
    return this.#store !== undefined
  }

  /** Opens the store if it is not open; rejects with `STORE_UNAVAILABLE` while it cannot be. */
  connect(): Promise<IdempotencyStore> {
    if (this.#store) return Promise.resolve(this.#store)
    if (this.#closed) return Promise.reject(storeUnavailable(this.name, 'open', new Error('the store was closed')))
    if (!this.#opening) {
      if (this.#lastError !== undefined && Date.now() - this.#failedAtMs < this.#retryMs) return Promise.reject(this.#lastError)
      this.#opening = this.#open().then(
        (store) => {
          this.#store = store
          this.#opening = undefined
          return store
        },
        (error: unknown) => {
          this.#failedAtMs = Date.now()
          this.#lastError = storeUnavailable(this.name, 'open', error)
          this.#opening = undefined
          throw this.#lastError
        },
      )
    }
    return this.#opening
  }

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    return (await this.connect()).acquire(scope, key, fingerprint, leaseMs)
  }
  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    return (await this.connect()).renew(scope, key, token, leaseMs)
  }
  async complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return (await this.connect()).complete(scope, key, token, outcome, ttlMs)
  }
  async release(scope: string, key: string, token: number): Promise<boolean> {
    return (await this.connect()).release(scope, key, token)
  }
  async get(scope: string, key: string): Promise<StoredRecord | null> {
    return (await this.connect()).get(scope, key)
  }
  async list(filter?: ListFilter): Promise<StoredRecord[]> {
    return (await this.connect()).list(filter)
  }
  async purgeExpired(limit: number): Promise<number> {
    return (await this.connect()).purgeExpired(limit)
  }
  async evict(scope: string, key: string): Promise<boolean> {
    return (await this.connect()).evict(scope, key)
  }
  watch(scope: string, key: string, onChange: () => void): Unsubscribe {
    return this.#store?.watch?.(scope, key, onChange) ?? (() => {})
  }
  async close(): Promise<void> {
    this.#closed = true
    const store = this.#store ?? (await this.#opening?.catch(() => undefined))
    this.#store = undefined
    await store?.close()
  }
}
