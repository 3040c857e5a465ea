/**
 * The Redis clients RedisStore runs on, beside what the store contract pins: telling a node-redis client
 * or cluster from an ioredis one, the node-redis subscriber (unwatch, close, a killed connection), a
 * node-redis cluster (commands routed by their record's key, list and purge over every master, wake-ups),
 * the ioredis client a `url` store opens (eager connect, reconnect backoff, no console noise, ioredis
 * missing), script loading (EVAL only after NOSCRIPT) and the errors a driver's failure becomes.
 */
import { createHash, randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { createClient, createCluster } from '@redis/client'
import { Redis } from 'ioredis'
import { freePort, RedisCluster } from '../../../test/fixtures/redis/servers.js'
import { eventually } from '../../../test/helpers/eventually.js'
import { connectionsNamed, dropPrefix, subscribers } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { TcpFaultProxy } from '../../../test/helpers/tcp-fault-proxy.js'
import type { RedisClientLike, RedisSubscriberLike } from './client.js'
import { serverHasSetIfEq } from './client.js'
import { isNodeRedisClient, isNodeRedisCluster, RedisStore, recordNames } from './index.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const outcome = (body: Uint8Array) => ({ status: 'completed', response: { status: 201, headers: {}, body } }) as const
const text = (value: string) => new TextEncoder().encode(value)
/** Bytes that are not UTF-8: a reply decoded as a string would change them. */
const BINARY = Uint8Array.from([0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28, 0x0a, 0x41])

const until = (condition: () => Promise<boolean> | boolean, timeoutMs = 5_000) => eventually(condition, 'the condition', timeoutMs, 20)

describe('telling node-redis clients from ioredis ones', () => {
  const nodeRedis = createClient({ url: URL })
  const nodeRedisCluster = createCluster({ rootNodes: [{ url: URL }] })
  const ioredis = new Redis({ lazyConnect: true })
  afterAll(() => ioredis.disconnect())

  it('takes a node-redis client as a client but not as a cluster', () => {
    expect(isNodeRedisClient(nodeRedis)).toBe(true)
    expect(isNodeRedisCluster(nodeRedis)).toBe(false)
  })

  it('takes a node-redis cluster as both a node-redis client and a cluster', () => {
    expect(isNodeRedisClient(nodeRedisCluster)).toBe(true)
    expect(isNodeRedisCluster(nodeRedisCluster)).toBe(true)
  })

  it('leaves an ioredis client to the ioredis path', () => {
    expect(isNodeRedisClient(ioredis)).toBe(false)
    expect(isNodeRedisCluster(ioredis)).toBe(false)
  })

  it.each([
    ['undefined', undefined],
    ['null', null],
    ['a string', 'redis://127.0.0.1:6379'],
    ['an empty object', {}],
    ['an object with sendCommand only', { sendCommand() {} }],
    ['an object with withTypeMapping only', { withTypeMapping() {} }],
    ['a function with both methods', Object.assign(() => {}, { sendCommand() {}, withTypeMapping() {} })],
    ['cluster parts without a client', { nodeClient() {}, masters: [] }],
    ['an object with masters only', { masters: [] }],
  ])('answers false, without throwing, for %s', (_, candidate) => {
    expect(isNodeRedisClient(candidate)).toBe(false)
    expect(isNodeRedisCluster(candidate)).toBe(false)
  })

  it('does not take a node-redis client that lacks masters, or nodeClient, for a cluster', () => {
    const client = { sendCommand() {}, withTypeMapping() {} }
    expect(isNodeRedisCluster({ ...client, nodeClient() {} })).toBe(false)
    expect(isNodeRedisCluster({ ...client, masters: [] })).toBe(false)
    expect(isNodeRedisCluster({ ...client, nodeClient() {}, masters: [] })).toBe(true)
  })

  it('refuses at construction a node-redis 4 client (sendCommand, no withTypeMapping), saying to upgrade, rather than failing every call later', () => {
    // The shape of redis@4 / @redis/client@1: it cannot return replies as bytes.
    const v4 = { sendCommand() {}, isOpen: true, quit() {} }
    expect(() => new RedisStore({ client: v4 as unknown as RedisClientLike })).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining('upgrade to redis@5 or later') }),
    )
    expect(() => new RedisStore({ client: {} as unknown as RedisClientLike })).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: expect.stringContaining('an ioredis Redis or Cluster, or a node-redis 5+'),
      }),
    )
    expect(() => new RedisStore({ client: createClient() as unknown as RedisClientLike })).not.toThrow()
    expect(() => new RedisStore({ client: new Redis({ lazyConnect: true }) })).not.toThrow()
  })
})

