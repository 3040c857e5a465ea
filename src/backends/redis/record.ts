import type { RecordStatus, StepEntry, StoredRecord } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { decodeHeaders } from '../records.js'

const STATUSES: ReadonlySet<string> = new Set(['in_progress', 'completed', 'failed'])

/** The epoch ms of a reply element (a Buffer holding digits, or an integer). */
export function toMs(value: unknown): number {
  return typeof value === 'number' ? value : Number(String(value))
}

/**
 * Turns a flat HGETALL reply (`field, value, …`, Buffers), starting at `from`, into a
 * {@link StoredRecord}; a hash idemkey did not write is `STORE_SCHEMA`. One pass, no Map: every
 * replay decodes a record, so this is on the hot path.
 *
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
export function toRecord(reply: unknown[], from: number, redisKey: string): StoredRecord {
  let s: Buffer | undefined
  let k: Buffer | undefined
  let fp: Buffer | undefined
  let st: Buffer | undefined
  let tok: Buffer | undefined
  let lu: Buffer | undefined
  let rs: Buffer | undefined
  let rh: Buffer | undefined
  let rb: Buffer | undefined
  let rid: Buffer | undefined
  let att: Buffer | undefined
  let ca: Buffer | undefined
  let ua: Buffer | undefined
  let ea: Buffer | undefined
  for (let i = from; i + 1 < reply.length; i += 2) {
    const value = reply[i + 1] as Buffer
    // Field names are ASCII: latin1 decodes them at half the cost of utf8.
    switch ((reply[i] as Buffer).toString('latin1')) {
      case 's':
        s = value
        break
      case 'k':
        k = value
        break
      case 'fp':
        fp = value
        break
      case 'st':
        st = value
        break
      case 'tok':
        tok = value
        break
      case 'lu':
        lu = value
        break
      case 'rs':
        rs = value
        break
      case 'rh':
        rh = value
        break
      case 'rb':
        rb = value
        break
      case 'rid':
        rid = value
        break
      case 'att':
        att = value
        break
      case 'ca':
        ca = value
        break
      case 'ua':
        ua = value
        break
      case 'ea':
        ea = value
        break
    }
  }
  const int = (raw: Buffer | undefined, field: string) => {
    const n = raw === undefined ? Number.NaN : Number(raw.toString('utf8'))
    if (!Number.isSafeInteger(n)) foreign(redisKey, field)
    return n
  }
  const status = st?.toString('utf8') as RecordStatus
  if (!STATUSES.has(status)) foreign(redisKey, 'st')
  if (s === undefined || k === undefined || fp === undefined) foreign(redisKey, 's/k/fp')
  const done = status !== 'in_progress'
  return {
    scope: s.toString('utf8'),
    key: k.toString('utf8'),
    fingerprint: fp.toString('utf8'),
    status,
    token: int(tok, 'tok'),
    lockedUntilMs: done ? null : int(lu, 'lu'),
    response: done
      ? { status: int(rs, 'rs'), headers: decodeHeaders(rh?.toString('utf8')), body: rb ? new Uint8Array(rb) : new Uint8Array(0) }
      : null,
    resourceId: rid?.toString('utf8') ?? null,
    attempts: int(att, 'att'),
    createdAtMs: int(ca, 'ca'),
    updatedAtMs: int(ua, 'ua'),
    expiresAtMs: int(ea, 'ea'),
  }
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

/**
 * Decodes a packed record (the value of a record's key since round 2, docs/redis.md):
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
  if (v.length < 7 || v[0] !== 0x69 || v[1] !== 0x6b || v[2] !== 0x31 || v[6] !== BAR) foreign(redisKey, 'header')
  const st = v[5]
  const status: RecordStatus = st === 0x70 ? 'in_progress' : st === 0x63 ? 'completed' : st === 0x66 ? 'failed' : foreign(redisKey, 'st')
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
 * no script): `ik100` C (completed) or F (failed) `| ttl | grace | age |` then the fingerprint and
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
  const text = `ik100${status === 'c' ? 'C' : 'F'}|${ttlMs}|${graceMs}|${ageMs}|${tail}${head}`
  return typeof body === 'string' ? text + body : Buffer.concat([Buffer.from(text, 'utf8'), body])
}
