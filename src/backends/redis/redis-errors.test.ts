import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { freePort } from '../../../test/fixtures/redis/servers.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { Ledger } from '../../core/ledger.js'
import { RedisStore, recordNames } from './index.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const outcome = (text: string) =>
  ({ status: 'completed', response: { status: 201, headers: {}, body: new TextEncoder().encode(text) } }) as const

describe('RedisStore options', () => {
  it('refuses an ioredis client with keyPrefix (SCAN would miss its records) with INVALID_OPTION', () => {
    const client = new Redis({ keyPrefix: 'app:', lazyConnect: true })
    expect(() => new RedisStore({ client })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    expect(() => new RedisStore({ url: URL, prefix: 'bad{prefix}' })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    expect(() => new RedisStore({} as never)).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    client.disconnect()
  })
})

describe("RedisStore and the URL's database number", () => {
  it('refuses a URL path that is no database number at once (ioredis would SELECT NaN and stay in database 0)', () => {
    for (const path of ['abc', '1x', '-1', '0/extra']) {
      expect(() => new RedisStore({ url: `redis://:secret@127.0.0.1:6379/${path}` })).toThrow(
        expect.objectContaining({
          code: 'INVALID_OPTION',
          message: `RedisStore url "redis://:***@127.0.0.1:6379/${path}": the path of a Redis URL is a database number, e.g. redis://127.0.0.1:6379/0, not "${path}".`,
        }),
      )
    }
  })

  it.skipIf(skip !== undefined)(
    'fails every operation on a database the server refuses (past `databases`) and writes nothing to database 0',
    async () => {
      const prefix = `idemkey-test-${randomUUID()}`
      const store = new RedisStore({ url: `${URL}/99`, prefix })
      const ledger = new Ledger({ store })
      const zero = new Redis(URL)
      let runs = 0
      try {
        for (let i = 0; i < 2; i++) {
          await expect(ledger.run({ key: 'k', payload: 1 }, () => runs++)).rejects.toMatchObject({
            code: 'INVALID_OPTION',
            message: expect.stringMatching(
              /^Redis refused database 99 of the URL redis:\/\/127\.0\.0\.1:6379\/99 \(ERR DB index is out of range\)/,
            ),
          })
        }
        expect(runs).toBe(0)
        expect(await zero.keys(`${prefix}*`)).toEqual([])
      } finally {
        await store.close()
        zero.disconnect()
      }
    },
  )

  it.skipIf(skip !== undefined)("keeps its records in the URL's database", async () => {
    const prefix = `idemkey-test-${randomUUID()}`
    const store = new RedisStore({ url: `${URL}/3`, prefix })
    const three = new Redis(`${URL}/3`)
    const zero = new Redis(URL)
    try {
      expect(await store.acquire('s', 'k', fp('a'), 1_000)).toMatchObject({ kind: 'acquired' })
      expect(await three.exists(recordNames(prefix, 's', 'k').key)).toBe(1)
      expect(await zero.keys(`${prefix}*`)).toEqual([])
      await three.del(recordNames(prefix, 's', 'k').key)
    } finally {
      await store.close()
      three.disconnect()
      zero.disconnect()
    }
  })
})

describe('RedisStore when Redis cannot be reached', () => {
  it('answers STORE_UNAVAILABLE with the driver error as cause when nothing listens', async () => {
    const store = new RedisStore({ url: `redis://127.0.0.1:${await freePort()}` })
    try {
      const error = await store.acquire('s', 'k', fp('a'), 1_000).catch((e: unknown) => e)
      expect(error).toMatchObject({ name: 'IdempotencyError', code: 'STORE_UNAVAILABLE' })
      expect((error as Error).cause).toBeInstanceOf(Error)
      await expect(store.get('s', 'k')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
      await expect(store.list()).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    } finally {
      await store.close()
    }
  })

  it('says why it has no connection, in place of ioredis\'s "max retries per request" with an option to read about', async () => {
    const port = await freePort()
    const store = new RedisStore({ url: `redis://127.0.0.1:${port}` })
    try {
      for (const call of [() => store.acquire('s', 'k', fp('a'), 1_000), () => store.get('s', 'k'), () => store.list()]) {
        const error = (await call().catch((e: unknown) => e)) as Error
        expect(error.message).toContain(`no connection to Redis (connect ECONNREFUSED 127.0.0.1:${port}), and the command was given up`)
        expect(error.message).not.toContain('maxRetriesPerRequest')
        // The driver's own error stays the cause.
        expect((error.cause as Error).name).toBe('MaxRetriesPerRequestError')
      }
    } finally {
      await store.close()
    }
  })

  it('lets a ledger fail closed with STORE_UNAVAILABLE and never run the work', async () => {
    const store = new RedisStore({ url: `redis://127.0.0.1:${await freePort()}` })
    const ledger = new Ledger({ store })
    let runs = 0
    try {
      await expect(ledger.run({ key: 'k', payload: 1 }, () => runs++)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
      expect(runs).toBe(0)
    } finally {
      await store.close()
    }
  })
})

describe.skipIf(skip !== undefined)('RedisStore when its keys are overwritten by another program', () => {
  const redis = new Redis(URL)
  const prefix = `idemkey-test-${randomUUID()}`
  const store = new RedisStore({ url: URL, prefix })
  afterAll(async () => {
    await store.close()
    redis.disconnect()
  })

  it('refuses a record key holding a string with STORE_SCHEMA on every operation, and evict clears it', async () => {
    const s = `s-${randomUUID()}`
    await redis.set(recordNames(prefix, s, 'k').key, 'not a record')
    for (const attempt of [
      () => store.acquire(s, 'k', fp('a'), 60_000),
      () => store.renew(s, 'k', 1, 60_000),
      () => store.complete(s, 'k', 1, outcome('x'), 60_000),
      () => store.release(s, 'k', 1),
      () => store.get(s, 'k'),
    ]) {
      await expect(attempt()).rejects.toMatchObject({ name: 'IdempotencyError', code: 'STORE_SCHEMA' })
    }
    expect(await store.evict(s, 'k')).toBe(true)
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
  })

  it('refuses a record key holding a hash with STORE_SCHEMA, not a grant, and leaves it as it is', async () => {
    const s = `s-${randomUUID()}`
    await redis.hset(recordNames(prefix, s, 'k').key, 'user', '42')
    for (const attempt of [
      () => store.acquire(s, 'k', fp('a'), 60_000),
      () => store.get(s, 'k'),
      () => store.renew(s, 'k', 1, 60_000),
      () => store.recordStep(s, 'k', 1, 'charge', '{}'),
      () => store.complete(s, 'k', 1, outcome('x'), 60_000),
      () => store.release(s, 'k', 1),
    ]) {
      await expect(attempt()).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
    }
    expect(await redis.hgetall(recordNames(prefix, s, 'k').key)).toEqual({ user: '42' })
  })

  it('refuses a record whose stored scope and key are not the ones asked for (a forged or colliding name)', async () => {
    const s = `s-${randomUUID()}`
    const { token } = (await store.acquire(s, 'other', fp('a'), 60_000)) as { token: number }
    await store.complete(s, 'other', token, outcome('other'), 60_000)
    await redis.copy(recordNames(prefix, s, 'other').key, recordNames(prefix, s, 'k').key)
    await expect(store.acquire(s, 'k', fp('a'), 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
  })

  it('refuses a record whose token was overwritten with garbage, and fences out its holder', async () => {
    const s = `s-${randomUUID()}`
    const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
    const name = recordNames(prefix, s, 'k').key
    // The packed record's token is the field after the 7-byte head ('ik1' flags status '|').
    const packed = (await redis.get(name)) as string
    await redis.set(name, packed.replace(/^(ik1...\|)\d+/, '$1garbage'), 'KEEPTTL')
    expect(await store.complete(s, 'k', token, outcome('x'), 60_000)).toBe(false)
    await expect(store.acquire(s, 'k', fp('a'), 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
  })
})
