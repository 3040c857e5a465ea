/**
 * `setTimeout` for any delay. Node keeps a timer's delay in a signed 32-bit integer: past 2^31 - 1 ms
 * (24.8 days) it warns (TimeoutOverflowWarning) and fires after 1 ms instead. A lease, a store timeout
 * or an interval of a month would then fire at once, every time. Here a long delay is slept in pieces.
 */

/** The longest delay one `setTimeout` keeps: 2^31 - 1 ms, about 24.8 days. */
export const MAX_TIMER_MS = 2 ** 31 - 1

/**
 * Calls `callback` once after `ms` (a delay below 0 counts as 0); returns a function that cancels it.
 * With `unref`, the timer does not keep the process alive.
 *
 * @example
 * const cancel = longTimeout(() => renew(), 30 * 86_400_000) // 30 days, not 1 ms
 */
export function longTimeout(callback: () => void, ms: number, unref = false): () => void {
  let handle: ReturnType<typeof setTimeout>
  const arm = (leftMs: number) => {
    handle = leftMs > MAX_TIMER_MS ? setTimeout(() => arm(leftMs - MAX_TIMER_MS), MAX_TIMER_MS) : setTimeout(callback, leftMs)
    if (unref) handle.unref()
  }
  arm(Math.max(0, ms))
  return () => clearTimeout(handle)
}
