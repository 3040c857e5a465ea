import { createHash, randomUUID } from 'node:crypto'
import { RedisStore } from '../src/backends/redis/index.js'
import { freePort, RedisServer, tempDir } from './fixtures/redis/servers.js'

const fp = (label: string) => createHash('sha256').update(label).digest('hex')
const RECORDS = 50

/** A body per record with every byte value, so a replay proves the bytes survived. */
const bodyOf = (i: number) => Uint8Array.from({ length: 300 }, (_, j) => (i + j) % 256)

/** Completes RECORDS records, crashes the server (SIGKILL), restarts it on the same files; returns the store. */
async function completeCrashRestart(server: RedisServer, scope: string): Promise<RedisStore> {
  const store = new RedisStore({ url: server.url })
  for (let i = 0; i < RECORDS; i++) {
    const { token } = (await store.acquire(scope, `k${i}`, fp('a'), 60_000)) as { token: number }
    const done = await store.complete(
      scope,
      `k${i}`,
      token,
      { status: 'completed', response: { status: 201, headers: {}, body: bodyOf(i) } },
      3_600_000,
    )
    expect(done).toBe(true)
  }
  await server.stop('SIGKILL')
  await server.start()
  return store
}

/** The first answer after the restart (the store's client reconnects by itself). */
async function acquireAfterRestart(store: RedisStore, scope: string, key: string) {
  for (let i = 0; ; i++) {
    try {
      return await store.acquire(scope, key, fp('a'), 60_000)
    } catch (error) {
      if (i > 100) throw error
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
}

describe('RedisStore durability across a Redis crash', () => {
  it('replays every completed record byte for byte after a SIGKILL with appendonly yes, appendfsync always', async () => {
    const dir = tempDir('aof')
    const server = new RedisServer(await freePort(), dir.path, ['--appendonly', 'yes', '--appendfsync', 'always'])
    await server.start()
    const scope = `aof-${randomUUID()}`
    const store = await completeCrashRestart(server, scope)
    try {
      for (let i = 0; i < RECORDS; i++) {
        const result = await acquireAfterRestart(store, scope, `k${i}`)
        expect(result.kind, `k${i}`).toBe('replay')
        if (result.kind === 'replay') expect(Buffer.from(result.record.response?.body as Uint8Array)).toEqual(Buffer.from(bodyOf(i)))
      }
    } finally {
      await store.close()
      await server.stop()
      dir.remove()
    }
  })

  it('forgets completed records after a SIGKILL without persistence (what docs/redis.md warns about)', async () => {
    const dir = tempDir('no-aof')
    const server = new RedisServer(await freePort(), dir.path, ['--appendonly', 'no'])
    await server.start()
    const scope = `volatile-${randomUUID()}`
    const store = await completeCrashRestart(server, scope)
    try {
      // The key is granted afresh: a retry would run the operation a second time.
      expect(await acquireAfterRestart(store, scope, 'k0')).toEqual({ kind: 'acquired', token: 1 })
    } finally {
      await store.close()
      await server.stop()
      dir.remove()
    }
  })
})
