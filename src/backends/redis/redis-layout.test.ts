import { createHash, randomUUID } from 'node:crypto'
import { connect, type Socket } from 'node:net'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { RedisStore, recordNames } from './index.js'
import { WATCH_MARKER } from './record.js'

// The packed record layout (docs/redis.md): what a new key writes and touches, when changes are
// published, and where steps live.
const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const outcome = (text: string, resourceId?: string) =>
  ({
    status: 'completed',
    response: { status: 201, headers: { 'content-type': 'application/json' }, body: new TextEncoder().encode(text) },
    ...(resourceId === undefined ? {} : { resourceId }),
  }) as const

/**
 * MONITOR on a plain socket: each command the server runs, as its arguments. (ioredis's own `monitor()` has
 * been seen to fail on a loaded machine with "Command queue state error" when a monitored line arrived
 * before it had taken MONITOR's reply.) Resolves once the server has answered MONITOR.
 */
function monitorCommands(onCommand: (args: string[]) => void): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(6379, '127.0.0.1', () => socket.write('MONITOR\r\n'))
    let buffered = ''
    let monitoring = false
    socket.setEncoding('utf8')
    socket.once('error', reject)
    socket.on('data', (chunk: string) => {
      buffered += chunk
      let end = buffered.indexOf('\r\n')
      while (end >= 0) {
        const line = buffered.slice(0, end)
        buffered = buffered.slice(end + 2)
        end = buffered.indexOf('\r\n')
        if (!monitoring) {
          if (line !== '+OK') return reject(new Error(`MONITOR answered ${line}`))
          monitoring = true
          resolve(socket)
          continue
        }
        // +1700000000.000000 [0 127.0.0.1:5000] "evalsha" "…" …: the quoted arguments, unescaped.
        const args = [...line.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((match) => (match[1] ?? '').replace(/\\(.)/g, '$1'))
        onCommand(args)
      }
    })
  })
}

