import type { RunOptions } from '../../src/core/ledger.js'

/**
 * Run options under which the work's value is answered with `status`, as an HTTP handler's response
 * is: `answeredWith(422)` makes a returned value a final failure (stored `failed|422` and replayed), as a
 * handler that answers "out of stock" does.
 */
export function answeredWith<T>(status: number, more: RunOptions<T> = {}): RunOptions<T> {
  return {
    encode: (value) => ({ status, headers: {}, body: new TextEncoder().encode(JSON.stringify(value ?? null)) }),
    ...more,
  }
}
