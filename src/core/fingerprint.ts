import * as crypto from 'node:crypto'
import { canonicalJson } from './canonical-json.js'

// Re-exported so existing imports of canonicalJson from here keep working; the JSON code lives in canonical-json.ts.
export { canonicalJson } from './canonical-json.js'
export { canonicalJsonText, MAX_JSON_DEPTH } from './canonical-json-text.js'

// One-shot hashing (Node >= 20.12) skips the Hash object: most of the cost of hashing a small request.
const oneShot = (crypto as { hash?: (algorithm: string, data: string | Uint8Array, encoding: 'hex') => string }).hash

/** Hex SHA-256 of bytes or text; several parts hash as their concatenation. */
export function sha256Hex(...parts: Array<string | Uint8Array>): string {
  if (oneShot !== undefined) {
    if (parts.length === 1) return oneShot('sha256', parts[0] as string | Uint8Array, 'hex')
    if (parts.every((part) => typeof part === 'string')) return oneShot('sha256', parts.join(''), 'hex')
  }
  const hash = crypto.createHash('sha256')
  for (const part of parts) hash.update(part)
  return hash.digest('hex')
}

/**
 * The fingerprint of a payload for the ledger: the SHA-256 of its canonical JSON, so the same
 * object with keys in another order is the same request, while numbers that differ anywhere (a
 * `bigint` beyond 2^53 included) stay different requests. Bytes are hashed as they are.
 *
 * @throws IdempotencyError `INVALID_ARGUMENT` for a payload JSON cannot carry exactly (see
 *   {@link canonicalJson}): a Map or Set, a non-finite number, a cycle, `undefined`.
 *
 * @example ledger.run({ key, fingerprint: fingerprintOf({ amount: 100, currency: 'eur' }) }, charge)
 */
export function fingerprintOf(payload: unknown): string {
  if (payload instanceof Uint8Array) return sha256Hex(payload)
  return sha256Hex(canonicalJson(payload))
}
