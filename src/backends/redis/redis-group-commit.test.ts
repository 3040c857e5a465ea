import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { afterAll, describe, expect, it } from 'vitest'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import type { Outcome } from '../../core/store.js'
import type { RedisArg, RedisClientLike } from './index.js'
import { RedisStore } from './index.js'
import { completeBatchLua } from './lua.generated.js'

// RedisStore's group commit on one server (docs/redis.md, "Group commit"): the completes that callers
// issue while one is in flight go to Redis together, the fresh records among them in one compare-and-set
// script call, each caller answered with its own answer. Every contract, model, crash and zombie suite
// runs with it on (the default); these tests pin what one batch holds and answers.
const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const sha1 = (source: string) => createHash('sha1').update(source).digest('hex')
const outcome = (text: string): Outcome => ({
  status: 'completed',
  response: { status: 201, headers: {}, body: new TextEncoder().encode(text) },
})
const text = (body: Uint8Array | undefined) => new TextDecoder().decode(body)
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

interface Seen {
  client: RedisClientLike
  /** The number of keys in each compare-and-set batch call. */
  batches: number[]
  /** Lone SET NX GETs and complete-script calls. */
  single: { setNx: number; scripts: number }
}

/** A real ioredis client seen through a proxy that counts what the store sends. */
function seen(redis: Redis, extra: Record<string, unknown> = {}): Seen {
  const batches: number[] = []
  const single = { setNx: 0, scripts: 0 }
  const completeSha = sha1(completeBatchLua)
  const client = new Proxy(redis, {
    get(target, property) {
      if (property in extra) return extra[property as string]
      if (property === 'evalshaBuffer') {
        return (...args: RedisArg[]) => {
          if (args[0] === completeSha) batches.push(Number(args[1]))
          else single.scripts++
          return target.callBuffer('evalsha', ...args)
        }
      }
      if (property === 'setBuffer') {
        return (...args: RedisArg[]) => {
          single.setNx++
          return target.callBuffer('set', ...args)
        }
      }
      const value = Reflect.get(target, property)
      return typeof value === 'function' ? value.bind(target) : value
    },
  }) as unknown as RedisClientLike
  return { client, batches, single }
}