describe('serverHasSetIfEq on INFO replies the common ones do not cover', () => {
  it.each([
    ['a Redis 7.4 (a minor past 8.4 minor, a major below)', 'redis_version:7.4.2\r\n', false],
    [
      'a Valkey 7.2 (a minor past 8.1 minor, a major below)',
      'redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:7.2.9\r\n',
      false,
    ],
    ['a Valkey 8.1 whose INFO has no server_name line', 'redis_version:7.2.4\r\nvalkey_version:8.1.0\r\n', true],
    ['a Valkey 8.0 that claims redis_version 8.4, without server_name', 'redis_version:8.4.0\r\nvalkey_version:8.0.2\r\n', false],
  ])('reads %s', (_, info, expected) => {
    expect(serverHasSetIfEq(info)).toBe(expected)
  })
})

/**
 * A node-redis-shaped client with `quit()` but no `close()` (the older way to close, which the adapter
 * still takes), on a real node-redis client whose `close` is hidden.
 */
function withoutClose<T extends object>(client: T): T {
  return new Proxy(client, {
    get(target, property) {
      if (property === 'close') return undefined
      if (property === 'duplicate') return () => withoutClose((target as { duplicate(): T }).duplicate())
      const value = Reflect.get(target, property, target)
      return typeof value === 'function' ? value.bind(target) : value
    },
  })
}

describe.skipIf(skip !== undefined)('RedisStore on a node-redis client: its subscriber', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  const admin = new Redis(URL)
  const opened: Array<{ close(): Promise<unknown>; isOpen: boolean }> = []
  const open = async (name: string) => {
    const client = createClient({ url: URL, name })
    client.on('error', () => {})
    await client.connect()
    opened.push(client)
    return client
  }
  afterAll(async () => {
    for (const client of opened) if (client.isOpen) await client.close()
    await dropPrefix(URL, prefix)
    admin.disconnect()
  })

  it('wakes a watcher through a duplicate of the client, and unsubscribes when the last watcher leaves', async () => {
    const client = await open(`idemkey-test-${randomUUID()}`)
    const store = new RedisStore({ client, prefix })
    const s = `s-${randomUUID()}`
    const { channel } = recordNames(prefix, s, 'k')
    const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
    let calls = 0
    const unwatch = store.watch(s, 'k', () => calls++)
    await until(() => calls === 1) // "it may have changed", once subscribed
    expect(await subscribers(admin, channel)).toBe(1)
    expect(await store.complete(s, 'k', token, outcome(text('done')), 60_000)).toBe(true)
    await until(() => calls === 2)
    unwatch()
    await until(async () => (await subscribers(admin, channel)) === 0)
    await store.close()
  })

  it('closes the subscriber connection it opened when the store closes, and leaves the app its client', async () => {
    const name = `idemkey-test-${randomUUID()}`
    const client = await open(name)
    const store = new RedisStore({ client, prefix })
    let calls = 0
    store.watch(`s-${randomUUID()}`, 'k', () => calls++)
    await until(() => calls === 1)
    expect(await connectionsNamed(admin, name)).toHaveLength(2)
    await store.close()
    await until(async () => (await connectionsNamed(admin, name)).length === 1)
    expect(client.isOpen).toBe(true)
    expect(await client.ping()).toBe('PONG')
  })

  it('closes the subscriber of a client that has quit() but no close() when the store closes', async () => {
    const name = `idemkey-test-${randomUUID()}`
    const client = withoutClose(await open(name))
    const store = new RedisStore({ client, prefix })
    let calls = 0
    store.watch(`s-${randomUUID()}`, 'k', () => calls++)
    await until(() => calls === 1)
    expect(await connectionsNamed(admin, name)).toHaveLength(2)
    await store.close()
    await until(async () => (await connectionsNamed(admin, name)).length === 1)
  })

  it('survives the server killing its subscriber connection (no unhandled error) and wakes watchers again after', async () => {
    const name = `idemkey-test-${randomUUID()}`
    const client = await open(name)
    const store = new RedisStore({ client, prefix })
    const s = `s-${randomUUID()}`
    const { channel } = recordNames(prefix, s, 'k')
    const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
    let calls = 0
    store.watch(s, 'k', () => calls++)
    await until(() => calls === 1)
    const subscriber = (await connectionsNamed(admin, name)).find((c) => c.flags.includes('P'))
    expect(subscriber).toBeDefined()
    await admin.client('KILL', 'ID', subscriber?.id as string)
    // node-redis reconnects and subscribes again by itself.
    await until(async () => (await connectionsNamed(admin, name)).some((c) => c.flags.includes('P') && c.id !== subscriber?.id))
    await until(async () => (await subscribers(admin, channel)) === 1)
    const before = calls
    expect(await store.complete(s, 'k', token, outcome(text('done')), 60_000)).toBe(true)
    await until(() => calls > before)
    await store.close()
  })
})

