import { IdempotencyError } from '../../errors.js'
import { decodeHeaders } from '../shared.js'
import type { RecordStatus, StoredRecord } from '../store.js'

const STATUSES: ReadonlySet<string> = new Set(['in_progress', 'completed', 'failed'])

/**
 * The fields of a record's hash (short names: they are repeated in every record):
 *
 * | field | meaning | field | meaning |
 * |---|---|---|---|
 * | s, k | scope, key | rs, rh, rb | response status, headers (JSON), body |
 * | fp | fingerprint | rid | resource id (absent: null) |
 * | st | status | att | attempts |
 * | tok | fencing token | ca, ua | created at, updated at (ms) |
 * | lu | locked until (ms; ignored once completed) | ea | expires at (ms) |
 */
export type RecordHash = Map<string, Buffer>

/** Reads a flat HGETALL reply (`field, value, …`), starting at `from`. */
export function toHash(reply: unknown[], from: number): RecordHash {
  const hash: RecordHash = new Map()
  for (let i = from; i + 1 < reply.length; i += 2) hash.set(String(reply[i]), reply[i + 1] as Buffer)
  return hash
}

/** The epoch ms of a reply element (a Buffer holding digits, or an integer). */
export function toMs(value: unknown): number {
  return typeof value === 'number' ? value : Number(String(value))
}

/** Turns a record's hash into a {@link StoredRecord}; a hash idemkey did not write is `STORE_SCHEMA`. */
export function toRecord(hash: RecordHash, redisKey: string): StoredRecord {
  const text = (field: string) => hash.get(field)?.toString('utf8')
  const int = (field: string) => {
    const raw = text(field)
    const n = raw === undefined ? Number.NaN : Number(raw)
    if (!Number.isSafeInteger(n)) foreign(redisKey, field)
    return n
  }
  const status = text('st') as RecordStatus
  const scope = text('s')
  const key = text('k')
  const fingerprint = text('fp')
  if (!STATUSES.has(status)) foreign(redisKey, 'st')
  if (scope === undefined || key === undefined || fingerprint === undefined) foreign(redisKey, 's/k/fp')
  const done = status !== 'in_progress'
  const body = hash.get('rb')
  return {
    scope,
    key,
    fingerprint,
    status,
    token: int('tok'),
    lockedUntilMs: done ? null : int('lu'),
    response: done
      ? { status: int('rs'), headers: decodeHeaders(text('rh')), body: body ? new Uint8Array(body) : new Uint8Array(0) }
      : null,
    resourceId: text('rid') ?? null,
    attempts: int('att'),
    createdAtMs: int('ca'),
    updatedAtMs: int('ua'),
    expiresAtMs: int('ea'),
  }
}

function foreign(redisKey: string, field: string): never {
  throw new IdempotencyError(
    'STORE_SCHEMA',
    `redis: ${redisKey} is not an idemkey record (field "${field}" is missing or malformed). Another program writes under the store's prefix: give the store its own prefix, or delete the key (idemkey evict) if it is garbage.`,
  )
}
