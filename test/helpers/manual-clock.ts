import type { ManualClock } from '../../src/core/clock.js'

/** One turn of the event loop: pending promise callbacks run. */
export const turn = (): Promise<void> => new Promise<void>((resolve) => setImmediate(resolve))

/** Moves the clock by `stepMs` whenever the code under test sleeps, until `promise` settles. */
export async function drive<T>(clock: ManualClock, promise: Promise<T>, stepMs = 1): Promise<T> {
  let settled = false
  const watched = promise.finally(() => {
    settled = true
  })
  for (let i = 0; i < 10_000 && !settled; i++) {
    await turn()
    if (!settled && clock.pendingSleeps > 0) clock.advance(stepMs)
  }
  return watched
}
