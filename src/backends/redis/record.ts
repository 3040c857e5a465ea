import type { RecordStatus, StepEntry, StoredRecord } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { decodeHeaders } from '../records.js'

/** The record-format tag every value idemkey writes under a record key starts with: idemkey's packed record, format 1. */
export const RECORD_TAG = 'ik1'

/**
 * What `watch()` leaves under a key that holds no record yet (watch.lua): the tag, the waiter flag set,
 * no steps, state `w`. Every script counts it as absent; the record's acquire turns it into the flag.
 */
export const WATCH_MARKER = `${RECORD_TAG}10w`

/** The epoch ms of a reply element (a Buffer holding digits, or an integer). */
export function toMs(value: unknown): number {
  return typeof value === 'number' ? value : Number(String(value))
}

function foreign(redisKey: string, field: string): never {
  throw new IdempotencyError(
    'STORE_SCHEMA',
    `redis: ${redisKey} is not an idemkey record (field "${field}" is missing or malformed). Another program writes under the store's prefix: give the store its own prefix, or delete the key (idemkey evict) if it is garbage.`,
  )
}

/** The step fields of a takeover's acquire reply (`~name`, result text or '' for a started marker) as step entries. */
export function stepsFromFields(fields: unknown[]): StepEntry[] {
  const steps: StepEntry[] = []
  for (let i = 0; i + 1 < fields.length; i += 2) {
    const result = String(fields[i + 1])
    steps.push({ name: String(fields[i]).slice(1), result: result === '' ? null : result })
  }
  return steps
}

const BAR = 0x7c // '|'
/** The state letters of a record in its absolute form (byte 5): p, c, f. */
const IN_PROGRESS = 0x70
const COMPLETED = 0x63
const FAILED = 0x66

/** Whether `v` starts with the {@link RECORD_TAG} and holds a state letter and its first separator (7 bytes). */
function hasRecordHead(v: Buffer): boolean {
  return v.length >= 7 && v[0] === 0x69 /* i */ && v[1] === 0x6b /* k */ && v[2] === 0x31 /* 1 */ && v[6] === BAR
}

/** Whether `v` is a completed or failed record in its absolute form (`ik1 <w> <s> c|f |`). */
export function isSettled(v: Buffer): boolean {
  return hasRecordHead(v) && (v[5] === COMPLETED || v[5] === FAILED)
}

/**
 * Decodes a packed record (the value of a record's key, docs/redis.md):
 *
 * ```
 * ik1 <w> <s> <st> | tok | lu | att | ca | ua | ea | <fingerprint, 64 hex>
 *   <scope bytes> | <key bytes> | <scope><key>
 *   [completed or failed:] <response status> | <resource id bytes, -1: none> | <headers bytes> | <resource id><headers JSON><body>
 * ```
 * `w` is 1 once someone waits (complete and release then PUBLISH), `s` is 1 once a step is recorded
 * (the steps hash exists), `st` is p (in progress), c (completed) or f (failed). One pass over a
 * Buffer: every replay decodes a record.
 */
export function fromPacked(v: Buffer, redisKey: string): StoredRecord {
  if (!hasRecordHead(v)) foreign(redisKey, 'header')
  const st = v[5]
  const status: RecordStatus =
    st === IN_PROGRESS ? 'in_progress' : st === COMPLETED ? 'completed' : st === FAILED ? 'failed' : foreign(redisKey, 'st')
  let at = 7
  const int = (field: string): number => {
    let n = 0
    let digits = 0
    for (; at < v.length; at++) {
      const c = v[at] as number
      if (c === BAR) break
      if (c < 0x30 || c > 0x39) foreign(redisKey, field)
      n = n * 10 + (c - 0x30)
      digits++
    }
    if (at >= v.length || digits === 0 || !Number.isSafeInteger(n)) foreign(redisKey, field)
    at++
    return n
  }
  const token = int('tok')
  const lockedUntil = int('lu')
  const attempts = int('att')
  const createdAtMs = int('ca')
  const updatedAtMs = int('ua')
  const expiresAtMs = int('ea')
  if (at + 64 > v.length) foreign(redisKey, 'fp')
  const fingerprint = v.toString('latin1', at, at + 64)
  at += 64
  const scopeBytes = int('scope')
  const keyBytes = int('key')
  if (at + scopeBytes + keyBytes > v.length) foreign(redisKey, 'scope/key')
  const scope = v.toString('utf8', at, at + scopeBytes)
  const key = v.toString('utf8', at + scopeBytes, at + scopeBytes + keyBytes)
  at += scopeBytes + keyBytes
  const done = status !== 'in_progress'
  let response: StoredRecord['response'] = null
  let resourceId: string | null = null
  if (done) {
    const responseStatus = int('rs')
    let ridBytes = -1
    if (v[at] === 0x2d) {
      at++
      if (int('rid') !== 1) foreign(redisKey, 'rid')
    } else ridBytes = int('rid')
    const headerBytes = int('rh')
    const rid = Math.max(ridBytes, 0)
    if (at + rid + headerBytes > v.length) foreign(redisKey, 'rh')
    if (ridBytes >= 0) resourceId = v.toString('utf8', at, at + rid)
    const headers = decodeHeaders(v.toString('utf8', at + rid, at + rid + headerBytes))
    // A copy: the record outlives the reply's Buffer, which may share ioredis's read buffer.
    response = { status: responseStatus, headers, body: new Uint8Array(v.subarray(at + rid + headerBytes)) }
  }
  return {
    scope,
    key,
    fingerprint,
    status,
    token,
    lockedUntilMs: done ? null : lockedUntil,
    response,
    resourceId,
    attempts,
    createdAtMs,
    updatedAtMs,
    expiresAtMs,
  }
}

/** The response's head as complete.lua stores it: `status|rid bytes (-1: none)|headers bytes|` rid headers. */
export function packedHead(status: number, resourceId: string | null, headers: string): string {
  const rid = resourceId ?? ''
  return `${status}|${resourceId === null ? -1 : Buffer.byteLength(rid)}|${Buffer.byteLength(headers)}|${rid}${headers}`
}

/** A record's identity as acquire.lua stores and checks it: `scope bytes|key bytes|` scope key. */
export function packedIdentity(scope: string, key: string): string {
  return `${Buffer.byteLength(scope)}|${Buffer.byteLength(key)}|${scope}${key}`
}

/**
 * The value a record takes when the native compare-and-set completes it (`SET ... IFEQ <fresh record>`,
 * no script): the tag, flags 00, C (completed) or F (failed) `| ttl | grace | age |` then the fingerprint and
 * identity (`tail`, as the fresh record held them), the response's head ({@link packedHead}) and the body.
 * No clock is read: the same SET gives the key its expiry (ttl + grace from the server's time), and the
 * scripts derive expiresAt, updatedAt and (minus `ageMs`, how long the holder held it) createdAt from it
 * (`absolute` in _lib.lua). The flags are 0: the SET only replaces a fresh record nobody waits on.
 */
export function casCompleted(
  status: 'c' | 'f',
  ttlMs: number,
  graceMs: string,
  ageMs: number,
  tail: string,
  head: string,
  body: string | Buffer,
): string | Buffer {
  const text = `${RECORD_TAG}00${status === 'c' ? 'C' : 'F'}|${ttlMs}|${graceMs}|${ageMs}|${tail}${head}`
  return typeof body === 'string' ? text + body : Buffer.concat([Buffer.from(text, 'utf8'), body])
}
