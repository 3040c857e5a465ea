import * as crypto from 'node:crypto'
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
      // Built by appending: a fingerprint is taken on every covered request, so no arrays per level.
      if (Array.isArray(value)) {
        let out = '['
        for (let i = 0; i < value.length; i++) {
          if (i > 0) out += ','
          out += canonicalJson(value[i] ?? null)
        }
        return `${out}]`
      }
      const record = value as Record<string, unknown>
      if (typeof (record as { toJSON?: unknown }).toJSON === 'function') {
        return canonicalJson((record as { toJSON: () => unknown }).toJSON())
      }
      let out = '{'
      for (const k of Object.keys(record).sort()) {
        const item = record[k]
        if (item === undefined || typeof item === 'function') continue
        out += `${out.length > 1 ? ',' : ''}${JSON.stringify(k)}:${canonicalJson(item)}`
      }
      return `${out}}`
    }
    default:
      throw new IdempotencyError('INVALID_ARGUMENT', `Cannot canonicalize a ${typeof value} as JSON.`)
  }
}

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
 * object with keys in another order is the same request.
 *
 * @example ledger.run({ key, fingerprint: fingerprintOf({ amount: 100, currency: 'eur' }) }, charge)
 */
export function fingerprintOf(payload: unknown): string {
  if (payload instanceof Uint8Array) return sha256Hex(payload)
  return sha256Hex(canonicalJson(payload))
}
