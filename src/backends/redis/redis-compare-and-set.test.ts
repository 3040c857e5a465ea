import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import type { RedisArg, RedisClientLike } from './index.js'
import { RedisStore, recordNames } from './index.js'

// The native compare-and-set complete (SET ... IFEQ) against a real Redis. Redis here is 7.0, which has
// no IFEQ: the client below runs each `SET key value IFEQ old PX ms` the store sends as one atomic
// script with the same meaning (write only when the key holds exactly `old`; nil otherwise, an error on
// another type), so everything else (the records it leaves, how every script reads them) is the real
// thing. src/backends/redis/redis-compare-and-set-args.test.ts pins the commands themselves.
const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')

const SET_IF_EQ = `local v = redis.call('GET', KEYS[1])
if v ~= ARGV[2] then return false end
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])`

/** An ioredis client on which SET ... IFEQ works as on Valkey 8.1+ and Redis 8.4+; counts the IFEQs that wrote. */
function withSetIfEq(redis: Redis): { client: RedisClientLike; written: () => number } {
  let written = 0
  const setIfEq = async (key: RedisArg, value: RedisArg, _ifeq: RedisArg, old: RedisArg, px: RedisArg, ms: RedisArg) => {
    if (px !== 'PX') throw new Error('ERR syntax error')
    const reply = await redis.callBuffer('eval', SET_IF_EQ, 1, key, value, old, ms)
    if (reply !== null) written++
    return reply
  }
  const client = new Proxy(redis, {
    get(target, property) {
      if (property === 'setBuffer') {
        return (...args: RedisArg[]) =>
          args[2] === 'IFEQ'
            ? setIfEq(...(args as [RedisArg, RedisArg, RedisArg, RedisArg, RedisArg, RedisArg]))
            : target.callBuffer('set', ...args)
      }
      const value = Reflect.get(target, property)
      return typeof value === 'function' ? value.bind(target) : value
    },
  }) as unknown as RedisClientLike
  return { client, written: () => written }
}

const contractPrefix = `idemkey-test-${randomUUID()}`
let contractClient: Redis | undefined
describeStore(
  'redis (complete by SET IFEQ)',
  () => {
    contractClient = new Redis(URL, { maxRetriesPerRequest: 1 })
    return new RedisStore({ client: withSetIfEq(contractClient).client, prefix: contractPrefix, nativeCompareAndSet: true })
  },
  {
    skip,
    teardown: async () => {
      await dropPrefix(URL, contractPrefix)
      contractClient?.disconnect()
    },
  },
)

const modelPrefix = `idemkey-test-${randomUUID()}`
let modelClient: Redis | undefined
describeStoreModel(
  'redis (complete by SET IFEQ)',
  () => {
    modelClient = new Redis(URL, { maxRetriesPerRequest: 1 })
    return new RedisStore({ client: withSetIfEq(modelClient).client, prefix: modelPrefix, nativeCompareAndSet: true })
  },
  {
    skip,
    teardown: async () => {
      await dropPrefix(URL, modelPrefix)
      modelClient?.disconnect()
    },
  },
)

