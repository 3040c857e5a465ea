import { longTimeout } from './long-timer.js'
import { assertMethods } from './validate.js'

/**
 * Where the ledger and the single-process stores get time from. All times are integer epoch
 * milliseconds. Tests inject a {@link ManualClock} and move time by hand.
 */
export interface Clock {
  now(): number
  /** Resolves after `ms` of this clock's time, or rejects with the signal's reason when aborted. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>
  /** Calls `callback` once after `ms` of this clock's time; returns a function that cancels it. */
  timer(ms: number, callback: () => void): () => void
}

/**
 * Refuses, with `INVALID_OPTION`, a `clock` option that is not a {@link Clock} (one without `sleep()`
 * or `timer()` failed at the first operation that waits). `undefined` passes: the system clock.
 */
export function assertClock(where: string, name: string, value: unknown): void {
  assertMethods(where, name, value, ['now', 'sleep', 'timer'])
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('The operation was aborted', 'AbortError')
}

/** The real clock: `Date.now()` and `setTimeout`. */
export const systemClock: Clock = {
  now: () => Date.now(),
  timer(ms, callback) {
    return longTimeout(callback, ms)
  },
  sleep(ms, signal) {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(abortReason(signal))
      const onAbort = () => {
        cancel()
        reject(abortReason(signal as AbortSignal))
      }
      const cancel = longTimeout(() => {
        signal?.removeEventListener('abort', onAbort)
        resolve()
      }, ms)
      signal?.addEventListener('abort', onAbort, { once: true })
    })
  },
}

interface Sleeper {
  wakeAtMs: number
  resolve: () => void
}

/**
 * A clock that moves only when told to. Sleepers wake when {@link ManualClock.advance} passes their time.
 *
 * @example
 * const clock = new ManualClock()
 * const store = new MemoryStore({ clock })
 * clock.advance('31s') // every lease of 30s has now ended
 */
export class ManualClock implements Clock {
  #nowMs: number
  #sleepers: Sleeper[] = []

  constructor(startMs = Date.UTC(2030, 0, 1)) {
    this.#nowMs = startMs
  }

  now(): number {
    return this.#nowMs
  }

  /** Moves time forward and wakes every sleeper whose time has come. */
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError(`ManualClock.advance takes a non-negative number, got ${ms}`)
    this.#nowMs += ms
    const due = this.#sleepers.filter((s) => s.wakeAtMs <= this.#nowMs)
    this.#sleepers = this.#sleepers.filter((s) => s.wakeAtMs > this.#nowMs)
    for (const sleeper of due) sleeper.resolve()
  }

  /** How many sleepers are waiting: lets a test advance only once the code under test sleeps. */
  get pendingSleeps(): number {
    return this.#sleepers.length
  }

  timer(ms: number, callback: () => void): () => void {
    const sleeper: Sleeper = { wakeAtMs: this.#nowMs + Math.max(0, ms), resolve: callback }
    this.#sleepers.push(sleeper)
    return () => {
      this.#sleepers = this.#sleepers.filter((s) => s !== sleeper)
    }
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(abortReason(signal))
      if (ms <= 0) return resolve()
      const sleeper: Sleeper = {
        wakeAtMs: this.#nowMs + ms,
        resolve: () => {
          signal?.removeEventListener('abort', onAbort)
          resolve()
        },
      }
      const onAbort = () => {
        this.#sleepers = this.#sleepers.filter((s) => s !== sleeper)
        reject(abortReason(signal as AbortSignal))
      }
      signal?.addEventListener('abort', onAbort, { once: true })
      this.#sleepers.push(sleeper)
    })
  }
}