describe.skipIf(skip !== undefined)('RedisStore group commit on one server', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  const opened: Redis[] = []
  const stores: RedisStore[] = []
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
  afterAll(async () => {
    for (const store of stores) await store.close()
    for (const client of opened) client.disconnect()
    await dropPrefix(URL, prefix)
  })

  it("sends a lone caller's operations as without group commit: one SET NX GET, then the complete script", async () => {
    const s = `s-${randomUUID()}`
    const counted = seen(own())
    const store = storeOf({ client: counted.client })
    const acquired = await store.acquire(s, 'alone', fp('a'), 60_000)
    expect(acquired).toEqual({ kind: 'acquired', token: 1 })
    expect(await store.complete(s, 'alone', 1, outcome('alone'), 60_000)).toBe(true)
    expect(counted.single).toEqual({ setNx: 1, scripts: 1 })
    expect(counted.batches).toEqual([])
    expect(await store.get(s, 'alone')).toMatchObject({ status: 'completed' })
  })

  it('answers each caller of one complete batch with its own: fresh records by compare-and-set, a waited-on and a renewed one by the script, a fenced-out token', async () => {
    const s = `s-${randomUUID()}`
    const counted = seen(own())
    const store = storeOf({ client: counted.client })
    for (const key of ['first', 'a', 'b', 'waited', 'renewed'])
      expect(await store.acquire(s, key, fp('a'), 60_000)).toMatchObject({ token: 1 })
    // A second caller of `waited` is told it is in progress, which flags the record as waited on.
    expect(await store.acquire(s, 'waited', fp('a'), 60_000)).toMatchObject({ kind: 'in_progress' })
    let woken = false
    const unwatch = store.watch(s, 'waited', () => {
      woken = true
    })
    await sleep(50) // the subscription is in place, and its first "may have changed" call has come
    woken = false
    expect(await store.renew(s, 'renewed', 1, 60_000)).toBe(true)
    const answers = await Promise.all([
      store.complete(s, 'first', 1, outcome('first'), 60_000),
      store.complete(s, 'a', 1, outcome('a'), 60_000),
      store.complete(s, 'b', 1, outcome('b'), 60_000),
      store.complete(s, 'waited', 1, outcome('waited'), 60_000),
      store.complete(s, 'renewed', 1, outcome('renewed'), 60_000),
      store.complete(s, 'b', 2, outcome('a zombie'), 60_000),
    ])
    expect(answers).toEqual([true, true, true, true, true, false])
    // One compare-and-set call held every fresh record of the batch: a, b, waited (whose flag made it miss).
    expect(counted.batches).toEqual([3])
    for (const key of ['first', 'a', 'b', 'waited', 'renewed']) {
      const record = await store.get(s, key)
      expect(record, key).toMatchObject({ status: 'completed', token: 1 })
      expect(text(record?.response?.body), key).toBe(key)
    }
    for (let i = 0; i < 50 && !woken; i++) await sleep(20)
    expect(woken).toBe(true)
    unwatch()
  })

  it('answers each caller of one batch that holds the same key under two scopes with its own record', async () => {
    const [s, t] = [`s-${randomUUID()}`, `t-${randomUUID()}`]
    const store = storeOf({ client: own() })
    for (const scope of [s, t]) expect(await store.acquire(scope, 'shared', fp(scope), 60_000)).toEqual({ kind: 'acquired', token: 1 })
    const answers = await Promise.all([
      store.complete(s, 'first', 1, outcome('never acquired'), 60_000),
      store.complete(s, 'shared', 1, outcome(s), 60_000),
      store.complete(t, 'shared', 1, outcome(t), 60_000),
      store.complete(t, 'shared', 1, outcome('twice'), 60_000),
    ])
    expect(answers).toEqual([false, true, true, false])
    for (const scope of [s, t]) {
      const record = await store.get(scope, 'shared')
      expect(record, scope).toMatchObject({ scope, status: 'completed', token: 1, fingerprint: fp(scope) })
      expect(text(record?.response?.body), scope).toBe(scope)
    }
  })

  it('fences out a fresh record taken over after its lease ended: its compare-and-set misses and the script refuses token 1', async () => {
    const s = `s-${randomUUID()}`
    const counted = seen(own())
    const store = storeOf({ client: counted.client })
    const other = storeOf({ client: own(), groupCommit: false })
    await store.acquire(s, 'first', fp('a'), 60_000)
    await store.acquire(s, 'kept', fp('a'), 60_000)
    await store.acquire(s, 'lost', fp('a'), 50)
    await sleep(120)
    expect(await other.acquire(s, 'lost', fp('a'), 60_000)).toMatchObject({ kind: 'acquired', token: 2 })
    const answers = await Promise.all([
      store.complete(s, 'first', 1, outcome('first'), 60_000),
      store.complete(s, 'kept', 1, outcome('kept'), 60_000),
      store.complete(s, 'lost', 1, outcome('the zombie'), 60_000),
    ])
    expect(answers).toEqual([true, true, false])
    expect(counted.batches).toEqual([2])
    expect(await store.get(s, 'lost')).toMatchObject({ status: 'in_progress', token: 2 })
    expect(await other.complete(s, 'lost', 2, outcome('the holder'), 60_000)).toBe(true)
    expect(text((await store.get(s, 'lost'))?.response?.body)).toBe('the holder')
  })

  it('keeps when a record completed in a batch was created: a record held 100 ms was created 100 ms before its completion', async () => {
    const s = `s-${randomUUID()}`
    const counted = seen(own())
    const store = storeOf({ client: counted.client })
    await store.acquire(s, 'first', fp('a'), 60_000)
    await store.acquire(s, 'held', fp('a'), 60_000)
    await store.acquire(s, 'other', fp('a'), 60_000)
    await sleep(100)
    await Promise.all(['first', 'held', 'other'].map((key) => store.complete(s, key, 1, outcome(key), 60_000)))
    expect(counted.batches).toEqual([2])
    const record = await store.get(s, 'held')
    expect(record?.status).toBe('completed')
    const held = (record?.updatedAtMs ?? 0) - (record?.createdAtMs ?? 0)
    expect(held).toBeGreaterThanOrEqual(95)
    expect(held).toBeLessThan(1_000)
    expect(record?.expiresAtMs).toBe((record?.updatedAtMs ?? 0) + 60_000)
  })

  it('never dates a record completed in a batch before its acquire', async () => {
    // A batch's compare-and-set keeps how long each holder held its record, as SET IFEQ does; the
    // holder's measure is rounded down, so the record's creation is never before the acquire's SET.
    const s = `s-${randomUUID()}`
    const counted = seen(own())
    const store = storeOf({ client: counted.client })
    const early: string[] = []
    for (let round = 0; round < 20; round++) {
      const keys = Array.from({ length: 10 }, (_, i) => `r${round}-${i}`)
      for (const key of keys) await store.acquire(s, key, fp('a'), 60_000)
      const fresh = await Promise.all(keys.map((key) => store.get(s, key)))
      expect(await Promise.all(keys.map((key) => store.complete(s, key, 1, outcome(key), 60_000)))).toEqual(keys.map(() => true))
      for (const [i, key] of keys.entries()) {
        const done = await store.get(s, key)
        if ((done?.createdAtMs as number) < (fresh[i]?.createdAtMs as number)) early.push(key)
      }
    }
    expect(counted.batches.length).toBeGreaterThan(0)
    expect(early).toEqual([])
  })

  it('answers the callers queued behind a batch in flight before close() closes the client it opened', async () => {
    const s = `s-${randomUUID()}`
    const store = new RedisStore({ url: URL, prefix })
    const keys = Array.from({ length: 20 }, (_, i) => `k${i}`)
    for (const key of keys) await store.acquire(s, key, fp('a'), 60_000)
    const completes = keys.map((key) => store.complete(s, key, 1, outcome(key), 60_000))
    const closing = store.close()
    const answers = await Promise.all(completes)
    await closing
    expect(answers).toEqual(keys.map(() => true))
  })

  it('sends one command per operation with groupCommit: false, and on a Cluster', async () => {
    for (const [label, options, extra] of [
      ['groupCommit: false', { groupCommit: false }, {}],
      ['a Cluster', {}, { isCluster: true }],
    ] as const) {
      const s = `s-${randomUUID()}`
      const counted = seen(own(), extra)
      const store = storeOf({ client: counted.client, ...options })
      const keys = ['a', 'b', 'c', 'd']
      await Promise.all(keys.map((key) => store.acquire(s, key, fp('a'), 60_000)))
      expect(await Promise.all(keys.map((key) => store.complete(s, key, 1, outcome(key), 60_000))), label).toEqual([true, true, true, true])
      expect(counted.batches, label).toEqual([])
      expect(counted.single, label).toEqual({ setNx: 4, scripts: 4 })
    }
  })
})
