import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { freePort, serviceSkipReason } from '../../../test/helpers/services.js'
import type { Outcome } from '../../core/store.js'
import type { RedisArg, RedisClientLike } from './index.js'
import { RedisStore, recordNames } from './index.js'

// The rules RedisStore keeps around its scripts: the checks of its options and arguments, the
// operation each error names, the native acquire and its fall-backs, the SET ... IFEQ complete
// (emulated on this Redis 7.0 as in src/backends/redis/redis-compare-and-set.test.ts), list, purge, watch, close.
const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const outcome = (text: string): Outcome => ({
  status: 'completed',
  response: { status: 201, headers: {}, body: new TextEncoder().encode(text) },
})
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const SET_IF_EQ = `local v = redis.call('GET', KEYS[1])
if v ~= ARGV[2] then return false end
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])`

interface Wrapped {
  client: RedisClientLike
  /** SETs the store sent, by kind. */
  sets: { nx: number; ifeqWritten: number; ifeq: number }
  infos: string[][]
}

/**
 * A real ioredis client seen through a proxy: SET ... IFEQ works as on Valkey 8.1+ / Redis 8.4+ (one
 * atomic script), and `overrides` may replace what a command answers (an older server, a lost reply).
 */
function wrap(
  redis: Redis,
  overrides: {
    nx?: (args: RedisArg[]) => Promise<unknown> | undefined
    ifeq?: (args: RedisArg[]) => Promise<unknown> | undefined
    info?: (args: RedisArg[]) => Promise<unknown>
  } = {},
): Wrapped {
  const sets = { nx: 0, ifeqWritten: 0, ifeq: 0 }
  const infos: string[][] = []
  const client = new Proxy(redis, {
    get(target, property) {
      if (property === 'setBuffer') {
        return async (...args: RedisArg[]) => {
          if (args[2] === 'IFEQ') {
            sets.ifeq++
            const replaced = overrides.ifeq?.(args)
            if (replaced !== undefined) return replaced
            const [key, value, , old, , ms] = args as RedisArg[]
            const reply = await target.callBuffer('eval', SET_IF_EQ, 1, key as string, value as string, old as string, ms as number)
            if (reply !== null) sets.ifeqWritten++
            return reply
          }
          sets.nx++
          const replaced = overrides.nx?.(args)
          if (replaced !== undefined) return replaced
          return target.callBuffer('set', ...args)
        }
      }
      if (property === 'infoBuffer') {
        return (...args: RedisArg[]) => {
          infos.push(args.map(String))
          return overrides.info ? overrides.info(args) : target.callBuffer('info', ...args)
        }
      }
      const value = Reflect.get(target, property)
      return typeof value === 'function' ? value.bind(target) : value
    },
  }) as unknown as RedisClientLike
  return { client, sets, infos }
}

/** Answers INFO as a Redis 8.4 would (it has SET ... IFEQ): the real reply with its version raised. */
const redis84 = (redis: Redis) => async (args: RedisArg[]) => {
  const reply = String(await redis.callBuffer('info', ...args))
  return Buffer.from(reply.replace(/^redis_version:[\d.]+/m, 'redis_version:8.4.0'))
}

