import { parseDuration } from '../../core/duration.js'
import { longTimeout } from '../../core/long-timer.js'
import type { IdempotencyStore } from '../../core/store.js'
import type { PostgresGcOptions } from './options.js'

/**
 * The optional purge loop of a store: rounds of bounded batches on an unref'd timer, or, on the
 * partitioned layout, a rotation of partitions per round (`rotate`).
 */
export class PostgresTasks {
  readonly #store: Pick<IdempotencyStore, 'purgeExpired'>
  readonly #rotate: (() => Promise<unknown>) | undefined
  readonly #intervalMs: number
  readonly #batchSize: number
  readonly #onError: (error: unknown) => void
  #cancel: () => void = () => {}
  #round: Promise<void> | undefined
  #stopped = false

  constructor(
    store: Pick<IdempotencyStore, 'purgeExpired'>,
    options: boolean | PostgresGcOptions | undefined,
    rotate?: () => Promise<unknown>,
  ) {
    this.#store = store
    this.#rotate = rotate
    const gc = options === true ? {} : options || undefined
    this.#intervalMs = parseDuration(gc?.interval ?? '1m', 'gc.interval')
    this.#batchSize = gc?.batchSize ?? 1_000
    this.#onError = gc?.onError ?? (() => {})
    if (gc) this.#schedule()
  }

  /** One round: batches until a batch deletes fewer rows than its limit. Returns how many were deleted. */
  async round(): Promise<number> {
    if (this.#rotate) {
      await this.#rotate()
      return 0
    }
    let total = 0
    for (;;) {
      const purged = await this.#store.purgeExpired(this.#batchSize)
      total += purged
      if (purged < this.#batchSize || this.#stopped) return total
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true
    this.#cancel()
    await this.#round
  }

  #schedule(): void {
    if (this.#stopped) return
    this.#cancel = longTimeout(
      () => {
        this.#round = this.round()
          .then(
            () => {},
            (error: unknown) => this.#onError(error),
          )
          .finally(() => this.#schedule())
      },
      this.#intervalMs,
      true,
    )
  }
}
