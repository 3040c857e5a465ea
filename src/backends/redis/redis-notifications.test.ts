import { createHash, randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { Ledger } from '../../core/ledger.js'
import { RedisStore } from './index.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const fp = (label: string) => createHash('sha256').update(label).digest('hex')

/** Resolves when `count()` passes `from`; rejects after 5 s. */
function changed(count: () => number, from: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const started = Date.now()
    const check = setInterval(() => {
      if (count() > from) {
        clearInterval(check)
        resolve()
      } else if (Date.now() - started > 5_000) {
        clearInterval(check)
        reject(new Error('no notification within 5 s'))
      }
    }, 2)
  })
}

describe.skipIf(skip !== undefined)('RedisStore wake-ups', () => {
  const prefix = `idemkey-test-${randomUUID()}`
  afterAll(async () => {
    const redis = new Redis(URL)
    const keys = await redis.keys(`${prefix}:*`)
    if (keys.length > 0) await redis.del(...keys)
    redis.disconnect()
  })

  for (const notifications of [true, false]) {
    it(`lets a caller that waited on a running key replay its outcome (notifications: ${notifications})`, async () => {
      const store = new RedisStore({ url: URL, prefix, notifications })
      const ledger = new Ledger({ store, wait: '10s' })
      try {
        const intent = { key: `k-${randomUUID()}`, payload: { n: 1 } }
        let release!: () => void
        const gate = new Promise<void>((resolve) => {
          release = resolve
        })
        let runs = 0
        const first = ledger.run(intent, async () => {
          runs++
          await gate
          return { charged: 1 }
        })
        while (runs === 0) await new Promise((resolve) => setTimeout(resolve, 5))
        const second = ledger.run(intent, () => {
          runs++
          return { charged: 2 }
        })
        await new Promise((resolve) => setTimeout(resolve, 50))
        release()
        expect(await first).toMatchObject({ kind: 'executed', outcome: 'completed', value: { charged: 1 } })
        expect(await second).toMatchObject({ kind: 'replayed', value: { charged: 1 } })
        expect(runs).toBe(1)
      } finally {
        await store.close()
      }
    })
  }

  it('notifies watchers when a record is evicted, and no more once they unsubscribe', async () => {
    const store = new RedisStore({ url: URL, prefix })
    try {
      const s = `s-${randomUUID()}`
      await store.acquire(s, 'k', fp('a'), 60_000)
      let calls = 0
      const stop = store.watch(s, 'k', () => calls++)
      await changed(() => calls, 0) // the "may have changed" call once the subscription is in place
      const before = calls
      expect(await store.evict(s, 'k')).toBe(true)
      await changed(() => calls, before)
      stop()
      const after = calls
      const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
      await store.release(s, 'k', token)
      await new Promise((resolve) => setTimeout(resolve, 100))
      expect(calls).toBe(after)
    } finally {
      await store.close()
    }
  })

  it('watch is a no-op with notifications: false (waiters poll)', async () => {
    const store = new RedisStore({ url: URL, prefix, notifications: false })
    try {
      const s = `s-${randomUUID()}`
      const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
      let calls = 0
      const stop = store.watch(s, 'k', () => calls++)
      await store.release(s, 'k', token)
      await new Promise((resolve) => setTimeout(resolve, 100))
      stop()
      expect(calls).toBe(0)
    } finally {
      await store.close()
    }
  })
})
