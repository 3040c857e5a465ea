import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { createSentinel } from 'redis'
import { afterAll, describe, expect, it } from 'vitest'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import type { Outcome } from '../../core/store.js'
import { NotReplicatedError, type RedisClientLike, RedisStore } from './index.js'

// The durability option on the shared Redis (127.0.0.1:6379), a primary with no replica: every WAIT it
// sends answers 0, so what a durable write does when its replicas do not confirm is seen here. What it
// does through a real failover: test/redis-failover.test.ts.
const skip = await serviceSkipReason('Redis', 6379)
const URL = 'redis://127.0.0.1:6379'
const fp = createHash('sha256').update('a').digest('hex')
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: {}, body: new TextEncoder().encode('ok') } }
const prefix = `idemkey-dur-${randomUUID().slice(0, 8)}`

describe('RedisStore durability option checks', () => {
  const refused =
    (durability: unknown, extra: object = {}) =>
    () =>
      new RedisStore({ url: URL, prefix, durability: durability as never, ...extra })

  it.each([
    [{ replicas: 0 }, /replicas must be a whole number of replicas, 1 or more, got 0/],
    [{ replicas: 1.5 }, /replicas must be a whole number/],
    [{ replicas: '1' }, /replicas must be a whole number/],
    [{ replicas: 1, timeout: 0 }, /timeout must be at least 1ms/],
    [{ replicas: 1, timeout: 'soon' }, /durability\.timeout/],
    [{ replicas: 1, aof: 'yes' }, /aof must be true or false/],
    [{ replicas: 1, waitAof: true }, /unknown field waitAof/],
    [1, /give \{ replicas: n/],
  ])('refuses %j with INVALID_OPTION naming what is wrong', (durability, message) => {
    expect(refused(durability)).toThrow(expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringMatching(message) }))
  })

  it('refuses a timeout at or above the socketTimeout of the client it opens', () => {
    expect(refused({ replicas: 1, timeout: '10s' })).toThrow(/must be below socketTimeout \(10000ms\)/)
    expect(refused({ replicas: 1, timeout: '2s' }, { socketTimeout: '2s' })).toThrow(/below socketTimeout/)
  })

  it('refuses a Cluster, and a client that cannot report a lost connection', () => {
    const client: RedisClientLike = { callBuffer: async () => null, duplicate: () => ({}) as never, quit: async () => {} }
    expect(() => new RedisStore({ client: { ...client, isCluster: true } as RedisClientLike, durability: { replicas: 1 } })).toThrow(
      /cannot follow a Cluster/,
    )
    expect(() => new RedisStore({ client, durability: { replicas: 1 } })).toThrow(/reports a lost connection/)
  })

  it("refuses node-redis's createSentinel() client, naming the ioredis one to use instead", () => {
    const sentinel = createSentinel({ name: 'mymaster', sentinelRootNodes: [{ host: '127.0.0.1', port: 1 }] })
    expect(() => new RedisStore({ client: sentinel as never })).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining('new Redis({ sentinels, name })') }),
    )
  })
})

describe.skipIf(skip)('RedisStore durability on a primary without replicas (WAIT answers 0)', () => {
  const durable = new RedisStore({ url: URL, prefix, durability: { replicas: 1, timeout: 50 } })
  const plain = new RedisStore({ url: URL, prefix })
  afterAll(async () => {
    await durable.close()
    await plain.close()
    await dropPrefix(URL, prefix)
  })

  it('fails an acquisition with NotReplicatedError after its timeout, and releases the record for the retry', async () => {
    const key = randomUUID()
    const started = performance.now()
    const error = await durable.acquire('s', key, fp, 30_000).catch((e: unknown) => e)
    expect(performance.now() - started).toBeGreaterThanOrEqual(45)
    expect(error).toBeInstanceOf(NotReplicatedError)
    expect(error).toMatchObject({ code: 'STORE_UNAVAILABLE', operation: 'acquire', required: 1, confirmed: 0 })
    expect((error as Error).message).toMatch(/only 0 of 1 replicas confirmed it within 50ms \(WAIT\).*a retry is safe/)
    // Released: the next caller takes it at once (token 2: the unconfirmed one counted).
    expect(await plain.acquire('s', key, fp, 30_000)).toEqual({ kind: 'acquired', token: 2 })
  })

  it('keeps an unconfirmed completion, and answers its holder again with NotReplicatedError rather than fenced out', async () => {
    const key = randomUUID()
    const acquired = await plain.acquire('s', key, fp, 30_000)
    expect(acquired).toEqual({ kind: 'acquired', token: 1 })
    await expect(durable.complete('s', key, 1, outcome, 60_000)).rejects.toBeInstanceOf(NotReplicatedError)
    expect(await plain.get('s', key)).toMatchObject({ status: 'completed', token: 1 })
    // The holder's retry: the record is its own completion, so it waits for the replicas again.
    await expect(durable.complete('s', key, 1, outcome, 60_000)).rejects.toMatchObject({ operation: 'complete', confirmed: 0 })
    // Another token is fenced out, without a wait.
    expect(await durable.complete('s', key, 2, outcome, 60_000)).toBe(false)
  })

  it('waits on renewals and recorded steps, not on replays, in-progress answers or releases', async () => {
    const key = randomUUID()
    await plain.acquire('s', key, fp, 30_000)
    await expect(durable.renew('s', key, 1, 30_000)).rejects.toMatchObject({ operation: 'renew' })
    await expect(durable.recordStep('s', key, 1, 'charge', '1')).rejects.toMatchObject({ operation: 'recordStep' })
    expect(await durable.acquire('s', key, fp, 30_000)).toMatchObject({ kind: 'in_progress' })
    expect(await durable.release('s', key, 1)).toBe(true)
    const done = randomUUID()
    await plain.acquire('s', done, fp, 30_000)
    await plain.complete('s', done, 1, outcome, 60_000)
    expect(await durable.acquire('s', done, fp, 30_000)).toMatchObject({ kind: 'replay' })
  })

  it('with aof: fails on a server without WAITAOF (before 7.2), naming its version', async () => {
    const client = new Redis(URL, { maxRetriesPerRequest: 1 })
    const store = new RedisStore({ client, prefix, durability: { replicas: 1, timeout: 50, aof: true } })
    try {
      const version = /redis_version:(\d+\.\d+)/.exec(await client.info('server'))?.[1] as string
      const [major = 0, minor = 0] = version.split('.').map(Number)
      if (major > 7 || (major === 7 && minor >= 2)) return // this server has WAITAOF: nothing to refuse
      await expect(store.acquire('s', randomUUID(), fp, 30_000)).rejects.toMatchObject({
        code: 'INVALID_OPTION',
        message: expect.stringContaining(`needs WAITAOF (Redis 7.2 or later); this server is ${version}`),
      })
    } finally {
      await store.close()
      client.disconnect()
    }
  })
})
