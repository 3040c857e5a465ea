import type { RecordStatus, StepEntry, StoredRecord } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { decodeHeaders } from '../shared.js'

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
