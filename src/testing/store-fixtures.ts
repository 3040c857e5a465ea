/** What the store suites share: the store factory's type, fingerprints and outcomes for tests, skipping. */
import type { ManualClock } from '../core/clock.js'
import { sha256Hex } from '../core/fingerprint.js'
import type { IdempotencyStore, Outcome } from '../core/store.js'

/** Builds the store under test. Single-process stores must use `clock`; server-clock stores ignore it. */
export type StoreFactory = (env: { clock: ManualClock }) => IdempotencyStore | Promise<IdempotencyStore>

/** A fingerprint for the tests: the hash of a label. */
export const fp = (label: string): string => sha256Hex(label)

export const ALL_BYTES = Uint8Array.from({ length: 256 }, (_, i) => i)

/** A stored outcome with every byte value in the body, and headers to round-trip. */
export function sampleOutcome(status: 'completed' | 'failed' = 'completed', body: Uint8Array = ALL_BYTES): Outcome {
  return {
    status,
    response: {
      status: status === 'completed' ? 201 : 400,
      headers: { 'content-type': 'application/octet-stream', etag: '"v1"', location: '/orders/42' },
      body,
    },
    resourceId: 'order_42',
  }
}

/**
 * Marks the running test skipped, with `reason`, in the frameworks that can (vitest and node:test
 * through the test's context, mocha through `this`); elsewhere (jest) says so loudly on stderr.
 * Test functions take `...args`, so mocha and jest never mistake them for callback-style tests.
 */
export function skipRunning(reason: string, self: unknown, context: unknown): void {
  const viaContext = (context as { skip?: (note?: string) => void } | undefined)?.skip
  if (typeof viaContext === 'function') {
    viaContext.call(context, reason) // vitest throws here to end the test as skipped; node:test marks it and returns
    return
  }
  const viaThis = (self as { skip?: () => void } | undefined)?.skip
  if (typeof viaThis === 'function') {
    viaThis.call(self) // mocha throws here to end the test as pending
    return
  }
  console.warn(`\n!!! SKIPPED (not run, shown as passed by this framework): ${reason}\n`)
}
