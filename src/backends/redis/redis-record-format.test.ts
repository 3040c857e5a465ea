import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { RedisStore, recordNames } from './index.js'
import * as lua from './lua.generated.js'
import { RECORD_TAG, toMs, WATCH_MARKER } from './record.js'

// How RedisStore decodes what a record's key holds (src/backends/redis/record.ts): a packed record
// (docs/redis.md) read field by field, and every damaged or foreign value refused with STORE_SCHEMA
// naming the field at fault. The values are written here by hand, byte for byte, and read back
// through the store (get runs the read script, which hands a packed record in its absolute form to
// the decoder).
const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const bytes = (text: string) => Buffer.byteLength(text)

/** The fields of a packed record in its absolute form, each as the text stored (so a test can damage one). */
interface Packed {
  head: string
  tok: string
  lu: string
  att: string
  ca: string
  ua: string
  ea: string
  fp: string
  scopeBytes: string
  keyBytes: string
  scope: string
  key: string
  /** Completed or failed records only: response status, resource id bytes (-1: none), headers bytes. */
  rs?: string
  rid?: string
  rh?: string
  resourceId?: string
  headers?: string
  body?: string | Buffer
}

/** `ik1 <w> <s> <st> | tok | lu | att | ca | ua | ea | <fp> <scope bytes> | <key bytes> | <scope><key>` [response]. */
function pack(p: Packed): Buffer {
  const text =
    `${p.head}|${p.tok}|${p.lu}|${p.att}|${p.ca}|${p.ua}|${p.ea}|${p.fp}${p.scopeBytes}|${p.keyBytes}|${p.scope}${p.key}` +
    (p.rs === undefined ? '' : `${p.rs}|${p.rid}|${p.rh}|${p.resourceId ?? ''}${p.headers ?? ''}`)
  return Buffer.concat([Buffer.from(text, 'utf8'), typeof p.body === 'string' ? Buffer.from(p.body, 'utf8') : (p.body ?? Buffer.alloc(0))])
}

