import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { eventually } from '../../../test/helpers/eventually.js'
import { connectionsNamed, dropPrefix, subscribers } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { RedisStore, recordNames } from './index.js'
import { Notifier } from './notifier.js'

// Key names and prefixes (keys.ts), the SCAN behind list and purgeExpired (scan.ts) on a keyspace that
// takes several SCAN steps, and the wake-up subscriber (notifier.ts): several watchers of one record,
// stopping, closing, and the PING that finds a dead subscriber.
const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const outcome = { status: 'completed', response: { status: 200, headers: {}, body: new TextEncoder().encode('ok') } } as const
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** The first `bytes` of SHA-256 in base64url: how record names were always cut (the reference, not the fast path). */
const cut = (text: string, bytes: number) => createHash('sha256').update(text).digest().subarray(0, bytes).toString('base64url')

const until = (condition: () => boolean | Promise<boolean>, what: string, ms = 5_000) => eventually(condition, what, ms, 5)

/** The addresses of the connections named `name` (the store's client and its subscriber share the name). */
const addressesNamed = async (redis: Redis, name: string) => (await connectionsNamed(redis, name)).map((c) => c.addr)

/**
 * A MONITOR connection. ioredis reports a "Command queue state error" for monitored commands that come
 * in the same read as MONITOR's OK (a busy shared server): open another then.
 */
async function openMonitor(redis: Redis): Promise<Redis> {
  for (let attempt = 1; ; attempt++) {
    const monitor = redis.duplicate({ monitor: true, lazyConnect: false })
    let failed: unknown
    // ioredis emits such an error for each line of that read: a listener for good, or the next one throws.
    monitor.on('error', (error: unknown) => {
      failed ??= error
    })
    await new Promise<void>((resolve) => {
      monitor.once('monitoring', () => resolve())
      monitor.once('error', () => resolve())
    })
    if (failed === undefined) return monitor
    monitor.disconnect()
    if (attempt === 5) throw failed
  }
}

describe('record names', () => {
  it('names a record by SHA-256 digests of its scope and key, byte for byte as ever, past a thousand scopes', () => {
    const odd = ['', '{', '}', '*', ':', 'a:b', '{x}', 'é', '🙂', ' ', '\\', '[a]']
    for (let i = 0; i < 1_500; i++) {
      const scope = `scope-${i}${odd[i % odd.length]}`
      const key = `${odd[(i * 7) % odd.length]}key-${randomUUID()}`
      const tag = cut(`${scope}\n${key}`, 16)
      const names = recordNames('pre', scope, key)
      expect(names).toEqual({
        key: `pre:r:${cut(scope, 9)}:{${tag}}`,
        channel: `pre:n:{${tag}}`,
        steps: `pre:t:{${tag}}`,
      })
      expect(tag).toHaveLength(22)
    }
    // Asked again after the scope cache was cleared and refilled: the same names.
    expect(recordNames('pre', 'scope-1{', 'k').key).toBe(`pre:r:${cut('scope-1{', 9)}:{${cut('scope-1{\nk', 16)}}`)
  })

  it('accepts prefixes of 1-64 plain characters and refuses any other with INVALID_OPTION naming the prefix', () => {
    const client = new Redis({ lazyConnect: true })
    try {
      for (const prefix of ['a', 'x'.repeat(64), 'Az_.:-09']) {
        expect(new RedisStore({ client, prefix }).prefix).toBe(prefix)
      }
      for (const prefix of ['', 'x'.repeat(65), 'a{b', 'a}b', 'a*', 'a?', 'a[b]', 'a b', 'é', 'a\n', 42]) {
        const expected = `RedisStore prefix must be 1-64 characters of A-Z a-z 0-9 _ . : -, got ${JSON.stringify(prefix)}.`
        expect(() => new RedisStore({ client, prefix: prefix as string })).toThrow(
          expect.objectContaining({ name: 'IdempotencyError', code: 'INVALID_OPTION', message: expected }),
        )
      }
    } finally {
      client.disconnect()
    }
  })
})

/**
 * A database of its own (no other test uses 9): how SCAN splits the keyspace into steps depends on every
 * key in the database, and the suites running beside this one fill database 0 with thousands. There, the
 * 80 records could spread over so many steps that none but the last held three.
 */