describe('RedisStore on a node-redis cluster (createCluster), 3 masters of its own', () => {
  const cluster = new RedisCluster()
  let client: ReturnType<typeof createCluster>
  let store: RedisStore
  const prefix = `idemkey-test-${randomUUID()}`
  beforeAll(async () => {
    await cluster.start()
    client = createCluster({ rootNodes: cluster.nodes.map(({ host, port }) => ({ url: `redis://${host}:${port}` })) })
    client.on('error', () => {})
    await client.connect()
    store = new RedisStore({ client, prefix })
  }, 60_000)
  afterAll(async () => {
    await store?.close()
    await client?.close()
    await cluster.stop()
  })
  /** Keys enough to land on every master (the slot of a key is its hash tag's CRC16). */
  const keys = Array.from({ length: 12 }, (_, i) => `k${i}`)

  it('routes every record to the master of its key: acquire, complete and replay, bytes kept', async () => {
    const s = `s-${randomUUID()}`
    for (const key of keys) {
      const { token } = (await store.acquire(s, key, fp(key), 60_000)) as { token: number }
      expect(token).toBe(1)
      expect(await store.complete(s, key, token, outcome(BINARY), 60_000)).toBe(true)
    }
    for (const key of keys) {
      const replay = await store.acquire(s, key, fp(key), 60_000)
      expect(replay.kind).toBe('replay')
      if (replay.kind === 'replay') expect(Buffer.from(replay.record.response?.body ?? [])).toEqual(Buffer.from(BINARY))
      expect((await store.get(s, key))?.status).toBe('completed')
    }
  })

  it('lists the records of every master, and purges expired ones on every master', async () => {
    const s = `s-${randomUUID()}`
    for (const key of keys) await store.acquire(s, key, fp(key), 60_000)
    const listed = await store.list({ scope: s, limit: 100 })
    expect(listed.map((r) => r.key).sort()).toEqual([...keys].sort())
    // Records of a short-lived store: lease 1 ms, gone (but kept for the grace) a few ms later.
    const shortPrefix = `${prefix}-short`
    const short = new RedisStore({ client, prefix: shortPrefix, abandonedRetention: 1, expiredGrace: 60_000 })
    for (const key of keys) await short.acquire(s, key, fp(key), 1)
    await sleep(50)
    expect(await short.purgeExpired(1_000)).toBe(keys.length)
    expect(await short.list({ scope: s })).toEqual([])
    await short.close()
  })

  it('loads its scripts again after SCRIPT FLUSH on every master (EVAL routed by the key too)', async () => {
    const s = `s-${randomUUID()}`
    const tokens = new Map<string, number>()
    for (const key of keys) tokens.set(key, ((await store.acquire(s, key, fp(key), 60_000)) as { token: number }).token)
    for (const { port } of cluster.nodes) {
      const node = new Redis(port, '127.0.0.1')
      await node.script('FLUSH')
      node.disconnect()
    }
    for (const key of keys) expect(await store.complete(s, key, tokens.get(key) as number, outcome(text(key)), 60_000)).toBe(true)
  })

  it('wakes a watcher through a duplicate of the cluster', async () => {
    const s = `s-${randomUUID()}`
    const { token } = (await store.acquire(s, 'watched', fp('a'), 60_000)) as { token: number }
    let calls = 0
    const unwatch = store.watch(s, 'watched', () => calls++)
    await until(() => calls === 1)
    expect(await store.complete(s, 'watched', token, outcome(text('done')), 60_000)).toBe(true)
    await until(() => calls === 2)
    unwatch()
  })
})