describe.skipIf(skip)('RedisStore complete by SET IFEQ: the records it leaves', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  let redis: Redis
  let client: Redis
  let emulated: ReturnType<typeof withSetIfEq>
  let store: RedisStore
  const outcome = (text: string) =>
    ({
      status: 'completed',
      response: { status: 201, headers: { 'content-type': 'application/json' }, body: new TextEncoder().encode(text) },
      resourceId: 'r1',
    }) as const
  const serverNow = async () => {
    const [s, us] = await redis.time()
    return Number(s) * 1000 + Math.floor(Number(us) / 1000)
  }
  beforeAll(() => {
    redis = new Redis(URL)
    client = new Redis(URL, { maxRetriesPerRequest: 1 })
    emulated = withSetIfEq(client)
    store = new RedisStore({ client: emulated.client, prefix, nativeCompareAndSet: true })
  })
  afterAll(async () => {
    await store.close()
    await dropPrefix(URL, prefix)
    redis.disconnect()
    client.disconnect()
  })

  it('completes a new key with one SET IFEQ whose times, on the server clock, every reader derives from the key expiry', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    const before = emulated.written()
    await store.acquire(s, 'k', fp('a'), 60_000)
    const fresh = await store.get(s, 'k')
    const from = await serverNow()
    expect(await store.complete(s, 'k', 1, outcome('{"id":1}'), 3_600_000)).toBe(true)
    const to = await serverNow()
    expect(emulated.written()).toBe(before + 1)
    expect(await redis.get(names.key)).toMatch(/^ik100C\|3600000\|60000\|\d+\|/)
    const done = await store.get(s, 'k')
    expect(done).toMatchObject({ status: 'completed', token: 1, attempts: 1, resourceId: 'r1', lockedUntilMs: null })
    expect(done?.updatedAtMs).toBeGreaterThanOrEqual(from)
    expect(done?.updatedAtMs).toBeLessThanOrEqual(to)
    expect(done?.expiresAtMs).toBe((done?.updatedAtMs as number) + 3_600_000)
    // Created when acquired: the holder measured how long it held the record.
    expect(done?.createdAtMs).toBeGreaterThanOrEqual(fresh?.createdAtMs as number)
    expect(done?.createdAtMs).toBeLessThanOrEqual(done?.updatedAtMs as number)
    // Replayed (first by the acquire script: the native replay needs absolute times), listed, fenced.
    const replay = await store.acquire(s, 'k', fp('a'), 60_000)
    expect(replay).toMatchObject({ kind: 'replay', record: { status: 'completed', token: 1, expiresAtMs: done?.expiresAtMs } })
    expect(new TextDecoder().decode((replay as { record: { response: { body: Uint8Array } } }).record.response.body)).toBe('{"id":1}')
    // That replay kept the record in the absolute form, its TTL unchanged: the next is the native SET NX GET's.
    expect(await redis.get(names.key)).toMatch(/^ik100c\|1\|/)
    expect(await redis.pttl(names.key)).toBeGreaterThan(3_600_000)
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual(replay)
    expect(await store.acquire(s, 'k', fp('b'), 60_000)).toEqual({ kind: 'mismatch' })
    expect((await store.list({ scope: s })).map((r) => r.key)).toEqual(['k'])
    expect(await store.complete(s, 'k', 1, outcome('again'), 60_000)).toBe(false)
    expect(await store.renew(s, 'k', 1, 60_000)).toBe(false)
    expect(await store.release(s, 'k', 1)).toBe(false)
    expect(await store.recordStep(s, 'k', 1, 'x', '{}')).toBe(false)
  })

  it('never dates a record completed by SET IFEQ before its acquire: the holder rounds how long it held the record down', async () => {
    // The fresh record's creation is the server's millisecond of the SET; the completed one's is the
    // server's millisecond of the IFEQ less the holder's own measure of the time between the two
    // replies, always shorter. Rounded to the nearest, that measure could pass the truth by a fraction
    // of a millisecond and date the record a millisecond early, now and then (CI saw it once).
    const s = `s-${randomUUID()}`
    const early: string[] = []
    for (let i = 0; i < 200; i++) {
      const key = `k${i}`
      await store.acquire(s, key, fp('a'), 60_000)
      const fresh = await store.get(s, key)
      expect(await store.complete(s, key, 1, outcome('{}'), 60_000)).toBe(true)
      const done = await store.get(s, key)
      if ((done?.createdAtMs as number) < (fresh?.createdAtMs as number)) early.push(`${key}: ${done?.createdAtMs} < ${fresh?.createdAtMs}`)
    }
    expect(early).toEqual([])
  })

  it('lets a fenced-out holder change nothing: the IFEQ misses once the record is no longer its fresh one', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    await store.acquire(s, 'k', fp('a'), 50)
    await new Promise((resolve) => setTimeout(resolve, 80))
    // Another holder takes the ended lease over (token 2); the first one wakes up late.
    const other = new RedisStore({ client: withSetIfEq(client).client, prefix, nativeCompareAndSet: true })
    expect(await other.acquire(s, 'k', fp('a'), 60_000)).toMatchObject({ kind: 'acquired', token: 2 })
    const taken = await redis.getBuffer(names.key)
    const before = emulated.written()
    expect(await store.complete(s, 'k', 1, outcome('zombie'), 60_000)).toBe(false)
    expect(emulated.written()).toBe(before)
    expect(await redis.getBuffer(names.key)).toEqual(taken)
    expect(await other.complete(s, 'k', 2, outcome('real'), 60_000)).toBe(true)
    await other.close()
  })

  it('completes the records of one key under two scopes, held at once, each with its own outcome', async () => {
    const [a, b] = [`s-${randomUUID()}`, `s-${randomUUID()}`]
    expect(await store.acquire(a, 'shared', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
    expect(await store.acquire(b, 'shared', fp('b'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
    expect(await store.complete(a, 'shared', 1, outcome('{"scope":"a"}'), 60_000)).toBe(true)
    expect(await store.complete(b, 'shared', 1, outcome('{"scope":"b"}'), 60_000)).toBe(true)
    for (const [scope, text] of [
      [a, '{"scope":"a"}'],
      [b, '{"scope":"b"}'],
    ] as const) {
      const record = await store.get(scope, 'shared')
      expect(record).toMatchObject({ scope, key: 'shared', status: 'completed', fingerprint: fp(scope === a ? 'a' : 'b') })
      expect(new TextDecoder().decode(record?.response?.body)).toBe(text)
    }
    expect(await store.complete(a, 'shared', 1, outcome('again'), 60_000)).toBe(false)
  })

  it('leaves a record someone waits on, or one renewed, to the script, which publishes and keeps the times', async () => {
    const s = `s-${randomUUID()}`
    const listener = new Redis(URL)
    const messages: string[] = []
    await listener.subscribe(recordNames(prefix, s, 'waited').channel)
    listener.on('message', (channel) => messages.push(channel))
    try {
      const before = emulated.written()
      await store.acquire(s, 'waited', fp('a'), 60_000)
      expect(await store.acquire(s, 'waited', fp('a'), 60_000)).toMatchObject({ kind: 'in_progress' })
      expect(await store.complete(s, 'waited', 1, outcome('x'), 60_000)).toBe(true)
      await store.acquire(s, 'renewed', fp('a'), 60_000)
      expect(await store.renew(s, 'renewed', 1, 90_000)).toBe(true)
      expect(await store.complete(s, 'renewed', 1, outcome('y'), 60_000)).toBe(true)
      expect(emulated.written()).toBe(before)
      expect(await redis.get(recordNames(prefix, s, 'waited').key)).toMatch(/^ik110c\|/)
      for (let i = 0; i < 100 && messages.length === 0; i++) await new Promise((resolve) => setTimeout(resolve, 10))
      expect(messages).toEqual([recordNames(prefix, s, 'waited').channel])
    } finally {
      listener.disconnect()
    }
  })

  it('finds out from this server (Redis 7.0, no IFEQ) that it must complete by script, and asks only once', async () => {
    const s = `s-${randomUUID()}`
    const own = new Redis(URL, { maxRetriesPerRequest: 1 })
    const wrapped = withSetIfEq(own)
    let infos = 0
    const counting = new Proxy(wrapped.client, {
      get(target, property) {
        if (property !== 'infoBuffer') return Reflect.get(target, property)
        return (...args: RedisArg[]) => {
          infos++
          return own.callBuffer('info', ...args)
        }
      },
    })
    const detected = new RedisStore({ client: counting, prefix })
    try {
      for (const key of ['a', 'b', 'c']) {
        await detected.acquire(s, key, fp('a'), 60_000)
        await new Promise((resolve) => setTimeout(resolve, 20))
        expect(await detected.complete(s, key, 1, outcome('x'), 60_000)).toBe(true)
        expect(await redis.get(recordNames(prefix, s, key).key)).toMatch(/^ik100c\|/)
      }
      expect(wrapped.written()).toBe(0)
      expect(infos).toBe(1)
    } finally {
      await detected.close()
      own.disconnect()
    }
  })

  it('starts a new lifecycle, token counting on, once such a record expired; purges it like any other', async () => {
    const s = `s-${randomUUID()}`
    await store.acquire(s, 'k', fp('a'), 60_000)
    expect(await store.complete(s, 'k', 1, outcome('x'), 30)).toBe(true)
    await store.acquire(s, 'gone', fp('a'), 60_000)
    expect(await store.complete(s, 'gone', 1, outcome('x'), 30)).toBe(true)
    await new Promise((resolve) => setTimeout(resolve, 60))
    expect(await store.get(s, 'k')).toBeNull()
    expect(await store.acquire(s, 'k', fp('b'), 60_000)).toEqual({ kind: 'acquired', token: 2 })
    const gone = recordNames(prefix, s, 'gone').key
    let purged = 0
    for (let i = 0; i < 50 && (await redis.exists(gone)) === 1; i++) purged += await store.purgeExpired(1_000)
    expect(purged).toBeGreaterThanOrEqual(1)
  })
})