describe('RedisStore options and arguments, checked before Redis is asked', () => {
  const lazy = new Redis(URL, { lazyConnect: true })
  afterAll(() => lazy.disconnect())

  it('is named redis', () => {
    expect(new RedisStore({ client: lazy }).name).toBe('redis')
  })

  it('refuses no options, or both a client and a url, with INVALID_OPTION saying it needs exactly one', () => {
    const needsOne = expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining('exactly one of { client }') })
    expect(() => new RedisStore(undefined as never)).toThrow(needsOne)
    expect(() => new RedisStore({ client: lazy, url: URL })).toThrow(needsOne)
  })

  it('names the option it refuses', () => {
    const named = (name: string) => expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(name) })
    expect(() => new RedisStore({ client: lazy, abandonedRetention: 'soon' })).toThrow(named('abandonedRetention'))
    expect(() => new RedisStore({ client: lazy, expiredGrace: 'soon' })).toThrow(named('expiredGrace'))
    expect(() => new RedisStore({ url: URL, socketTimeout: 'soon' })).toThrow(named('socketTimeout'))
    expect(() => new RedisStore({ client: lazy, listScanLimit: 0 })).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: 'RedisStore listScanLimit must be a positive integer, got 0.' }),
    )
    const prefixed = new Redis({ keyPrefix: 'app:', lazyConnect: true })
    expect(() => new RedisStore({ client: prefixed })).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining('cannot use an ioredis client with keyPrefix') }),
    )
    prefixed.disconnect()
  })

  it('names the argument it refuses: leaseMs, ttlMs, the purge limit', async () => {
    const store = new RedisStore({ client: lazy })
    const named = (message: string) => expect.objectContaining({ code: 'INVALID_ARGUMENT', message })
    await expect(store.acquire('s', 'k', fp('a'), 0)).rejects.toEqual(named('leaseMs must be a positive integer, got 0.'))
    await expect(store.renew('s', 'k', 1, -5)).rejects.toEqual(named('leaseMs must be a positive integer, got -5.'))
    await expect(store.complete('s', 'k', 1, outcome('x'), 1.5)).rejects.toEqual(named('ttlMs must be a positive integer, got 1.5.'))
    await expect(store.purgeExpired(0)).rejects.toEqual(named('limit must be a positive integer, got 0.'))
  })

  it('refuses a negative or fractional list limit with INVALID_ARGUMENT, and answers limit 0 with no records without asking Redis', async () => {
    const store = new RedisStore({ url: `redis://127.0.0.1:${await freePort()}` })
    try {
      for (const limit of [-1, 1.5, Number.NaN]) {
        await expect(store.list({ limit })).rejects.toEqual(
          expect.objectContaining({
            code: 'INVALID_ARGUMENT',
            message: `list limit must be a non-negative integer, got ${String(limit)}.`,
          }),
        )
      }
      expect(await store.list({ limit: 0 })).toEqual([])
    } finally {
      await store.close()
    }
  })

  it('answers false to a token that is no safe integer without asking Redis (even when it is down)', async () => {
    const store = new RedisStore({ url: `redis://127.0.0.1:${await freePort()}` })
    try {
      for (const token of [Number.NaN, 1.5, 2 ** 53]) {
        expect(await store.renew('s', 'k', token, 1_000)).toBe(false)
        expect(await store.complete('s', 'k', token, outcome('x'), 1_000)).toBe(false)
        expect(await store.release('s', 'k', token)).toBe(false)
      }
    } finally {
      await store.close()
    }
  })
})