/** An ioredis client behind the plain client interface, noting each command it is asked to send. */
function noting(redis: Redis, refuse?: (command: string) => Error | undefined): { client: RedisClientLike; sent: string[] } {
  const sent: string[] = []
  const client: RedisClientLike = {
    callBuffer: (command, ...args) => {
      sent.push(command)
      const refusal = refuse?.(command)
      if (refusal) throw refusal // synchronously, as a circuit breaker in front of the client might
      return redis.callBuffer(command, ...args)
    },
    duplicate: () => redis.duplicate() as unknown as RedisSubscriberLike,
    quit: () => redis.quit(),
  }
  return { client, sent }
}

describe.skipIf(skip !== undefined)('RedisStore scripts and driver errors', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  const redis = new Redis(URL)
  afterAll(async () => {
    await dropPrefix(URL, prefix)
    redis.disconnect()
  })

  it('reports a script error other than NOSCRIPT as it is, without sending the script source again', async () => {
    const { client, sent } = noting(redis)
    const store = new RedisStore({ client, prefix })
    const s = `s-${randomUUID()}`
    // Loads the scripts (NOSCRIPT, then EVAL) if this server never ran them.
    await store.renew(s, 'missing', 1, 60_000)
    await store.get(s, 'missing')
    await redis.rpush(recordNames(prefix, s, 'k').key, 'a list')
    sent.length = 0
    await expect(store.renew(s, 'k', 1, 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
    await expect(store.get(s, 'k')).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
    expect(sent).toEqual(['evalsha', 'evalsha'])
  })

  it('answers STORE_SCHEMA naming the key, with the driver error as cause, for a key of another type', async () => {
    const store = new RedisStore({ client: redis, prefix })
    const s = `s-${randomUUID()}`
    const { key } = recordNames(prefix, s, 'k')
    for (const write of [() => redis.rpush(key, 'a list'), () => redis.sadd(key, 'a set'), () => redis.zadd(key, 1, 'a zset')]) {
      await redis.del(key)
      await write()
      for (const attempt of [() => store.acquire(s, 'k', fp('a'), 60_000), () => store.get(s, 'k'), () => store.renew(s, 'k', 1, 60_000)]) {
        const error = await attempt().catch((e: unknown) => e)
        expect(error).toMatchObject({ name: 'IdempotencyError', code: 'STORE_SCHEMA' })
        expect((error as Error).message).toContain(key)
        expect((error as Error).message).toContain('idemkey did not write')
        expect((error as Error).cause).toBeInstanceOf(Error)
      }
    }
  })

  it('answers STORE_UNAVAILABLE with the error as cause when the client throws instead of rejecting', async () => {
    const boom = new Error('circuit open')
    const { client } = noting(redis, (command) => (command.startsWith('eval') ? boom : undefined))
    const store = new RedisStore({ client, prefix })
    const s = `s-${randomUUID()}`
    for (const attempt of [() => store.renew(s, 'k', 1, 60_000), () => store.get(s, 'k'), () => store.release(s, 'k', 1)]) {
      const error = await attempt().catch((e: unknown) => e)
      expect(error).toMatchObject({ name: 'IdempotencyError', code: 'STORE_UNAVAILABLE' })
      expect((error as Error).cause).toBe(boom)
    }
  })
})

describe('RedisStore({ url }): the ioredis client it opens', () => {
  it('names the failed operation when Redis cannot be reached', async () => {
    const store = new RedisStore({ url: `redis://127.0.0.1:${await freePort()}` })
    try {
      await expect(store.get('s', 'k')).rejects.toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: expect.stringMatching(/^redis: get failed: /),
      })
      await expect(store.list()).rejects.toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: expect.stringMatching(/^redis: list failed: /),
      })
    } finally {
      await store.close()
    }
  })

  it('prints nothing to the console while Redis cannot be reached (errors reach the caller only)', async () => {
    const printed = vi.spyOn(console, 'error').mockImplementation(() => {})
    const store = new RedisStore({ url: `redis://127.0.0.1:${await freePort()}` })
    try {
      await expect(store.get('s', 'k')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
      await sleep(200)
      expect(printed.mock.calls.filter((call) => String(call[0]).includes('ioredis'))).toEqual([])
    } finally {
      await store.close()
      printed.mockRestore()
    }
  })

  it('connects as it is created, before its first command', async () => {
    const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: 6379 })
    const store = new RedisStore({ url: `redis://127.0.0.1:${proxy.port}` })
    try {
      await until(() => proxy.counts().accepted === 1, 2_000)
    } finally {
      await store.close()
      await proxy.close()
    }
  })

  it.skipIf(skip !== undefined)('reconnects within a fraction of a second when its connection is cut', async () => {
    const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: 6379 })
    const store = new RedisStore({ url: `redis://127.0.0.1:${proxy.port}`, prefix: `idemkey-test-${randomUUID()}` })
    try {
      expect(await store.get('s', 'k')).toBeNull()
      expect(proxy.cut()).toBe(1)
      await sleep(20)
      const started = performance.now()
      let answered = false
      while (!answered && performance.now() - started < 3_000)
        answered = await store.get('s', 'k').then(
          () => true,
          () => false,
        )
      expect(answered).toBe(true)
      // The first reconnect is 50 ms after the cut (retryStrategy): 800 ms leaves a loaded machine room and
      // still fails a strategy whose first retry waits its 1 s cap, or a client that backs off for seconds.
      expect(performance.now() - started).toBeLessThan(800)
    } finally {
      await store.close()
      await proxy.close()
    }
  })

  it('backs off between reconnect attempts while Redis is gone: a few a second, not a tight loop', async () => {
    const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: await freePort() })
    const store = new RedisStore({ url: `redis://127.0.0.1:${proxy.port}` })
    try {
      await sleep(1_500)
      // Waits of 50, 100, 150 ... ms: attempts at about 0, 50, 150, 300, 500, 750, 1050 and 1400 ms.
      const { accepted } = proxy.counts()
      expect(accepted).toBeGreaterThanOrEqual(4)
      expect(accepted).toBeLessThanOrEqual(20)
    } finally {
      await store.close()
      await proxy.close()
    }
  })
})

describe('RedisStore({ url }) without ioredis installed', () => {
  afterEach(() => {
    vi.doUnmock('ioredis')
    vi.resetModules()
  })

  it('answers INVALID_OPTION naming the package to install, with the import failure as cause', async () => {
    vi.resetModules()
    vi.doMock('ioredis', () => {
      throw new Error("Cannot find package 'ioredis'")
    })
    const { RedisStore: FreshStore } = await import('./index.js')
    const store = new FreshStore({ url: URL })
    const error = await store.get('s', 'k').catch((e: unknown) => e)
    expect(error).toMatchObject({ name: 'IdempotencyError', code: 'INVALID_OPTION' })
    expect((error as Error).message).toContain('npm install ioredis')
    expect((error as Error).cause).toBeInstanceOf(Error)
    await store.close()
  })
})
