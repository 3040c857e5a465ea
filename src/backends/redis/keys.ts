import * as crypto from 'node:crypto'
import { IdempotencyError } from '../../errors.js'

/** Prefixes are plain words: no `{`/`}` (they would move the hash tag) and no glob characters (SCAN MATCH). */
const PREFIX = /^[A-Za-z0-9_.:-]{1,64}$/

/** Throws `INVALID_OPTION` unless the prefix is safe in key names, hash tags and SCAN patterns. */
export function assertPrefix(prefix: string): void {
  if (typeof prefix !== 'string' || !PREFIX.test(prefix)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `RedisStore prefix must be 1-64 characters of A-Z a-z 0-9 _ . : -, got ${JSON.stringify(prefix)}.`,
    )
  }
}

const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'

/** One-shot `crypto.hash` (Node 20.12+): about 5x cheaper than `createHash` for a short text. */
const oneShot = (crypto as { hash?: (algorithm: string, data: string, encoding: 'base64url') => string }).hash

/**
 * The first `bytes` (9 or 16) of the SHA-256 digest of `text`, in base64url without padding. Every
 * store operation names its record with one, so it takes the one-shot hash where there is one and
 * cuts its text: the names are byte for byte those of the cut digest, on every Node version.
 */
function digest(text: string, bytes: 9 | 16): string {
  if (oneShot === undefined) return crypto.createHash('sha256').update(text).digest().subarray(0, bytes).toString('base64url')
  const full = oneShot('sha256', text, 'base64url')
  // 9 bytes are exactly 12 characters. 16 bytes are 21 characters and 2 bits: the 22nd character
  // of the cut digest holds those 2 bits and 4 zero bits, where the full one holds 6 digest bits.
  if (bytes === 9) return full.slice(0, 12)
  return full.slice(0, 21) + (BASE64URL[BASE64URL.indexOf(full.charAt(21)) & 0b110000] as string)
}

/** The Redis names of one record. */
export interface RecordNames {
  /** The key holding the record (a packed string). */
  key: string
  /** The pub/sub channel its changes are announced on. */
  channel: string
  /** The hash of its durable steps (read by a takeover only; expires with the record). */
  steps: string
}

/**
 * Names the record of (scope, key):
 *
 * ```
 *   <prefix>:r:<scope hash>:{<record hash>}    the record (a packed string)
 *   <prefix>:t:{<record hash>}                 its durable steps (a hash, only once a step is recorded)
 *   <prefix>:n:{<record hash>}                 its change channel
 * ```
 * Scopes and keys may hold `{`, `}`, `*` or `:`, so neither appears in a name: the hash tag is a
 * digest of both (128 bits), and the scope digest lets `list({ scope })` SCAN one scope's records.
 * The hash also stores scope and key, and acquire checks them, so a digest collision is caught.
 */
export function recordNames(prefix: string, scope: string, key: string): RecordNames {
  // Scopes hold no control characters, so a newline cannot forge a collision.
  const tag = digest(`${scope}\n${key}`, 16)
  return { key: `${prefix}:r:${scopeDigest(scope)}:{${tag}}`, channel: `${prefix}:n:{${tag}}`, steps: `${prefix}:t:{${tag}}` }
}

/** The SCAN pattern of every record, or of one scope's records. */
export function recordPattern(prefix: string, scope?: string): string {
  return scope === undefined ? `${prefix}:r:*` : `${prefix}:r:${scopeDigest(scope)}:*`
}

/** Scope digests by scope: an application uses few scopes, and every operation names one. */
const scopeDigests = new Map<string, string>()

function scopeDigest(scope: string): string {
  let cached = scopeDigests.get(scope)
  if (cached === undefined) {
    if (scopeDigests.size >= 1_000) scopeDigests.clear() // many scopes: a bounded cache, not a leak
    cached = digest(scope, 9)
    scopeDigests.set(scope, cached)
  }
  return cached
}
