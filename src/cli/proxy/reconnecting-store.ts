import type { AcquireResult, IdempotencyStore, ListFilter, Outcome, StoredRecord, Unsubscribe } from '../../core/store.js'
import { storeUnavailable } from '../../errors.js'

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
  #up: boolean | undefined
  readonly #onStateChange: ((up: boolean, error?: unknown) => void) | undefined

  /**
   * `onStateChange` hears when the store stops answering (`false`, with the error) and when it
   * answers again (`true`): once per change, not once per call.
   */
  constructor(
    name: string,
    serverClock: boolean,
    open: () => Promise<IdempotencyStore>,
    retryMs = 1_000,
    onStateChange?: (up: boolean, error?: unknown) => void,
  ) {
    this.name = name
    this.serverClock = serverClock
    this.#open = open
    this.#retryMs = retryMs
    this.#onStateChange = onStateChange
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

  /** Whether the store answered its last call: `undefined` before the first one. */
  get up(): boolean | undefined {
    return this.#up
  }

  /** The store failed a call (or a call timed out above this layer): reported once per outage. */
  markDown(error: unknown): void {
    if (this.#up === false) return
    this.#up = false
    this.#onStateChange?.(false, error)
  }

  /** The store answered a call: reported once when it comes back (or answers for the first time). */
  markUp(): void {
    if (this.#up === true) return
    this.#up = true
    this.#onStateChange?.(true)
  }

  #call<R>(call: (store: IdempotencyStore) => Promise<R>): Promise<R> {
    return this.connect()
      .then(call)
      .then(
        (value) => {
          if (this.#up !== true) this.markUp()
          return value
        },
        (error: unknown) => {
          if (!this.#closed) this.markDown(error)
          throw error
        },
      )
  }

  acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    return this.#call((store) => store.acquire(scope, key, fingerprint, leaseMs))
  }
  renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    return this.#call((store) => store.renew(scope, key, token, leaseMs))
  }
  complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return this.#call((store) => store.complete(scope, key, token, outcome, ttlMs))
  }
  release(scope: string, key: string, token: number): Promise<boolean> {
    return this.#call((store) => store.release(scope, key, token))
  }
  get(scope: string, key: string): Promise<StoredRecord | null> {
    return this.#call((store) => store.get(scope, key))
  }
  list(filter?: ListFilter): Promise<StoredRecord[]> {
    return this.#call((store) => store.list(filter))
  }
  /** The opened store's answer; every record `false` when it has no transactional holders. */
  heldInTransaction(records: ReadonlyArray<{ scope: string; key: string }>): Promise<boolean[]> {
    return this.#call(async (store) => (store.heldInTransaction ? store.heldInTransaction(records) : records.map(() => false)))
  }
  purgeExpired(limit: number): Promise<number> {
    return this.#call((store) => store.purgeExpired(limit))
  }
  evict(scope: string, key: string): Promise<boolean> {
    return this.#call((store) => store.evict(scope, key))
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
