import { createHash } from 'node:crypto'
import { IdempotencyError } from '../errors.js'

/**
 * RFC 8785 (JSON Canonicalization Scheme): object keys sorted by UTF-16 code units, no whitespace,
 * numbers in ECMAScript's shortest round-trip form (which is what `JSON.stringify` writes for a
 * number), strings escaped as `JSON.stringify` escapes them.
 */
export function canonicalJson(value: unknown): string {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return JSON.stringify(value)
    case 'number':
      if (!Number.isFinite(value)) {
        throw new IdempotencyError('INVALID_ARGUMENT', `Cannot canonicalize ${value}: JSON has no such number.`)
      }
      return JSON.stringify(value)
    case 'object': {
      if (value === null) return 'null'
      if (Array.isArray(value)) return `[${value.map((item) => canonicalJson(item ?? null)).join(',')}]`
      const record = value as Record<string, unknown>
      if (typeof (record as { toJSON?: unknown }).toJSON === 'function') {
        return canonicalJson((record as { toJSON: () => unknown }).toJSON())
      }
      const keys = Object.keys(record)
        .filter((k) => record[k] !== undefined && typeof record[k] !== 'function')
        .sort()
      return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(record[k])}`).join(',')}}`
    }
    default:
      throw new IdempotencyError('INVALID_ARGUMENT', `Cannot canonicalize a ${typeof value} as JSON.`)
  }
}

/** Hex SHA-256 of bytes or text. */
export function sha256Hex(...parts: Array<string | Uint8Array>): string {
  const hash = createHash('sha256')
  for (const part of parts) hash.update(part)
  return hash.digest('hex')
}

/**
 * The fingerprint of a payload for the ledger: the SHA-256 of its canonical JSON, so the same
 * object with keys in another order is the same request.
 *
 * @example ledger.run({ key, fingerprint: fingerprintOf({ amount: 100, currency: 'eur' }) }, charge)
 */
export function fingerprintOf(payload: unknown): string {
  if (payload instanceof Uint8Array) return sha256Hex(payload)
  return sha256Hex(canonicalJson(payload))
}