const SCAN_URL = `${URL}/9`

describe.skipIf(skip !== undefined)('RedisStore list and purgeExpired over a keyspace of several SCAN steps', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  const scope = `s-${randomUUID()}`
  const keys = Array.from({ length: 80 }, (_, i) => `k${i}`)
  const byName = new Map(keys.map((key) => [recordNames(prefix, scope, key).key, key]))
  let redis: Redis
  let store: RedisStore
  /** This prefix's records in the order SCAN (COUNT 1000, as the store asks) meets them, one array per step. */
  let steps: string[][]

  beforeAll(async () => {
    redis = new Redis(SCAN_URL)
    // Keys that are no records make sure SCAN needs several steps whatever else the server holds.
    const filler = redis.pipeline()
    for (let i = 0; i < 1_500; i++) filler.set(`${prefix}:filler:${i}`, 'x', 'PX', 600_000)
    await filler.exec()
    store = new RedisStore({ url: SCAN_URL, prefix })
    for (const key of keys) await store.acquire(scope, key, fp('a'), 600_000)
    await sleep(200) // let a resize of the keyspace settle, so SCAN's order stays put
    steps = []
    let cursor = '0'
    do {
      const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}:r:*`, 'COUNT', 1000)
      steps.push(found.map((name) => byName.get(name) as string))
      cursor = next
    } while (cursor !== '0')
  })
  afterAll(async () => {
    await store?.close()
    await dropPrefix(SCAN_URL, prefix)
    redis?.disconnect()
  })

  it('lists every record of a scope, in whichever SCAN step it is', async () => {
    expect(steps.filter((step) => step.length > 0).length).toBeGreaterThanOrEqual(2)
    const listed = await store.list({ scope, limit: 1_000 })
    expect(listed.map((record) => record.key).sort()).toEqual([...keys].sort())
  })

  it('reads at most listScanLimit records, and stops scanning once it has them', async () => {
    const limited = new RedisStore({ url: SCAN_URL, prefix, listScanLimit: 5 })
    const monitor = await openMonitor(redis)
    const pattern = `${prefix}:r:${cut(scope, 9)}:*`
    let scans = 0
    monitor.on('monitor', (_time: string, args: string[]) => {
      if (args[0]?.toLowerCase() === 'scan' && args.includes(pattern)) scans++
    })
    try {
      expect(await limited.list({ scope, limit: 1_000 })).toHaveLength(5)
      const one = new RedisStore({ url: SCAN_URL, prefix, listScanLimit: 1 })
      try {
        scans = 0
        expect(await one.list({ scope })).toHaveLength(1)
        await sleep(50)
        // The first step that holds a record is enough; the keyspace takes more.
        const firstWithRecord = steps.findIndex((step) => step.length > 0)
        expect(firstWithRecord).toBeLessThan(steps.length - 1)
        expect(scans).toBeGreaterThanOrEqual(1)
        expect(scans).toBeLessThan(steps.length)
      } finally {
        await one.close()
      }
    } finally {
      monitor.disconnect()
      await limited.close()
    }
  })

  it('purges an expired record in a later SCAN step in one call, and resumes a bounded purge where it stopped', async () => {
    const expire = async (key: string) => {
      await store.complete(scope, key, 1, outcome, 1)
      await sleep(5)
    }
    const nonEmpty = steps.filter((step) => step.length > 0)
    const last = nonEmpty[nonEmpty.length - 1] as string[]
    // One call walks the whole keyspace for an expired record in its last step.
    const lastKey = last[last.length - 1] as string
    await expire(lastKey)
    const name = `ik-${randomUUID()}`
    const fresh = new RedisStore({ url: `${SCAN_URL}?connectionName=${name}`, prefix })
    const monitor = await openMonitor(redis)
    const sent: { source: string; args: string[] }[] = []
    monitor.on('monitor', (_time: string, args: string[], source: string) => sent.push({ source, args }))
    try {
      expect(await fresh.purgeExpired(1_000)).toBe(1)
      await sleep(50)
      // Every key the purge named lies under the store's prefix.
      const ours = new Set(await addressesNamed(redis, name))
      const scripts = sent.filter(({ source, args }) => ours.has(source) && /^eval/i.test(args[0] as string))
      expect(scripts.length).toBeGreaterThanOrEqual(keys.length)
      for (const { args } of scripts) {
        for (const key of args.slice(3, 3 + Number(args[2]))) expect(key.startsWith(`${prefix}:`)).toBe(true)
      }
    } finally {
      monitor.disconnect()
      await fresh.close()
    }
    expect(await store.get(scope, lastKey)).toBeNull()

    // Two expired records side by side in one step, one more in a later step.
    const bounded = new RedisStore({ url: SCAN_URL, prefix })
    try {
      const at = nonEmpty.findIndex((step, i) => step.length >= 3 && i < nonEmpty.length - 1)
      expect(at).toBeGreaterThanOrEqual(0)
      const [first, second] = nonEmpty[at] as [string, string]
      const later = (nonEmpty[at + 1] as string[]).find((key) => key !== lastKey) ?? (nonEmpty[at + 1] as string[])[0]
      await expire(first)
      await expire(second)
      expect(await bounded.purgeExpired(1)).toBe(1)
      // The rest of that step was put back: the next call takes the second from there.
      expect(await bounded.purgeExpired(1)).toBe(1)
      await expire(later as string)
      // What is put back holds no expired record: the call scans on and finds the later one.
      expect(await bounded.purgeExpired(1)).toBe(1)
      expect(await bounded.purgeExpired(1_000)).toBe(0)
      for (const key of [first, second, later as string]) expect(await store.get(scope, key)).toBeNull()
      expect(await store.list({ scope, limit: 1_000 })).toHaveLength(keys.length - 4)
    } finally {
      await bounded.close()
    }
  })
})

describe.skipIf(skip !== undefined)('RedisStore wake-ups: watchers, stopping and closing', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  let redis: Redis
  beforeAll(() => {
    redis = new Redis(URL)
  })
  afterAll(async () => {
    await dropPrefix(URL, prefix)
    redis?.disconnect()
  })

  /** A store on its own named connections, opened. */
  async function openStore(name: string, options: { socketTimeout?: string } = {}) {
    const store = new RedisStore({ url: `${URL}/?connectionName=${name}`, prefix, ...options })
    // (Once more if a short socketTimeout dropped the first answer on a busy host.)
    await store.get('s', 'open').catch(() => store.get('s', 'open'))
    return store
  }
  /** A change the scripts announce: the record is created and evicted. */
  async function change(store: RedisStore, s: string, key: string) {
    await store.acquire(s, key, fp('a'), 60_000)
    expect(await store.evict(s, key)).toBe(true)
  }

  it('wakes every watcher of a record, and the others still once one stops', async () => {
    const store = await openStore(`ik-${randomUUID()}`)
    try {
      const s = `s-${randomUUID()}`
      const channel = recordNames(prefix, s, 'k').channel
      const calls = { first: 0, second: 0 }
      const stopFirst = store.watch(s, 'k', () => calls.first++)
      const stopSecond = store.watch(s, 'k', () => calls.second++)
      await until(() => calls.first > 0 && calls.second > 0, 'both "may have changed" calls')
      let before = { ...calls }
      await change(store, s, 'k')
      await until(() => calls.first > before.first && calls.second > before.second, 'both watchers woken')
      stopFirst()
      before = { ...calls }
      await change(store, s, 'k')
      await until(() => calls.second > before.second, 'the second watcher woken')
      await sleep(50)
      expect(calls.first).toBe(before.first)
      expect(await subscribers(redis, channel)).toBe(1)
      stopSecond()
      await until(async () => (await subscribers(redis, channel)) === 0, 'the unsubscribe')
      before = { ...calls }
      await change(store, s, 'k')
      await sleep(100)
      expect(calls).toEqual(before)
    } finally {
      await store.close()
    }
  })

  it('subscribes afresh for a watcher that comes after the last one stopped, even if an old stop is called again', async () => {
    const store = await openStore(`ik-${randomUUID()}`)
    try {
      const s = `s-${randomUUID()}`
      let first = 0
      const stopFirst = store.watch(s, 'k', () => first++)
      await until(() => first > 0, 'the first "may have changed" call')
      stopFirst()
      let second = 0
      const stopSecond = store.watch(s, 'k', () => second++)
      await until(() => second > 0, 'the second watcher\'s own "may have changed" call')
      stopFirst() // a stop called twice leaves the later watcher alone
      const before = second
      await change(store, s, 'k')
      await until(() => second > before, 'the second watcher woken')
      expect(await subscribers(redis, recordNames(prefix, s, 'k').channel)).toBe(1)
      stopSecond()
    } finally {
      await store.close()
    }
  })

  it("ignores a message that arrives after its record's last watcher stopped", async () => {
    const store = await openStore(`ik-${randomUUID()}`)
    try {
      const s = `s-${randomUUID()}`
      let calls = 0
      const stop = store.watch(s, 'gone', () => calls++)
      await until(() => calls > 0, 'the "may have changed" call')
      // Published before the stop's UNSUBSCRIBE reaches the server: the subscriber still gets it.
      const published = redis.publish(recordNames(prefix, s, 'gone').channel, '1')
      stop()
      expect(await published).toBe(1)
      await sleep(100)
      expect(calls).toBe(1)
      // The subscriber still wakes other watchers.
      let other = 0
      const stopOther = store.watch(s, 'other', () => other++)
      await until(() => other > 0, 'the other "may have changed" call')
      await change(store, s, 'other')
      await until(() => other > 1, 'the other watcher woken')
      stopOther()
    } finally {
      await store.close()
    }
  })

  it('PINGs the subscriber once per socketTimeout while anyone waits, and stops when nobody does', async () => {
    const name = `ik-${randomUUID()}`
    const store = await openStore(name, { socketTimeout: '250ms' })
    const monitor = await openMonitor(redis)
    const pings: string[] = []
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (args[0]?.toLowerCase() === 'ping') pings.push(source)
    })
    try {
      const s = `s-${randomUUID()}`
      const stops = ['a', 'b', 'c', 'd'].map((key) => store.watch(s, key, () => {}))
      await sleep(1_500)
      const ours = new Set(await addressesNamed(redis, name))
      const count = () => pings.filter((source) => ours.has(source)).length
      // About 6 in 1.5 s: one PING per interval, whatever the number of watchers.
      expect(count()).toBeGreaterThanOrEqual(2)
      expect(count()).toBeLessThanOrEqual(9)
      for (const stop of stops) stop()
      await sleep(400)
      const after = count()
      await sleep(700)
      expect(count()).toBe(after)
    } finally {
      monitor.disconnect()
      await store.close()
    }
  })

  it('sends no PING on the subscriber of your own client (its socketTimeout is yours to set)', async () => {
    const name = `ik-${randomUUID()}`
    const client = new Redis(`${URL}/?connectionName=${name}`)
    const store = new RedisStore({ client, prefix })
    const monitor = await openMonitor(redis)
    const pings: string[] = []
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (args[0]?.toLowerCase() === 'ping') pings.push(source)
    })
    try {
      await store.get('s', 'open')
      const s = `s-${randomUUID()}`
      let calls = 0
      const stop = store.watch(s, 'k', () => calls++)
      await until(() => calls > 0, 'the "may have changed" call')
      await sleep(300)
      const ours = new Set(await addressesNamed(redis, name))
      expect(ours.size).toBe(2)
      expect(pings.filter((source) => ours.has(source))).toEqual([])
      stop()
    } finally {
      monitor.disconnect()
      await store.close()
      client.disconnect()
    }
  })

  it('closes its subscriber connection on close, also when closed twice at once', async () => {
    const name = `ik-${randomUUID()}`
    const store = await openStore(name)
    const s = `s-${randomUUID()}`
    let calls = 0
    store.watch(s, 'k', () => calls++)
    await until(() => calls > 0, 'the "may have changed" call')
    expect(await subscribers(redis, recordNames(prefix, s, 'k').channel)).toBe(1)
    await Promise.all([store.close(), store.close()])
    await until(async () => (await addressesNamed(redis, name)).length === 0, "the store's connections closed")
    expect(await subscribers(redis, recordNames(prefix, s, 'k').channel)).toBe(0)
  })

  it("closes a subscriber that is reconnecting, with your client's offline queue off, instead of leaving it to reconnect", async () => {
    const name = `ik-${randomUUID()}`
    const client = new Redis(`${URL}/?connectionName=${name}`, { enableOfflineQueue: false, retryStrategy: () => 300 })
    client.on('error', () => {})
    const store = new RedisStore({ client, prefix })
    try {
      await until(() => client.status === 'ready', 'the client ready')
      const s = `s-${randomUUID()}`
      // The first watch opens the subscriber (its SUBSCRIBE, sent while it connects, is refused: that waiter polls).
      const stopEarly = store.watch(s, 'early', () => {})
      await until(async () => (await addressesNamed(redis, name)).length === 2, 'the subscriber connected')
      // A SUBSCRIBE sent before the subscriber is ready is refused too (no offline queue; that waiter
      // polls): on a loaded host the connection can show before it is ready, so watch until one holds.
      let stop = () => {}
      let channel = ''
      for (let attempt = 0; attempt < 20; attempt++) {
        let calls = 0
        stop = store.watch(s, `k${attempt}`, () => calls++)
        await until(() => calls > 0, 'the "may have changed" call')
        channel = recordNames(prefix, s, `k${attempt}`).channel
        if ((await subscribers(redis, channel)) === 1) break
        stop()
        await sleep(50)
      }
      expect(await subscribers(redis, channel)).toBe(1)
      // The subscriber's connection drops; ioredis would reconnect it in 300 ms and subscribe again.
      const list = (await redis.client('LIST')) as string
      // sub=1, or sub=2 when the early watch's SUBSCRIBE reached a subscriber that was already connected.
      const line = list.split('\n').find((entry) => entry.includes(` name=${name} `) && / sub=[1-9]\d* /.test(entry)) as string
      await redis.client('KILL', 'ID', /id=(\d+)/.exec(line)?.[1] as string)
      await sleep(50)
      await store.close() // its QUIT is refused (no offline queue): the store disconnects it instead
      await sleep(600)
      expect(await subscribers(redis, channel)).toBe(0)
      expect(await addressesNamed(redis, name)).toHaveLength(1)
      stop()
      stopEarly()
    } finally {
      client.disconnect()
    }
  })

  /** A store on your named client, its subscriber open (one watcher called): what the two tests below close. */
  async function watchingOnYourClient() {
    const name = `ik-${randomUUID()}`
    const client = new Redis(`${URL}/?connectionName=${name}`)
    const store = new RedisStore({ client, prefix })
    const s = `s-${randomUUID()}`
    let calls = 0
    store.watch(s, 'k', () => calls++)
    await until(() => calls > 0, 'the "may have changed" call')
    return { name, client, store, s }
  }

  it('opens no subscriber for a watcher that comes after the store closed, on your client', async () => {
    const { name, client, store, s } = await watchingOnYourClient()
    try {
      await store.close()
      await until(async () => (await addressesNamed(redis, name)).length === 1, 'the subscriber closed')
      let late = 0
      const stop = store.watch(s, 'late', () => late++)
      await sleep(200)
      expect(late).toBe(0)
      expect(await subscribers(redis, recordNames(prefix, s, 'late').channel)).toBe(0)
      expect(await addressesNamed(redis, name)).toHaveLength(1)
      // Your client still works after the store closed: close() leaves it open.
      expect(await client.ping()).toBe('PONG')
      stop()
    } finally {
      client.disconnect()
    }
  })

  it('opens no subscriber for a watcher that comes while the store closes', async () => {
    const { name, client, store, s } = await watchingOnYourClient()
    try {
      const closing = store.close()
      let late = 0
      const stop = store.watch(s, 'late', () => late++)
      await closing
      await sleep(200)
      expect(late).toBe(0)
      expect(await subscribers(redis, recordNames(prefix, s, 'late').channel)).toBe(0)
      // Only the client remains; the store's subscriber is gone.
      expect(await addressesNamed(redis, name)).toHaveLength(1)
      stop()
    } finally {
      client.disconnect()
    }
  })
})

describe.skipIf(skip !== undefined)('Notifier', () => {
  it('calls a watcher given no flag once its subscription is in place', async () => {
    const client = new Redis(URL)
    const notifier = new Notifier(client as never)
    try {
      let calls = 0
      const stop = notifier.watch(`idemkey-test-${randomUUID()}:n:{x}`, () => calls++)
      await until(() => calls > 0, 'the "may have changed" call')
      stop()
    } finally {
      await notifier.close()
      client.disconnect()
    }
  })
})
