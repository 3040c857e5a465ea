import { type Clock, systemClock } from './clock.js'
import { MAX_TIMER_MS } from './long-timer.js'

/** Something due after a delay: a lease renewal, a store call's timeout. */
export interface Scheduled {
  /** Set by the schedule: when it is due, by the schedule's clock. */
  dueAtMs: number
  /** Called once when due, unless removed before. */
  fire(): void
}

interface Lane {
  readonly delayMs: number
  /** In insertion order, which is due order: every entry of a lane waits the same delay. */
  readonly entries: Set<Scheduled>
  cancel: (() => void) | undefined
  /** While due entries fire: adds and removals leave the timer to the end of the walk. */
  firing: boolean
}

/**
 * Many timers of a few delays on one clock timer per delay. A ledger under load holds hundreds of
 * runs, each with a renewal due a third of a lease later and a store call that may time out; one
 * `setTimeout` each costs a timer object, a list insert and a removal per run, for timers that almost
 * never fire. Here an entry is a `Set` insert and delete; the clock's timer is armed for the oldest
 * entry of its delay only.
 *
 * On the system clock the timer is unref'd and left armed when its last entry goes (a run that ends
 * within one turn of the event loop, the common case, would otherwise arm and cancel one per run): it
 * fires once more, finds nothing and stops, and never keeps an idle process alive. On an injected clock
 * (a test's ManualClock) it is cancelled when its last entry goes, so the test sees no sleeper left.
 *
 * Entries of one delay are due in the order they were added, so firing walks from the front and stops
 * at the first that is not due.
 */
export class Schedule {
  readonly #lanes = new Map<number, Lane>()
  readonly #real: boolean

  constructor(readonly clock: Clock) {
    this.#real = clock === systemClock
  }

  /** Fires `entry` after `delayMs` unless {@link remove}d first. An entry is in one schedule at most once. */
  add(entry: Scheduled, delayMs: number): void {
    let lane = this.#lanes.get(delayMs)
    if (lane === undefined) {
      lane = { delayMs, entries: new Set(), cancel: undefined, firing: false }
      this.#lanes.set(delayMs, lane)
    }
    entry.dueAtMs = this.clock.now() + delayMs
    lane.entries.add(entry)
    if (lane.cancel === undefined && !lane.firing) this.#arm(lane, delayMs)
  }

  /** Forgets `entry`; nothing happens if it already fired or was never added. */
  remove(entry: Scheduled, delayMs: number): void {
    const lane = this.#lanes.get(delayMs)
    if (lane === undefined || !lane.entries.delete(entry)) return
    if (lane.entries.size === 0 && lane.cancel !== undefined && !lane.firing && !this.#real) {
      lane.cancel()
      lane.cancel = undefined
    }
  }

  #arm(lane: Lane, ms: number): void {
    if (this.#real) {
      // Capped at what one setTimeout keeps: a longer delay fires early, finds nothing due, re-arms.
      const timer = setTimeout(() => this.#fire(lane), Math.min(MAX_TIMER_MS, Math.max(1, ms)))
      timer.unref()
      lane.cancel = () => clearTimeout(timer)
    } else {
      lane.cancel = this.clock.timer(Math.max(1, ms), () => this.#fire(lane))
    }
  }

  #fire(lane: Lane): void {
    lane.cancel = undefined
    lane.firing = true
    const nowMs = this.clock.now()
    let next: Scheduled | undefined
    for (const entry of lane.entries) {
      if (entry.dueAtMs > nowMs) {
        next = entry
        break
      }
      lane.entries.delete(entry)
      try {
        entry.fire()
      } catch {
        // An entry's own failure must not keep the others from firing.
      }
    }
    lane.firing = false
    // An entry added while firing is due a whole delay later, behind any that was waiting.
    next ??= lane.entries.values().next().value
    if (next !== undefined) this.#arm(lane, next.dueAtMs - nowMs)
  }
}
