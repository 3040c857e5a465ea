/**
 * UUIDv7 by hand (RFC 9562 §5.7), on `crypto.getRandomValues` only:
 *
 *   0                   1                   2                   3
 *   | unix_ts_ms (48 bits)                        | ver=7 | rand_a (12) |var=10| rand_b (62)   |
 *
 * rand_a is a counter (RFC 9562 §6.2, method 1): it starts at a random value below 0x800 in each new
 * millisecond and grows by one for each key made in the same millisecond, so keys made by one process
 * sort in the order they were made. When it overflows, the timestamp moves one millisecond ahead.
 */

/** A clock step back smaller than this keeps counting from the last timestamp (order kept); a larger one restarts from the clock. */
const ROLLBACK_TOLERANCE_MS = 1_000

/** Makes UUIDv7 strings with its own ordering state. */
export type Uuidv7Generator = (nowMs?: number) => string

/**
 * A UUIDv7 generator with its own ordering state. {@link uuidv7} is one of these, shared by the
 * process; make your own only to keep one sequence apart from another.
 *
 * @example
 * const next = createUuidv7Generator()
 * next() < next() // true
 */
export function createUuidv7Generator(): Uuidv7Generator {
  let lastMs = Number.NEGATIVE_INFINITY
  let counter = 0
  return function uuidv7(nowMs: number = Date.now()): string {
    const bytes = new Uint8Array(16)
    crypto.getRandomValues(bytes)
    let ms = Math.floor(nowMs)
    if (!Number.isSafeInteger(ms) || ms < 0 || ms >= 2 ** 48) {
      throw new RangeError(`uuidv7 needs a time in Unix milliseconds between 0 and 2^48, got ${nowMs}.`)
    }
    if (ms > lastMs || ms < lastMs - ROLLBACK_TOLERANCE_MS) {
      lastMs = ms
      counter = (((bytes[6] as number) << 8) | (bytes[7] as number)) & 0x7ff
    } else {
      counter++
      if (counter > 0xfff) {
        lastMs++
        counter = (((bytes[6] as number) << 8) | (bytes[7] as number)) & 0x7ff
      }
      ms = lastMs
    }
    for (let i = 5; i >= 0; i--) {
      bytes[i] = ms % 256
      ms = Math.floor(ms / 256)
    }
    bytes[6] = 0x70 | (counter >> 8) // version 7, then the top 4 bits of the counter
    bytes[7] = counter & 0xff
    bytes[8] = 0x80 | ((bytes[8] as number) & 0x3f) // variant 10
    const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`
  }
}

/**
 * A UUIDv7 (RFC 9562 §5.7): 48 bits of Unix milliseconds, a 12-bit counter, 62 random bits. Keys made
 * this way sort by creation time (also within one millisecond, in one process), which keeps B-tree
 * indexes compact, but they reveal when they were made. Use `crypto.randomUUID()` (v4) when that
 * matters more: `createIdempotentFetch({ generateKey: () => crypto.randomUUID() })`.
 *
 * @example uuidv7() // '01937b6e-8f3a-7c4e-9a1b-3f2d5e6c7a8b'
 */
export const uuidv7: Uuidv7Generator = createUuidv7Generator()