describe.skipIf(skip !== undefined)('RedisStore record format', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  let store: RedisStore
  let redis: Redis
  beforeAll(async () => {
    store = new RedisStore({ url: URL, prefix })
    redis = new Redis(URL)
  })
  afterAll(async () => {
    await store.close()
    await dropPrefix(URL, prefix)
    redis.disconnect()
  })

  const now = Date.now()
  /** An in-progress packed record of `scope`/`key`, live for an hour. */
  const inProgress = (scope: string, key: string): Packed => ({
    head: 'ik100p',
    tok: '7',
    lu: String(now + 60_000),
    att: '3',
    ca: String(now - 5_000),
    ua: String(now - 1_000),
    ea: String(now + 3_600_000),
    fp: fp('a'),
    scopeBytes: String(bytes(scope)),
    keyBytes: String(bytes(key)),
    scope,
    key,
  })
  /** The same record completed with a response. */
  const completed = (scope: string, key: string): Packed => ({
    ...inProgress(scope, key),
    head: 'ik100c',
    rs: '201',
    rid: String(bytes('ch_é')),
    rh: String(bytes('{"content-type":"application/json"}')),
    resourceId: 'ch_é',
    headers: '{"content-type":"application/json"}',
    body: '{"id":1}',
  })

  /** Writes a value under the record key of `scope`/`key` and reads it back with get. */
  async function getStored(scope: string, key: string, value: Buffer | string) {
    await redis.set(recordNames(prefix, scope, key).key, value, 'PX', 3_700_000)
    return store.get(scope, key)
  }

  /** A get refused with STORE_SCHEMA whose message names the record key and the damaged field. */
  async function expectRefused(read: Promise<unknown>, scope: string, key: string, field: string) {
    const error = await read.then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(error).toMatchObject({ name: 'IdempotencyError', code: 'STORE_SCHEMA' })
    const message = (error as Error).message
    expect(message).toContain(`redis: ${recordNames(prefix, scope, key).key} is not an idemkey record`)
    expect(message).toContain(`(field "${field}" is missing or malformed)`)
    expect(message).toContain('give the store its own prefix')
  }

  describe('packed records', () => {
    it('reads every field of an in-progress record, with a scope of multi-byte characters', async () => {
      const s = `s-é-${randomUUID()}`
      const record = await getStored(s, 'k ~1', pack(inProgress(s, 'k ~1')))
      expect(record).toEqual({
        scope: s,
        key: 'k ~1',
        fingerprint: fp('a'),
        status: 'in_progress',
        token: 7,
        lockedUntilMs: now + 60_000,
        response: null,
        resourceId: null,
        attempts: 3,
        createdAtMs: now - 5_000,
        updatedAtMs: now - 1_000,
        expiresAtMs: now + 3_600_000,
      })
    })

    it('reads a completed record: response status, headers, resource id and body bytes, and no lease', async () => {
      const s = `s-${randomUUID()}`
      const body = Buffer.from([0xff, 0x00, 0x7c, 0x80, 0x69])
      const record = await getStored(s, 'k', pack({ ...completed(s, 'k'), body }))
      expect(record).toMatchObject({
        status: 'completed',
        token: 7,
        lockedUntilMs: null,
        resourceId: 'ch_é',
        response: { status: 201, headers: { 'content-type': 'application/json' } },
      })
      expect(Buffer.from(record?.response?.body as Uint8Array)).toEqual(body)
    })

    it('reads a failed record without a resource id (-1) as resourceId null, with empty headers and body', async () => {
      const s = `s-${randomUUID()}`
      const failed = { ...completed(s, 'k'), head: 'ik100f', rs: '500', rid: '-1', rh: '0', resourceId: '', headers: '', body: '' }
      const record = await getStored(s, 'k', pack(failed))
      expect(record).toMatchObject({ status: 'failed', resourceId: null, lockedUntilMs: null, response: { status: 500, headers: {} } })
      expect(record?.response?.body).toEqual(new Uint8Array(0))
    })

    it('answers a record completed through the store without a resource id with resourceId null, not an empty id', async () => {
      const s = `s-${randomUUID()}`
      expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
      const response = { status: 200, headers: {}, body: new TextEncoder().encode('ok') }
      expect(await store.complete(s, 'k', 1, { status: 'completed', response }, 60_000)).toBe(true)
      expect(await store.get(s, 'k')).toMatchObject({ status: 'completed', resourceId: null })
      const replay = await store.acquire(s, 'k', fp('a'), 60_000)
      expect(replay).toMatchObject({ kind: 'replay', record: { resourceId: null } })
    })

    it.each([
      ['first', 0],
      ['second', 1],
      ['third', 2],
      ['separator', 6],
    ])('refuses a value whose %s head byte is not the packed layout’s, naming the header', async (_label, index) => {
      const s = `s-${randomUUID()}`
      const value = pack(inProgress(s, 'k'))
      value[index] = 0x78 // 'x'
      await expectRefused(getStored(s, 'k', value), s, 'k', 'header')
    })

    it('refuses a value too short for the head, and a bare head for its missing token', async () => {
      const s = `s-${randomUUID()}`
      await expectRefused(getStored(s, 'short', 'ik100'), s, 'short', 'header')
      await expectRefused(getStored(s, 'bare', 'ik100p|'), s, 'bare', 'tok')
    })

    it('refuses an unknown status letter, naming the status', async () => {
      const s = `s-${randomUUID()}`
      await expectRefused(getStored(s, 'k', pack({ ...completed(s, 'k'), head: 'ik100x' })), s, 'k', 'st')
    })

    const numberFields = ['tok', 'lu', 'att', 'ca', 'ua', 'ea', 'scopeBytes', 'keyBytes', 'rs', 'rid', 'rh'] as const
    const named = (field: (typeof numberFields)[number]) => (field === 'scopeBytes' ? 'scope' : field === 'keyBytes' ? 'key' : field)

    it.each(numberFields)('refuses a %s field holding a character just outside the digits, naming it', async (field) => {
      const s = `s-${randomUUID()}`
      // '/' and ':' sit just below '0' and just above '9'.
      for (const [key, bad] of [
        ['below', '1/'],
        ['above', '1:'],
      ] as const) {
        await expectRefused(getStored(s, key, pack({ ...completed(s, key), [field]: bad })), s, key, named(field))
      }
    })

    it.each(numberFields)('refuses an empty %s field, naming it', async (field) => {
      const s = `s-${randomUUID()}`
      await expectRefused(getStored(s, 'k', pack({ ...completed(s, 'k'), [field]: '' })), s, 'k', named(field))
    })

    it('refuses a number too large to be exact', async () => {
      const s = `s-${randomUUID()}`
      await expectRefused(getStored(s, 'k', pack({ ...inProgress(s, 'k'), tok: '99999999999999999999' })), s, 'k', 'tok')
    })

    it('refuses a value cut inside a number, naming that number', async () => {
      const s = `s-${randomUUID()}`
      await expectRefused(getStored(s, 'tok', 'ik100p|12'), s, 'tok', 'tok')
      const cut = pack(inProgress(s, 'ea'))
      const ea = cut.indexOf(`|${now + 3_600_000}|`) + 1
      await expectRefused(getStored(s, 'ea', cut.subarray(0, ea + 5)), s, 'ea', 'ea')
    })

    it('refuses a resource id length of -1 written any other way', async () => {
      const s = `s-${randomUUID()}`
      await expectRefused(getStored(s, 'minus2', pack({ ...completed(s, 'minus2'), rid: '-2' })), s, 'minus2', 'rid')
      await expectRefused(getStored(s, 'minusx', pack({ ...completed(s, 'minusx'), rid: '-x' })), s, 'minusx', 'rid')
    })

    it('refuses a fingerprint cut short, and a value that ends with its fingerprint, naming what is missing', async () => {
      const s = `s-${randomUUID()}`
      const head = `ik100p|7|${now + 60_000}|3|${now}|${now}|${now + 3_600_000}|`
      await expectRefused(getStored(s, 'short', `${head}${fp('a').slice(0, 30)}`), s, 'short', 'fp')
      await expectRefused(getStored(s, 'ends', `${head}${fp('a')}`), s, 'ends', 'scope')
    })

    it('refuses scope and key lengths that run past the end of the value', async () => {
      const s = `s-${randomUUID()}`
      // Scope 3 bytes and key 2 bytes declared; only 'abc' follows.
      const value = pack({ ...inProgress(s, 'k'), scopeBytes: '3', keyBytes: '2', scope: 'abc', key: '' })
      await expectRefused(getStored(s, 'k', value), s, 'k', 'scope/key')
    })

    it('refuses resource id and headers lengths that run past the end of the value', async () => {
      const s = `s-${randomUUID()}`
      // A 10-byte resource id and 15 bytes of headers declared; only the id and '{}' follow.
      const value = pack({ ...completed(s, 'k'), rid: '10', resourceId: 'abcdefghij', rh: '15', headers: '{}', body: '' })
      await expectRefused(getStored(s, 'k', value), s, 'k', 'rh')
    })
  })
})

describe('toMs', () => {
  it('reads a server time given as digits in a Buffer, or as an integer', () => {
    expect(toMs(Buffer.from('1700000000123'))).toBe(1_700_000_000_123)
    expect(toMs(1_700_000_000_123)).toBe(1_700_000_000_123)
  })
})

describe('the watch marker', () => {
  it('is the same value in the scripts as in TypeScript: the record-format tag, the waiter flag, no steps, state w', () => {
    expect(WATCH_MARKER).toBe(`${RECORD_TAG}10w`)
    for (const script of [
      lua.acquireLua,
      lua.completeLua,
      lua.evictLua,
      lua.readLua,
      lua.recordStepLua,
      lua.releaseLua,
      lua.renewLua,
      lua.watchLua,
    ]) {
      expect(script).toContain(`local WATCH_MARKER = '${WATCH_MARKER}'\n`)
    }
  })
})
