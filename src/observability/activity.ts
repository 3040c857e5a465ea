import { assertFunctions, assertOptionalPositiveInteger } from '../core/validate.js'
import type { EngineEvent } from '../http/types.js'
import { keyHash } from './recorder.js'

/** The series the operator page charts, per bucket. */
export const SERIES = ['executed', 'replayed', 'in_progress', 'mismatch', 'store_error', 'unrecorded'] as const
/** The name of one series the operator page charts: an element of `SERIES`. */
export type Series = (typeof SERIES)[number]

/** Which series each event counts in. */
const SERIES_OF: Partial<Record<EngineEvent['type'], Series>> = {
  acquired: 'executed',
  replayed: 'replayed',
  in_progress: 'in_progress',
  mismatch: 'mismatch',
  store_error: 'store_error',
  unrecorded: 'unrecorded',
}

/** One mismatch, as the page lists it: when, and the key's hash (never the key). */
export interface RecentMismatch {
  atMs: number
  keyHash: string
}

/** What {@link Activity.snapshot} returns: counts per bucket, oldest first, and the last mismatches. */
export interface ActivitySnapshot {
  bucketMs: number
  /** Start of the first bucket (epoch ms). */
  fromMs: number
  series: Record<Series, number[]>
  mismatches: RecentMismatch[]
}

/**
 * Counts of what the ledger did over the last minutes (10 s buckets, 5 minutes by default) and the last
 * mismatches, fed by `onEvent`: the operator page's charts. Cheap: a few array writes per event.
 */
export class Activity {
  readonly bucketMs: number
  readonly buckets: number
  readonly #counts: Record<Series, number[]>
  readonly #mismatches: RecentMismatch[] = []
  readonly #now: () => number
  #head: number

  constructor(options: { bucketMs?: number; buckets?: number; now?: () => number } = {}) {
    // A bucket of 0 ms divides by 0 (the head is Infinity); a count of 0 or 1.5 buckets breaks the ring.
    assertOptionalPositiveInteger(options.bucketMs, 'new Activity() bucketMs')
    assertOptionalPositiveInteger(options.buckets, 'new Activity() buckets')
    assertFunctions('new Activity()', { now: options.now })
    this.bucketMs = options.bucketMs ?? 10_000
    this.buckets = options.buckets ?? 30
    this.#now = options.now ?? Date.now
    this.#head = Math.floor(this.#now() / this.bucketMs)
    this.#counts = Object.fromEntries(SERIES.map((s) => [s, new Array<number>(this.buckets).fill(0)])) as Record<Series, number[]>
  }

  /** An `onEvent` listener: pass it to the ledger, the middleware, or call it from yours. */
  readonly onEvent = (event: EngineEvent): void => {
    const series = SERIES_OF[event.type]
    if (series === undefined) return
    this.#add(series)
    if (event.type === 'mismatch') {
      this.#mismatches.unshift({ atMs: this.#now(), keyHash: keyHash(event.scope, event.key) })
      if (this.#mismatches.length > 20) this.#mismatches.pop()
    }
  }

  snapshot(): ActivitySnapshot {
    this.#advance()
    const start = this.#head - this.buckets + 1
    const series = {} as Record<Series, number[]>
    for (const name of SERIES) {
      const ring = this.#counts[name]
      series[name] = Array.from({ length: this.buckets }, (_, i) => ring[(start + i) % this.buckets] as number)
    }
    return { bucketMs: this.bucketMs, fromMs: start * this.bucketMs, series, mismatches: [...this.#mismatches] }
  }

  #add(series: Series): void {
    this.#advance()
    const ring = this.#counts[series]
    const slot = this.#head % this.buckets
    ring[slot] = (ring[slot] as number) + 1
  }

  /** Zeroes the buckets that time has moved past since the last event. */
  #advance(): void {
    const head = Math.floor(this.#now() / this.bucketMs)
    if (head === this.#head) return
    const steps = Math.min(this.buckets, head - this.#head)
    for (let i = 1; i <= steps; i++) {
      for (const name of SERIES) this.#counts[name][(this.#head + i) % this.buckets] = 0
    }
    this.#head = head
  }
}
