import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { RedisStore } from '../src/backends/redis/index.js'
import { freePort, RedisServer, tempDir } from './fixtures/redis/servers.js'

// RedisStore on a redis-server of its own, which this file flushes and kills: scripts reloaded after
// SCRIPT FLUSH, STORE_UNAVAILABLE while the server is down, service again once it is back.
const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const outcome = (text: string) =>
  ({ status: 'completed', response: { status: 201, headers: {}, body: new TextEncoder().encode(text) } }) as const

describe('RedisStore on a Redis of its own (SCRIPT FLUSH, restarts)', () => {
  const dir = tempDir('errors')
  let server: RedisServer
  let store: RedisStore
  let admin: Redis
  beforeAll(async () => {
    server = new RedisServer(await freePort(), dir.path, ['--appendonly', 'no'])
    await server.start()
    store = new RedisStore({ url: server.url })
    admin = new Redis(server.port, '127.0.0.1')
    admin.on('error', () => {}) // it sees the restart too
  })
  afterAll(async () => {
    await store?.close()
    admin?.disconnect()
    await server?.stop()
    dir.remove()
  })

  it('loads its scripts again after SCRIPT FLUSH and keeps every answer right', async () => {
    const s = `s-${randomUUID()}`
    const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
    await admin.script('FLUSH')
    expect(await store.acquire(s, 'k', fp('a'), 60_000)).toMatchObject({ kind: 'in_progress' })
    await admin.script('FLUSH')
    expect(await store.complete(s, 'k', token, outcome('done'), 60_000)).toBe(true)
    await admin.script('FLUSH')
    const replay = await store.acquire(s, 'k', fp('a'), 60_000)
    expect(replay.kind).toBe('replay')
    if (replay.kind === 'replay') expect(new TextDecoder().decode(replay.record.response?.body)).toBe('done')
  })

  it('runs 200 parallel acquires of one key right after SCRIPT FLUSH with exactly one winner', async () => {
    const s = `s-${randomUUID()}`
    await admin.script('FLUSH')
    const results = await Promise.all(Array.from({ length: 200 }, () => store.acquire(s, 'race', fp('a'), 60_000)))
    expect(results.filter((r) => r.kind === 'acquired')).toEqual([{ kind: 'acquired', token: 1 }])
  })

  it('answers STORE_UNAVAILABLE while Redis is down and serves again once it is back', async () => {
    const s = `s-${randomUUID()}`
    expect((await store.acquire(s, 'before', fp('a'), 60_000)).kind).toBe('acquired')
    await server.stop('SIGKILL')
    await expect(store.acquire(s, 'during', fp('a'), 60_000)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    await server.start()
    let result: unknown
    for (let i = 0; i < 100 && result === undefined; i++) {
      result = await store.acquire(s, 'after', fp('a'), 60_000).catch(() => new Promise((r) => setTimeout(r, 100)))
    }
    expect(result).toEqual({ kind: 'acquired', token: 1 })
  })
})
