import { systemClock } from './clock.js'
import { longTimeout, MAX_TIMER_MS } from './long-timer.js'
import { Schedule } from './schedule.js'

const THIRTY_DAYS_MS = 30 * 86_400_000

/** Every delay handed to setTimeout while `fn` runs. */
function delaysOf(fn: () => void): number[] {
  const spy = vi.spyOn(globalThis, 'setTimeout')
  try {
    fn()
    return spy.mock.calls.map((call) => Number(call[1]))
  } finally {
    spy.mockRestore()
  }
}

describe('timers past 24.8 days', () => {
  it('longTimeout sleeps a delay longer than one setTimeout keeps in pieces, and fires only at its end', () => {
    vi.useFakeTimers()
    try {
      const fired = vi.fn()
      longTimeout(fired, MAX_TIMER_MS + 5_000)
      vi.advanceTimersByTime(MAX_TIMER_MS)
      expect(fired).not.toHaveBeenCalled()
      vi.advanceTimersByTime(4_999)
      expect(fired).not.toHaveBeenCalled()
      vi.advanceTimersByTime(1)
      expect(fired).toHaveBeenCalledTimes(1)
    } finally {
      vi.useRealTimers()
    }
  })

  it('longTimeout is cancelled by its return value, in either piece', () => {
    vi.useFakeTimers()
    try {
      const fired = vi.fn()
      const cancel = longTimeout(fired, MAX_TIMER_MS + 5_000)
      vi.advanceTimersByTime(MAX_TIMER_MS + 1)
      cancel()
      vi.advanceTimersByTime(MAX_TIMER_MS)
      expect(fired).not.toHaveBeenCalled()
    } finally {
      vi.useRealTimers()
    }
  })

  it('the system clock and the schedule never hand setTimeout a delay it would cut to 1 ms', () => {
    const schedule = new Schedule(systemClock)
    const entry = { dueAtMs: 0, fire: vi.fn() }
    let cancelTimer = () => {}
    const controller = new AbortController()
    const delays = delaysOf(() => {
      cancelTimer = systemClock.timer(THIRTY_DAYS_MS, () => {})
      systemClock.sleep(THIRTY_DAYS_MS, controller.signal).catch(() => {})
      schedule.add(entry, THIRTY_DAYS_MS)
    })
    cancelTimer()
    controller.abort()
    schedule.remove(entry, THIRTY_DAYS_MS)
    expect(delays).toHaveLength(3)
    for (const delay of delays) expect(delay).toBeLessThanOrEqual(MAX_TIMER_MS)
  })
})
