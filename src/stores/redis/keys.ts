import { createHash } from 'node:crypto'
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

function digest(text: string, bytes: number): string {
  return createHash('sha256').update(text).digest().subarray(0, bytes).toString('base64url')
}

/** The Redis names of one record. */
export interface RecordNames {
  /** The hash holding the record. */
  key: string
  /** The pub/sub channel its changes are announced on. */
  channel: string
}

/**
 * Names the record of (scope, key):
 *
 * ```
 *   <prefix>:r:<scope hash>:{<record hash>}    the record's hash
 *   <prefix>:n:{<record hash>}                 its change channel
 * ```
 * Scopes and keys may hold `{`, `}`, `*` or `:`, so neither appears in a name: the hash tag is a
 * digest of both (128 bits), and the scope digest lets `list({ scope })` SCAN one scope's records.
 * The hash also stores scope and key, and acquire checks them, so a digest collision is caught.
 */
export function recordNames(prefix: string, scope: string, key: string): RecordNames {
  // Scopes hold no control characters, so a newline cannot forge a collision.
  const tag = digest(`${scope}\n${key}`, 16)
  return { key: `${prefix}:r:${scopeDigest(scope)}:{${tag}}`, channel: `${prefix}:n:{${tag}}` }
}

/** The SCAN pattern of every record, or of one scope's records. */
export function recordPattern(prefix: string, scope?: string): string {
  return scope === undefined ? `${prefix}:r:*` : `${prefix}:r:${scopeDigest(scope)}:*`
}

function scopeDigest(scope: string): string {
  return digest(scope, 9)
}