describe.skipIf(skip)('RedisStore record layout', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  let store: RedisStore
  let redis: Redis
  let listener: Redis
  const messages: string[] = []
  beforeAll(async () => {
    store = new RedisStore({ url: URL, prefix })
    redis = new Redis(URL)
    listener = new Redis(URL)
    await listener.psubscribe(`${prefix}:n:*`)
    listener.on('pmessage', (_pattern, channel) => messages.push(channel))
  })
  afterAll(async () => {
    await store.close()
    await dropPrefix(URL, prefix)
    redis.disconnect()
    listener.disconnect()
  })
  const settle = () => new Promise((resolve) => setTimeout(resolve, 50))

  it('stores a new key as one string with its TTL, and touches no steps key', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
    expect(await redis.type(names.key)).toBe('string')
    const ttl = await redis.pttl(names.key)
    expect(ttl).toBeGreaterThan(24 * 3600_000) // lease + abandoned retention + grace
    expect(await redis.exists(names.steps)).toBe(0)
    expect(await store.complete(s, 'k', 1, outcome('{"id":1}', 'ch_é'), 5_000)).toBe(true)
    expect(await redis.pttl(names.key)).toBeLessThanOrEqual(65_000)
    const replay = await store.acquire(s, 'k', fp('a'), 60_000)
    expect(replay).toMatchObject({
      kind: 'replay',
      record: {
        status: 'completed',
        token: 1,
        resourceId: 'ch_é',
        response: { status: 201, headers: { 'content-type': 'application/json' } },
      },
    })
    expect(new TextDecoder().decode((replay as { record: { response: { body: Uint8Array } } }).record.response.body)).toBe('{"id":1}')
  })

  it('takes a new key with one plain SET NX: the value holds the lease as durations, read back as server-clock times', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    const [beforeS, beforeUs] = await redis.time()
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
    const [afterS, afterUs] = await redis.time()
    const raw = await redis.get(names.key)
    expect(raw).toMatch(/^ik100n\|60000\|86400000\|60000\|[0-9a-f]{64}/)
    const serverBefore = Number(beforeS) * 1000 + Math.floor(Number(beforeUs) / 1000)
    const serverAfter = Number(afterS) * 1000 + Math.floor(Number(afterUs) / 1000)
    const record = await store.get(s, 'k')
    expect(record).toMatchObject({ status: 'in_progress', token: 1, attempts: 1, fingerprint: fp('a') })
    expect(record?.createdAtMs).toBeGreaterThanOrEqual(serverBefore)
    expect(record?.createdAtMs).toBeLessThanOrEqual(serverAfter)
    expect(record?.lockedUntilMs).toBe((record?.createdAtMs as number) + 60_000)
    expect(record?.expiresAtMs).toBe((record?.createdAtMs as number) + 60_000 + 86_400_000)
    // Every script reads it as the record it stands for: a waiter, a renewal, the completion.
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({ kind: 'in_progress', lockedUntilMs: record?.lockedUntilMs })
    expect(await store.acquire(s, 'k', fp('b'), 60_000)).toEqual({ kind: 'mismatch' })
    expect(await store.renew(s, 'k', 2, 60_000)).toBe(false)
    expect(await store.renew(s, 'k', 1, 90_000)).toBe(true)
    expect((await store.get(s, 'k'))?.lockedUntilMs).toBeGreaterThan(record?.lockedUntilMs as number)
    expect(await redis.get(names.key)).toMatch(/^ik1[01]0p\|1\|/)
    expect(await store.complete(s, 'k', 1, outcome('{"id":2}'), 3_600_000)).toBe(true)
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toMatchObject({ kind: 'replay', record: { token: 1, status: 'completed' } })
  })

  it('completes a fresh record with its creation time from the key expiry, server-clock times, and fences out every other token', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    await store.acquire(s, 'k', fp('a'), 60_000)
    const fresh = await store.get(s, 'k')
    const untouched = await redis.getBuffer(names.key)
    expect(await store.complete(s, 'k', 2, outcome('{"id":5}'), 60_000)).toBe(false)
    expect(await store.complete(s, 'k', 0, outcome('{"id":5}'), 60_000)).toBe(false)
    expect(await redis.getBuffer(names.key)).toEqual(untouched)
    const [beforeS, beforeUs] = await redis.time()
    expect(await store.complete(s, 'k', 1, outcome('{"id":5}', 'r5'), 60_000)).toBe(true)
    const [afterS, afterUs] = await redis.time()
    const done = await store.get(s, 'k')
    expect(done).toMatchObject({ status: 'completed', token: 1, attempts: 1, resourceId: 'r5', createdAtMs: fresh?.createdAtMs })
    expect(done?.updatedAtMs).toBeGreaterThanOrEqual(Number(beforeS) * 1000 + Math.floor(Number(beforeUs) / 1000))
    expect(done?.updatedAtMs).toBeLessThanOrEqual(Number(afterS) * 1000 + Math.floor(Number(afterUs) / 1000))
    expect(done?.expiresAtMs).toBe((done?.updatedAtMs as number) + 60_000)
    const completed = await redis.getBuffer(names.key)
    expect(await store.complete(s, 'k', 1, outcome('again'), 60_000)).toBe(false)
    expect(await redis.getBuffer(names.key)).toEqual(completed)
  })

  it('answers a damaged fresh record with a fenced-out complete, and a foreign value with STORE_SCHEMA', async () => {
    const s = `s-${randomUUID()}`
    const damaged = recordNames(prefix, s, 'damaged').key
    const foreign = recordNames(prefix, s, 'foreign').key
    await redis.set(damaged, 'ik100n|x|1|1|', 'PX', 60_000)
    await redis.set(foreign, 'hello world', 'PX', 60_000)
    expect(await store.complete(s, 'damaged', 1, outcome('x'), 60_000)).toBe(false)
    expect(await redis.get(damaged)).toBe('ik100n|x|1|1|')
    await expect(store.complete(s, 'foreign', 1, outcome('x'), 60_000)).rejects.toMatchObject({ code: 'STORE_SCHEMA' })
  })

  it('replays a completed record far from its expiry from that SET alone, and leaves one near its expiry to the script', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    const near = recordNames(prefix, s, 'near')
    await store.acquire(s, 'k', fp('a'), 60_000)
    await store.complete(s, 'k', 1, outcome('{"id":3}'), 3_600_000)
    await store.acquire(s, 'near', fp('a'), 60_000)
    await store.complete(s, 'near', 1, outcome('{"id":4}'), 5_000)
    const seen: string[][] = []
    const monitor = await monitorCommands((args) => {
      if (args.includes(names.key) || args.includes(near.key)) seen.push(args)
    })
    try {
      expect(await store.acquire(s, 'k', fp('a'), 60_000)).toMatchObject({ kind: 'replay', record: { token: 1 } })
      expect(await store.acquire(s, 'k', fp('b'), 60_000)).toEqual({ kind: 'mismatch' })
      expect(await store.acquire(s, 'near', fp('a'), 60_000)).toMatchObject({ kind: 'replay', record: { token: 1 } })
      await settle()
    } finally {
      monitor.destroy()
    }
    const commands = (key: string) => seen.filter((args) => args.includes(key)).map((args) => args[0]?.toLowerCase())
    // (MONITOR also lists the commands a script runs, after its EVALSHA.)
    expect(commands(names.key)).toEqual(['set', 'set'])
    expect(commands(near.key).slice(0, 2)).toEqual(['set', 'evalsha'])
  })

  it('publishes a completion only when someone waits: after an in_progress answer, not before', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    await store.acquire(s, 'quiet', fp('a'), 60_000)
    await store.complete(s, 'quiet', 1, outcome('x'), 60_000)
    await store.acquire(s, 'k', fp('a'), 60_000)
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toMatchObject({ kind: 'in_progress' })
    await store.complete(s, 'k', 1, outcome('x'), 60_000)
    await settle()
    expect(messages).not.toContain(recordNames(prefix, s, 'quiet').channel)
    expect(messages.filter((channel) => channel === names.channel)).toHaveLength(1)
  })

  it('publishes a release to a watcher that came before the record existed', async () => {
    const s = `s-${randomUUID()}`
    let calls = 0
    const stop = store.watch(s, 'k', () => calls++)
    try {
      await new Promise<void>((resolve) => {
        const check = setInterval(() => {
          if (calls === 0) return
          clearInterval(check)
          resolve()
        }, 2)
      })
      expect(await redis.get(recordNames(prefix, s, 'k').key)).toBe(WATCH_MARKER)
      // The marker is no record: absent to get, list and evict; acquire grants token 1.
      expect(await store.get(s, 'k')).toBeNull()
      expect(await store.list({ scope: s })).toEqual([])
      expect(await store.evict(s, 'k')).toBe(false)
      expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
      const before = calls
      await store.release(s, 'k', 1)
      await settle()
      expect(calls).toBeGreaterThan(before)
      expect(messages).toContain(recordNames(prefix, s, 'k').channel)
    } finally {
      stop()
    }
  })

  /** How far apart the steps' TTL and the record's are, both read in one MULTI (no time passes between them). */
  const ttlGap = async (names: { key: string; steps: string }) => {
    const replies = (await redis.multi().pttl(names.steps).pttl(names.key).exec()) ?? []
    const [steps, key] = replies.map(([error, ttl]) => {
      if (error) throw error
      return ttl as number
    })
    return Math.abs((steps as number) - (key as number))
  }

  it('keeps steps in a hash beside the record with the same TTL, reads them on takeover, drops them on completion', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    await store.acquire(s, 'k', fp('a'), 100)
    expect(await store.recordStep(s, 'k', 1, 'charge', null)).toBe(true)
    expect(await store.recordStep(s, 'k', 1, 'charge', '{"id":7}')).toBe(true)
    expect(await redis.hgetall(names.steps)).toEqual({ '~charge': '{"id":7}' })
    expect(await ttlGap(names)).toBeLessThan(50)
    await new Promise((resolve) => setTimeout(resolve, 150))
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toEqual({
      kind: 'acquired',
      token: 2,
      steps: [{ name: 'charge', result: '{"id":7}' }],
    })
    expect(await redis.pttl(names.steps)).toBeGreaterThan(24 * 3600_000)
    expect(await store.renew(s, 'k', 2, 120_000)).toBe(true)
    expect(await ttlGap(names)).toBeLessThan(50)
    expect(await store.complete(s, 'k', 2, outcome('done'), 60_000)).toBe(true)
    expect(await redis.exists(names.steps)).toBe(0)
  })

  it('evicts and purges the steps with the record', async () => {
    const s = `s-${randomUUID()}`
    const names = recordNames(prefix, s, 'k')
    await store.acquire(s, 'k', fp('a'), 60_000)
    await store.recordStep(s, 'k', 1, 'charge', '{}')
    expect(await store.evict(s, 'k')).toBe(true)
    expect(await redis.exists(names.key, names.steps)).toBe(0)
  })
})