describe.skipIf(skip !== undefined)('RedisStore on a live Redis: the rules around its scripts', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  let redis: Redis
  const opened: Redis[] = []
  const stores: RedisStore[] = []
  /** A client of its own for one test (disconnected in afterAll). */
  const own = () => {
    const client = new Redis(URL, { maxRetriesPerRequest: 1 })
    client.on('error', () => {})
    opened.push(client)
    return client
  }
  const storeOf = (options: ConstructorParameters<typeof RedisStore>[0]) => {
    const store = new RedisStore({ prefix, ...options })
    stores.push(store)
    return store
  }
  beforeAll(() => {
    redis = new Redis(URL)
  })
  afterAll(async () => {
    for (const store of stores) await store.close()
    for (const client of opened) client.disconnect()
    await dropPrefix(URL, prefix)
    redis.disconnect()
  })

  describe('errors name the operation that failed', () => {
    it('reports every operation on a closed connection as STORE_UNAVAILABLE naming it', async () => {
      const s = `s-${randomUUID()}`
      const client = own()
      const store = storeOf({ client })
      const { token } = (await store.acquire(s, 'held', fp('a'), 60_000)) as { token: number }
      client.disconnect()
      const failed = (operation: string) =>
        expect.objectContaining({ code: 'STORE_UNAVAILABLE', message: expect.stringContaining(`redis: ${operation} failed`) })
      await expect(store.acquire(s, 'k', fp('a'), 60_000)).rejects.toEqual(failed('acquire'))
      await expect(store.renew(s, 'held', token, 60_000)).rejects.toEqual(failed('renew'))
      await expect(store.recordStep(s, 'held', token, 'step', '{}')).rejects.toEqual(failed('recordStep'))
      await expect(store.complete(s, 'held', token, outcome('x'), 60_000)).rejects.toEqual(failed('complete'))
      await expect(store.release(s, 'held', token)).rejects.toEqual(failed('release'))
      await expect(store.get(s, 'held')).rejects.toEqual(failed('get'))
      await expect(store.evict(s, 'held')).rejects.toEqual(failed('evict'))
      await expect(store.list()).rejects.toEqual(failed('list'))
      await expect(store.purgeExpired(10)).rejects.toEqual(failed('purgeExpired'))
    })

    it('reports a key of another type met while listing as STORE_SCHEMA naming list', async () => {
      const s = `s-${randomUUID()}`
      const store = storeOf({ client: own() })
      await redis.rpush(recordNames(prefix, s, 'k').key, 'x')
      await expect(store.list({ scope: s })).rejects.toEqual(
        expect.objectContaining({ code: 'STORE_SCHEMA', message: expect.stringContaining('redis: list found') }),
      )
      await redis.del(recordNames(prefix, s, 'k').key)
    })
  })

  describe('the native acquire (SET NX GET) and its fall-backs', () => {
    it('falls back to the acquire script for good on a server that refuses SET NX GET (before Redis 7.0)', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own(), { nx: () => Promise.reject(new Error('ERR syntax error')) })
      const store = storeOf({ client: wrapped.client })
      for (const key of ['a', 'b', 'c']) expect(await store.acquire(s, key, fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
      expect(await store.acquire(s, 'a', fp('a'), 60_000)).toMatchObject({ kind: 'in_progress' })
      expect(wrapped.sets.nx).toBe(1)
    })

    it('keeps the native acquire after a key of another type (WRONGTYPE is that key, not the server)', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own())
      const store = storeOf({ client: wrapped.client })
      await redis.rpush(recordNames(prefix, s, 'list').key, 'x')
      await expect(store.acquire(s, 'list', fp('a'), 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
      const before = wrapped.sets.nx
      expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
      expect(wrapped.sets.nx).toBe(before + 1)
    })

    it('reports a lost SET reply (or a client that rejects with nothing) as STORE_UNAVAILABLE and takes no key', async () => {
      const s = `s-${randomUUID()}`
      for (const rejection of [new Error('read ECONNRESET'), undefined]) {
        const store = storeOf({ client: wrap(own(), { nx: () => Promise.reject(rejection) }).client })
        await expect(store.acquire(s, 'k', fp('a'), 60_000)).rejects.toEqual(
          expect.objectContaining({
            name: 'IdempotencyError',
            code: 'STORE_UNAVAILABLE',
            message: expect.stringContaining('redis: acquire failed'),
          }),
        )
        expect(await redis.exists(recordNames(prefix, s, 'k').key)).toBe(0)
      }
    })

    it('answers in_progress, never a replay, for a renewed record still running', async () => {
      const s = `s-${randomUUID()}`
      const store = storeOf({ client: own() })
      await store.acquire(s, 'k', fp('a'), 60_000)
      expect(await store.renew(s, 'k', 1, 120_000)).toBe(true)
      expect(await redis.get(recordNames(prefix, s, 'k').key)).toMatch(/^ik1..p\|/)
      expect(await store.acquire(s, 'k', fp('a'), 60_000)).toMatchObject({ kind: 'in_progress' })
      expect(await store.acquire(s, 'k', fp('b'), 60_000)).toEqual({ kind: 'mismatch' })
    })

    it('refuses a completed record copied from another key or another scope with STORE_SCHEMA, never replays it', async () => {
      const s = `s-${randomUUID()}`
      const t = `t-${randomUUID()}`
      const store = storeOf({ client: own() })
      await store.acquire(s, 'other', fp('a'), 60_000)
      expect(await store.complete(s, 'other', 1, outcome('other'), 3_600_000)).toBe(true)
      await redis.copy(recordNames(prefix, s, 'other').key, recordNames(prefix, s, 'k').key)
      await redis.copy(recordNames(prefix, s, 'other').key, recordNames(prefix, t, 'other').key)
      await expect(store.acquire(s, 'k', fp('a'), 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
      await expect(store.acquire(t, 'other', fp('a'), 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
      expect(await store.acquire(s, 'other', fp('a'), 60_000)).toMatchObject({ kind: 'replay', record: { key: 'other' } })
    })

    it('refuses a damaged value that looks completed with STORE_SCHEMA', async () => {
      const s = `s-${randomUUID()}`
      const store = storeOf({ client: own() })
      await redis.set(recordNames(prefix, s, 'k').key, 'ik100c|garbage', 'PX', 60_000)
      await expect(store.acquire(s, 'k', fp('a'), 60_000)).rejects.toMatchObject({ name: 'IdempotencyError', code: 'STORE_SCHEMA' })
    })
  })

  describe('the SET ... IFEQ complete', () => {
    it('fences out another token on a fresh record: complete with token 2 writes nothing', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own())
      const store = storeOf({ client: wrapped.client, nativeCompareAndSet: true })
      await store.acquire(s, 'k', fp('a'), 60_000)
      const untouched = await redis.getBuffer(recordNames(prefix, s, 'k').key)
      expect(await store.complete(s, 'k', 2, outcome('zombie'), 60_000)).toBe(false)
      expect(await redis.getBuffer(recordNames(prefix, s, 'k').key)).toEqual(untouched)
      expect(await store.get(s, 'k')).toMatchObject({ status: 'in_progress', token: 1 })
      expect(wrapped.sets.ifeqWritten).toBe(0)
    })

    it('keeps when the record was created: a record held 100 ms was created 100 ms before its completion', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own())
      const store = storeOf({ client: wrapped.client, nativeCompareAndSet: true })
      await store.acquire(s, 'k', fp('a'), 60_000)
      await sleep(100)
      expect(await store.complete(s, 'k', 1, outcome('x'), 60_000)).toBe(true)
      expect(wrapped.sets.ifeqWritten).toBe(1)
      const done = await store.get(s, 'k')
      expect((done?.updatedAtMs as number) - (done?.createdAtMs as number)).toBeGreaterThanOrEqual(90)
    })

    it('completes each of several records acquired one after another by IFEQ', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own())
      const store = storeOf({ client: wrapped.client, nativeCompareAndSet: true })
      for (const key of ['a', 'b', 'c']) await store.acquire(s, key, fp('a'), 60_000)
      for (const key of ['a', 'b', 'c']) expect(await store.complete(s, key, 1, outcome(key), 60_000)).toBe(true)
      expect(wrapped.sets.ifeqWritten).toBe(3)
    })

    it('remembers at most 4096 fresh records: past that it forgets the older ones, which still complete (by script)', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own())
      const store = storeOf({ client: wrapped.client, nativeCompareAndSet: true })
      const keys = Array.from({ length: 4097 }, (_, i) => `k${i}`)
      await Promise.all(keys.map((key) => store.acquire(s, key, fp('a'), 60_000)))
      expect(await store.complete(s, 'k0', 1, outcome('first'), 60_000)).toBe(true)
      expect(wrapped.sets.ifeq).toBe(0)
      expect(await store.complete(s, 'k4096', 1, outcome('last'), 60_000)).toBe(true)
      expect(wrapped.sets.ifeqWritten).toBe(1)
      expect(await store.get(s, 'k0')).toMatchObject({ status: 'completed' })
    })

    it('asks INFO server once even when the first acquires come together, and uses IFEQ on a Redis 8.4', async () => {
      const s = `s-${randomUUID()}`
      const client = own()
      const wrapped = wrap(client, { info: redis84(client) })
      const store = storeOf({ client: wrapped.client })
      await Promise.all(['a', 'b', 'c'].map((key) => store.acquire(s, key, fp('a'), 60_000)))
      await sleep(20)
      expect(wrapped.infos).toEqual([['server']])
      await store.acquire(s, 'd', fp('a'), 60_000)
      expect(await store.complete(s, 'd', 1, outcome('d'), 60_000)).toBe(true)
      expect(wrapped.sets.ifeqWritten).toBe(1)
      expect(wrapped.infos).toHaveLength(1)
    })

    it('completes by script when INFO is refused (an ACL), even on a server that has IFEQ', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own(), {
        info: () => Promise.reject(new Error("NOPERM this user has no permissions to run the 'info' command")),
      })
      const store = storeOf({ client: wrapped.client })
      await store.acquire(s, 'a', fp('a'), 60_000)
      await sleep(20)
      await store.acquire(s, 'b', fp('a'), 60_000)
      expect(await store.complete(s, 'b', 1, outcome('b'), 60_000)).toBe(true)
      expect(wrapped.sets.ifeq).toBe(0)
      expect(await store.get(s, 'b')).toMatchObject({ status: 'completed' })
    })

    it('keeps IFEQ after a key turned into another type (WRONGTYPE), which it reports as STORE_SCHEMA', async () => {
      const s = `s-${randomUUID()}`
      const wrapped = wrap(own())
      const store = storeOf({ client: wrapped.client, nativeCompareAndSet: true })
      await store.acquire(s, 'k', fp('a'), 60_000)
      const name = recordNames(prefix, s, 'k').key
      await redis.del(name)
      await redis.rpush(name, 'x')
      await expect(store.complete(s, 'k', 1, outcome('x'), 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
      await store.acquire(s, 'next', fp('a'), 60_000)
      expect(await store.complete(s, 'next', 1, outcome('x'), 60_000)).toBe(true)
      expect(wrapped.sets.ifeqWritten).toBe(1)
    })

    it('reports a lost IFEQ reply (or a rejection with nothing) as STORE_UNAVAILABLE naming complete, and leaves the record held', async () => {
      const s = `s-${randomUUID()}`
      for (const rejection of [new Error('read ECONNRESET'), undefined]) {
        const store = storeOf({ client: wrap(own(), { ifeq: () => Promise.reject(rejection) }).client, nativeCompareAndSet: true })
        const key = `k-${randomUUID()}`
        await store.acquire(s, key, fp('a'), 60_000)
        await expect(store.complete(s, key, 1, outcome('x'), 60_000)).rejects.toEqual(
          expect.objectContaining({
            name: 'IdempotencyError',
            code: 'STORE_UNAVAILABLE',
            message: expect.stringContaining('redis: complete failed'),
          }),
        )
        expect(await store.get(s, key)).toMatchObject({ status: 'in_progress' })
      }
    })
  })

  describe('a store opening its own client (url)', () => {
    it('serves a first call that runs a script, or reads, before its client has opened', async () => {
      const s = `s-${randomUUID()}`
      const store = storeOf({ client: own() })
      await store.acquire(s, 'k', fp('a'), 60_000)
      await store.complete(s, 'k', 1, outcome('x'), 60_000)
      expect(await storeOf({ url: URL }).get(s, 'k')).toMatchObject({ status: 'completed', key: 'k' })
      expect(await storeOf({ url: URL }).evict(s, 'k')).toBe(true)
      await redis.set(recordNames(prefix, s, 'foreign').key, 'not a record')
      await expect(storeOf({ url: URL }).renew(s, 'foreign', 1, 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
    })

    it('lets a watcher come before the client has opened (it polls), without throwing', async () => {
      const store = storeOf({ url: URL })
      const unsubscribe = store.watch(`s-${randomUUID()}`, 'k', () => {})
      expect(typeof unsubscribe).toBe('function')
      unsubscribe()
    })

    it('closes the client it opened: later calls fail with STORE_UNAVAILABLE', async () => {
      const store = new RedisStore({ url: URL, prefix })
      expect(await store.get(`s-${randomUUID()}`, 'k')).toBeNull()
      await store.close()
      await expect(store.get(`s-${randomUUID()}`, 'k')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    })

    it('leaves the caller’s own client open on close', async () => {
      const client = own()
      const store = new RedisStore({ client, prefix })
      const s = `s-${randomUUID()}`
      expect(store.watch(s, 'k', () => {})).toBeTypeOf('function')
      await store.acquire(s, 'k', fp('a'), 60_000)
      await store.close()
      expect(await client.ping()).toBe('PONG')
      expect(client.status).toBe('ready')
    })
  })

  describe('watch', () => {
    it('leaves a marker for a record not there yet that lives as long as an abandoned record: retention + grace', async () => {
      const s = `s-${randomUUID()}`
      const store = storeOf({ client: own(), abandonedRetention: '1h', expiredGrace: '10m' })
      const unsubscribe = store.watch(s, 'k', () => {})
      const name = recordNames(prefix, s, 'k').key
      let ttl = -2
      for (let i = 0; i < 200 && ttl < 0; i++) {
        await sleep(10)
        ttl = await redis.pttl(name)
      }
      unsubscribe()
      expect(ttl).toBeGreaterThan(3_600_000 + 600_000 - 60_000)
      expect(ttl).toBeLessThanOrEqual(3_600_000 + 600_000)
    })
  })

  describe('list', () => {
    it('lists more records than one read batch (250) once each', async () => {
      const s = `s-${randomUUID()}`
      const store = storeOf({ client: own() })
      const keys = Array.from({ length: 250 }, (_, i) => `k${i}`)
      await Promise.all(keys.map((key) => store.acquire(s, key, fp('a'), 60_000)))
      const listed = await store.list({ scope: s, limit: 1_000 })
      expect(listed).toHaveLength(250)
      expect(new Set(listed.map((r) => r.key)).size).toBe(250)
    })

    it('orders records oldest first, then by scope, then by key', async () => {
      const listPrefix = `${prefix}-list`
      const store = new RedisStore({ client: own(), prefix: listPrefix })
      stores.push(store)
      try {
        const scopes = [`b-${randomUUID()}`, `a-${randomUUID()}`]
        const keys = ['k3', 'k1', 'k2', 'k0']
        // Acquired together: several records share a creation millisecond, so scope and key decide.
        for (let round = 0; round < 3; round++) {
          await Promise.all(scopes.flatMap((scope) => keys.map((key) => store.acquire(scope, `${key}-${round}`, fp('a'), 60_000))))
          await sleep(3)
        }
        const listed = await store.list({ limit: 1_000 })
        expect(listed).toHaveLength(24)
        const byRule = [...listed].sort(
          (a, b) =>
            a.createdAtMs - b.createdAtMs ||
            (a.scope < b.scope ? -1 : a.scope > b.scope ? 1 : 0) ||
            (a.key < b.key ? -1 : a.key > b.key ? 1 : 0),
        )
        expect(listed.map((r) => `${r.createdAtMs} ${r.scope} ${r.key}`)).toEqual(byRule.map((r) => `${r.createdAtMs} ${r.scope} ${r.key}`))
        expect(new Set(listed.map((r) => r.createdAtMs)).size).toBeLessThan(24) // ties were there to order
      } finally {
        await dropPrefix(URL, listPrefix)
      }
    })
  })

  describe('purgeExpired', () => {
    /** A store on a prefix of its own, with `count` records that expired (their keys kept for the grace). */
    async function withExpired(count: number, filler = 0) {
      const purgePrefix = `${prefix}-purge-${randomUUID().slice(0, 8)}`
      const store = new RedisStore({ client: own(), prefix: purgePrefix })
      stores.push(store)
      const s = `s-${randomUUID()}`
      await Promise.all(Array.from({ length: count }, (_, i) => store.acquire(s, `k${i}`, fp('a'), 60_000)))
      await Promise.all(Array.from({ length: count }, (_, i) => store.complete(s, `k${i}`, 1, outcome('x'), 20)))
      await store.acquire(s, 'live', fp('a'), 60_000)
      if (filler > 0) {
        const pipeline = redis.pipeline()
        for (let i = 0; i < filler; i++) pipeline.set(`${purgePrefix}:filler:${i}`, '1', 'PX', 120_000)
        await pipeline.exec()
      }
      await sleep(50)
      return { store, s, purgePrefix }
    }

    it('purges in bounded batches that together take every expired record, resuming where it stopped', async () => {
      const { store, purgePrefix } = await withExpired(30)
      try {
        const counts: number[] = []
        for (let i = 0; i < 8; i++) counts.push(await store.purgeExpired(4))
        expect(counts).toEqual([4, 4, 4, 4, 4, 4, 4, 2])
      } finally {
        await dropPrefix(URL, purgePrefix)
      }
    })

    it('walks the whole keyspace in one call when the limit allows', async () => {
      const { store, s, purgePrefix } = await withExpired(10, 3_000)
      try {
        expect(await store.purgeExpired(1_000)).toBe(10)
        expect(await store.list({ scope: s })).toMatchObject([{ key: 'live' }])
      } finally {
        await dropPrefix(URL, purgePrefix)
      }
    })

    it('deletes an abandoned record’s steps with it', async () => {
      const s = `s-${randomUUID()}`
      const store = storeOf({ client: own(), abandonedRetention: 10 })
      const names = recordNames(prefix, s, 'k')
      await store.acquire(s, 'k', fp('a'), 30)
      expect(await store.recordStep(s, 'k', 1, 'charge', '{"id":1}')).toBe(true)
      expect(await redis.exists(names.steps)).toBe(1)
      await sleep(80)
      let purged = 0
      for (let i = 0; i < 20 && (await redis.exists(names.key)) === 1; i++) purged += await store.purgeExpired(1_000)
      expect(purged).toBeGreaterThanOrEqual(1)
      expect(await redis.exists(names.steps)).toBe(0)
    })
  })
})
