import { randomUUID } from 'node:crypto'
import { drive } from '../../test/helpers/manual-clock.js'
import { TxMemoryStore } from '../../test/helpers/tx-memory-store.js'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { isIdempotencyError } from '../errors.js'
import { ManualClock } from './clock.js'
import { fingerprintOf } from './fingerprint.js'
import { Ledger, type LedgerEvent } from './ledger.js'
import type { IdempotencyStore, StoredResponse } from './store.js'

const key = () => `k-${randomUUID()}`

/** Resolves once `clock` has `n` sleepers, so a test moves time only after the code under test waits. */
async function sleepers(clock: ManualClock, n = 1): Promise<void> {
  for (let i = 0; i < 1_000 && clock.pendingSleeps < n; i++) await new Promise((r) => setImmediate(r))
  expect(clock.pendingSleeps).toBeGreaterThanOrEqual(n)
}

function setup(options: { wait?: number } = {}) {
  const clock = new ManualClock()
  const store = new MemoryStore({ clock })
  const events: LedgerEvent[] = []
  const ledger = new Ledger({ store, clock, lease: '30s', ttl: '1h', wait: options.wait ?? 0, onEvent: (e) => events.push(e) })
  return { clock, store, ledger, events }
}

describe('Ledger.run', () => {
  it('executes the work once and replays its value for the same key and payload', async () => {
    const { ledger } = setup()
    const k = key()
    let runs = 0
    const first = await ledger.run({ key: k, payload: { amount: 5 } }, () => ({ charge: ++runs }))
    const second = await ledger.run({ key: k, payload: { amount: 5 } }, () => ({ charge: ++runs }))
    expect(first).toMatchObject({ kind: 'executed', value: { charge: 1 }, outcome: 'completed', token: 1 })
    expect(second).toMatchObject({ kind: 'replayed', value: { charge: 1 } })
    expect(runs).toBe(1)
  })

  it('treats the same payload with keys in another order as the same intent', async () => {
    const { ledger } = setup()
    const k = key()
    await ledger.run({ key: k, payload: { a: 1, b: [1, 2] } }, () => 'x')
    expect((await ledger.run({ key: k, payload: { b: [1, 2], a: 1 } }, () => 'y')).kind).toBe('replayed')
  })

  it('answers mismatch for the same key with another payload, without running the work', async () => {
    const { ledger } = setup()
    const k = key()
    await ledger.run({ key: k, payload: { amount: 5 } }, () => 'ok')
    let ran = false
    const result = await ledger.run({ key: k, payload: { amount: 6 } }, () => {
      ran = true
    })
    expect(result).toEqual({ kind: 'mismatch', scope: 'default', key: k })
    expect(ran).toBe(false)
  })

  it('keeps scopes apart', async () => {
    const { ledger } = setup()
    const k = key()
    await ledger.run({ key: k, scope: 'tenant-a' }, () => 'a')
    expect(await ledger.run({ key: k, scope: 'tenant-b' }, () => 'b')).toMatchObject({ kind: 'executed', value: 'b' })
  })

  it('releases the record when the work throws, rethrows, and runs the next retry afresh', async () => {
    const { ledger, events } = setup()
    const k = key()
    await expect(
      ledger.run({ key: k }, () => {
        throw new Error('boom')
      }),
    ).rejects.toThrow('boom')
    expect(events.map((e) => e.type)).toContain('released')
    expect(await ledger.run({ key: k }, () => 'second')).toMatchObject({ kind: 'executed', value: 'second', token: 2 })
  })

  it('releases a transient outcome (5xx, 409, 429) and stores a final one (4xx)', async () => {
    const { ledger } = setup()
    const encode = (status: number): StoredResponse => ({ status, headers: {}, body: new Uint8Array() })
    for (const status of [500, 503, 401, 408, 409, 425, 429]) {
      const k = key()
      const result = await ledger.run({ key: k }, () => status, { encode })
      expect(result).toMatchObject({ kind: 'executed', outcome: 'released' })
      expect((await ledger.run({ key: k }, () => 201, { encode })).kind).toBe('executed')
    }
    for (const status of [400, 404, 422]) {
      const k = key()
      expect(await ledger.run({ key: k }, () => status, { encode })).toMatchObject({ kind: 'executed', outcome: 'failed' })
      expect(await ledger.run({ key: k }, () => 201, { encode, decode: (r) => r.status })).toMatchObject({
        kind: 'replayed',
        value: status,
      })
    }
  })

  it('follows a custom classification', async () => {
    const { ledger } = setup()
    const k = key()
    const result = await ledger.run({ key: k }, () => ({ ok: false }), { classify: (v) => (v.ok ? 'completed' : 'transient') })
    expect(result).toMatchObject({ outcome: 'released' })
  })

  it('stores the resource id with the record', async () => {
    const { ledger, store } = setup()
    const k = key()
    await ledger.run({ key: k }, () => ({ id: 'ord_1' }), { resourceId: (v) => v.id })
    expect((await store.get('default', k))?.resourceId).toBe('ord_1')
  })

  it('answers in_progress with a retry hint when another holder runs and there is no wait', async () => {
    const { ledger, clock } = setup({ wait: 0 })
    const k = key()
    let finish: () => void = () => {}
    const running = ledger.run({ key: k }, () => new Promise<string>((resolve) => (finish = () => resolve('done'))))
    await sleepers(clock) // the renewal loop sleeps: the work is running
    const second = await ledger.run({ key: k }, () => 'never')
    // A short hint (the retry waits on the store again), not the lease's end 30 s away.
    expect(second).toMatchObject({ kind: 'in_progress', retryAfterMs: 2_000 })
    finish()
    await running
  })

  it('waits for an in-flight holder and replays its outcome once it completes (woken by the store)', async () => {
    const { ledger, clock } = setup({ wait: 10_000 })
    const k = key()
    let finish: () => void = () => {}
    let runs = 0
    const work = () =>
      new Promise<number>((resolve) => {
        runs++
        finish = () => resolve(42)
      })
    const first = ledger.run({ key: k }, work)
    await sleepers(clock, 1)
    const second = ledger.run({ key: k }, work)
    await sleepers(clock, 2) // the waiter sleeps on its poll interval
    finish()
    // No clock movement: only the store's notification can wake the waiter.
    expect(await second).toMatchObject({ kind: 'replayed', value: 42 })
    expect(await first).toMatchObject({ kind: 'executed', value: 42 })
    expect(runs).toBe(1)
  })

  it('polls when the store has no notifications, and acquires a released record', async () => {
    const clock = new ManualClock()
    const memory = new MemoryStore({ clock })
    // The same store without watch(): the ledger must fall back to polling.
    const store: IdempotencyStore = {
      name: 'memory-without-watch',
      serverClock: false,
      acquire: (...a) => memory.acquire(...a),
      renew: (...a) => memory.renew(...a),
      complete: (...a) => memory.complete(...a),
      release: (...a) => memory.release(...a),
      get: (...a) => memory.get(...a),
      list: (...a) => memory.list(...a),
      purgeExpired: (...a) => memory.purgeExpired(...a),
      evict: (...a) => memory.evict(...a),
      close: () => memory.close(),
    }
    const ledger = new Ledger({ store, clock, wait: '10s' })
    const k = key()
    let fail: (e: Error) => void = () => {}
    const first = ledger.run({ key: k }, () => new Promise((_, reject) => (fail = reject)))
    await sleepers(clock, 1)
    const second = ledger.run({ key: k }, () => 'second ran')
    await sleepers(clock, 2)
    fail(new Error('transient'))
    await expect(first).rejects.toThrow('transient')
    clock.advance(1_000) // past any poll interval
    expect(await second).toMatchObject({ kind: 'executed', value: 'second ran', token: 2 })
  })

  it('gives up waiting at the deadline with in_progress', async () => {
    const { ledger, clock } = setup({ wait: 2_000 })
    const k = key()
    let finish: () => void = () => {}
    const first = ledger.run({ key: k }, () => new Promise<void>((resolve) => (finish = resolve)))
    await sleepers(clock, 1)
    const second = ledger.run({ key: k }, () => 'never')
    await sleepers(clock, 2)
    expect(await drive(clock, second, 250)).toMatchObject({ kind: 'in_progress' })
    finish()
    await first
  })

  it('renews the lease while the work runs, so nobody takes over a live holder', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    let finish: () => void = () => {}
    const first = ledger.run({ key: k }, () => new Promise<string>((resolve) => (finish = () => resolve('slow'))))
    for (let i = 0; i < 9; i++) {
      await sleepers(clock, 1)
      clock.advance(10_000) // 90 s in all: three leases
      await new Promise((r) => setImmediate(r))
    }
    expect((await store.acquire('default', k, fingerprintOf(null), 30_000)).kind).toBe('in_progress')
    finish()
    expect(await first).toMatchObject({ kind: 'executed', outcome: 'completed', token: 1 })
  })

  it('aborts the work signal when the lease is lost, and discards the late outcome', async () => {
    const { ledger, clock, store, events } = setup()
    const k = key()
    let signal: AbortSignal | undefined
    let finish: () => void = () => {}
    const zombie = ledger.run({ key: k }, (ctx) => {
      signal = ctx.signal
      return new Promise<string>((resolve) => (finish = () => resolve('late')))
    })
    await sleepers(clock, 1)
    // Simulate a holder paused past its lease: another takes over with token 2.
    await store.release('default', k, 1)
    expect(await store.acquire('default', k, fingerprintOf(null), 30_000)).toEqual({ kind: 'acquired', token: 2 })
    clock.advance(10_000) // the zombie's renewal fires and finds its token stale
    for (let i = 0; i < 50 && !signal?.aborted; i++) await new Promise((r) => setImmediate(r))
    expect(signal?.aborted).toBe(true)
    expect(isIdempotencyError(signal?.reason) && signal.reason.code).toBe('FENCED_OUT')
    finish()
    expect(await zombie).toMatchObject({ kind: 'executed', outcome: 'fenced_out', token: 1 })
    expect(events.map((e) => e.type)).toContain('lease_lost')
    expect((await store.get('default', k))?.token).toBe(2)
  })

  it('tells the work when it takes over after a crashed holder', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    await store.acquire('default', k, fingerprintOf(null), 30_000) // a holder that then dies
    clock.advance(30_001)
    const result = await ledger.run({ key: k }, (ctx) => ({ takeover: ctx.takeover, token: ctx.token }))
    expect(result).toMatchObject({ kind: 'executed', value: { takeover: true, token: 2 } })
  })

  it('surfaces a failing store as STORE_UNAVAILABLE with the driver error as cause', async () => {
    const clock = new ManualClock()
    const broken = new MemoryStore({ clock })
    const cause = new Error('ECONNREFUSED')
    broken.acquire = async () => {
      throw cause
    }
    const ledger = new Ledger({ store: broken, clock })
    const error = await ledger.run({ key: key() }, () => 1).catch((e: unknown) => e)
    expect(isIdempotencyError(error) && error.code).toBe('STORE_UNAVAILABLE')
    expect((error as Error).cause).toBe(cause)
  })

  it('times out a network store that never answers instead of hanging', async () => {
    const hanging = new MemoryStore()
    Object.defineProperty(hanging, 'serverClock', { value: true })
    hanging.acquire = () => new Promise(() => {})
    const ledger = new Ledger({ store: hanging, storeTimeout: 50 })
    await expect(ledger.run({ key: key() }, () => 1)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
  })

  it('keeps retrying an outcome the store cannot take while the lease protects the record, then stores it', async () => {
    // A store outage of 5 s after the work ran: giving up early would leave the record in progress and
    // let the next retry after the lease run the work a second time.
    const { ledger, store, clock, events } = setup()
    const complete = store.complete.bind(store)
    const downUntilMs = clock.now() + 5_000
    let attempts = 0
    store.complete = async (...args) => {
      attempts++
      if (clock.now() < downUntilMs) throw new Error('connect ECONNREFUSED 127.0.0.1:5432')
      return complete(...args)
    }
    const k = key()
    let runs = 0
    const running = ledger.run({ key: k }, () => ++runs)
    expect(await drive(clock, running, 100)).toMatchObject({ kind: 'executed', value: 1, outcome: 'completed' })
    expect(attempts).toBeGreaterThan(4)
    expect(events.some((e) => e.type === 'unrecorded')).toBe(false)
    expect(await ledger.run({ key: k }, () => ++runs)).toMatchObject({ kind: 'replayed', value: 1 })
    expect(runs).toBe(1)
  })

  it('gives an outcome up as unrecorded only shortly before the lease ends, with an unrecorded event', async () => {
    const { ledger, store, clock, events } = setup()
    const startMs = clock.now()
    let lastAttemptMs = 0
    store.complete = async () => {
      lastAttemptMs = clock.now()
      throw new Error('disk full')
    }
    const k = key()
    const running = ledger.run({ key: k }, () => 'ran')
    expect(await drive(clock, running, 250)).toMatchObject({ kind: 'executed', value: 'ran', outcome: 'unrecorded' })
    // Lease 30 s: retried for most of it, and given up before it ended.
    expect(lastAttemptMs - startMs).toBeGreaterThan(25_000)
    expect(clock.now() - startMs).toBeLessThan(30_000)
    const unrecorded = events.find((e) => e.type === 'unrecorded')
    expect(unrecorded).toMatchObject({ type: 'unrecorded', key: k, token: 1, status: 'completed' })
    expect((unrecorded as { attempts: number }).attempts).toBeGreaterThan(10)
    expect(await store.get('default', k)).toMatchObject({ status: 'in_progress' })
  })

  it('keeps the lease through failed renewals while it lasts, and tells the work it is lost when it ends', async () => {
    const { ledger, store, clock, events } = setup()
    store.renew = async () => {
      throw new Error('connection reset')
    }
    const startMs = clock.now()
    let lostAfterMs = -1
    // Renewals are due every 10 s of the 30 s lease; every one fails from the start.
    const running = ledger.run({ key: key() }, async ({ signal }) => {
      while (!signal.aborted) await clock.sleep(1_000)
      lostAfterMs = clock.now() - startMs
      return 'stopped'
    })
    await drive(clock, running, 500)
    // The failures at 10 s and 20 s leave the lease in force; the one at 30 s finds it ended.
    expect(lostAfterMs).toBeGreaterThanOrEqual(30_000)
    expect(lostAfterMs).toBeLessThan(32_000)
    expect(events.filter((e) => e.type === 'lease_lost')).toHaveLength(1)
  })

  it('counts the protected time from the last renewal, not from the acquire', async () => {
    const { ledger, store, clock } = setup()
    store.complete = async () => {
      throw new Error('connection reset')
    }
    const startMs = clock.now()
    let workDone = 0
    // The work runs 40 s (the lease, renewed every 10 s, keeps the record), then the store goes down.
    const running = ledger.run({ key: key() }, async () => {
      await clock.sleep(40_000)
      workDone = clock.now()
      return 'ran'
    })
    expect(await drive(clock, running, 250)).toMatchObject({ outcome: 'unrecorded' })
    expect(workDone - startMs).toBe(40_000)
    // Renewed last at 40 s, as the work returned (finish waits for that renewal, and the store granted it):
    // protected until about 70 s, so the outcome is retried until shortly before.
    expect(clock.now() - startMs).toBeGreaterThan(65_000)
    expect(clock.now() - startMs).toBeLessThan(70_000)
  })

  it("reports each event of a run to that run's own onEvent as well as the ledger's", async () => {
    const { ledger, events } = setup()
    const own: LedgerEvent[] = []
    await ledger.run({ key: key() }, () => 1, { onEvent: (e) => own.push(e) })
    expect(own.map((e) => e.type)).toEqual(['acquired', 'stored'])
    expect(events.map((e) => e.type)).toEqual(['acquired', 'stored'])
  })

  it('rejects bad keys, scopes, fingerprints and options with typed errors', async () => {
    const { ledger } = setup()
    await expect(ledger.run({ key: '' }, () => 1)).rejects.toMatchObject({ code: 'KEY_INVALID' })
    await expect(ledger.run({ key: 'x'.repeat(256) }, () => 1)).rejects.toMatchObject({ code: 'KEY_INVALID' })
    await expect(ledger.run({ key: 'k', scope: '' }, () => 1)).rejects.toMatchObject({ code: 'SCOPE_INVALID' })
    await expect(ledger.run({ key: 'k', fingerprint: 'nope' }, () => 1)).rejects.toMatchObject({ code: 'FINGERPRINT_INVALID' })
    await expect(ledger.run({ key: 'k', payload: { amount: 1 }, fingerprint: 'a'.repeat(64) }, () => 1)).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/^An intent takes a payload .* or a fingerprint you computed, not both/),
    })
    expect(() => new Ledger({ store: new MemoryStore(), lease: 'soon' })).toThrow(/lease "soon" is not a duration/)
    expect(() => new Ledger({ store: new MemoryStore(), ttl: 0 })).toThrow(/ttl must be longer than 0/)
    // A TTL no store keeps as an expiry: refused at once, not found out when the outcome fails to record.
    expect(() => new Ledger({ store: new MemoryStore(), ttl: 1e20 })).toThrow(
      /^ttl 100000000000000000000ms is longer than the longest duration/,
    )
    await expect(ledger.run({ key: 'k' }, () => 1, { ttl: '36501d' })).rejects.toMatchObject({ code: 'INVALID_OPTION' })
    expect(() => new Ledger({} as never)).toThrow(/needs a store/)
    // A clock, telemetry or onEvent of the wrong shape was taken, and the first run failed with a TypeError.
    expect(() => new Ledger({ store: new MemoryStore(), clock: { now: () => 0 } as never })).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: 'new Ledger(): clock must be an object with now(), sleep(), timer(); it has no sleep(), timer().',
      }),
    )
    expect(() => new Ledger({ store: new MemoryStore(), storeTimeoutClock: 'system' as never })).toThrow(
      'storeTimeoutClock must be an object with now(), sleep(), timer(); got a string of 6 characters.',
    )
    expect(() => new Ledger({ store: new MemoryStore(), telemetry: {} as never })).toThrow('telemetry must be an object with startRun()')
    expect(() => new Ledger({ store: new MemoryStore(), onEvent: console as never })).toThrow('new Ledger(): onEvent must be a function')
  })

  it('refuses runInTransaction on a store without transactions, naming the alternative', () => {
    const { ledger } = setup()
    expect(() => ledger.runInTransaction({ key: 'k' }, () => 1)).toThrow(/use run\(\) instead/i)
  })
})

describe('Ledger.runInTransaction', () => {
  it('commits the business writes together with the completion', async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const k = key()
    const result = await ledger.runInTransaction({ key: k }, ({ tx }) => {
      tx.push(`charge ${k}`)
      return 'charged'
    })
    expect(result).toMatchObject({ kind: 'executed', outcome: 'completed' })
    expect(store.committed).toEqual([`charge ${k}`])
    expect((await ledger.runInTransaction({ key: k }, () => 'again')).kind).toBe('replayed')
  })

  it("rolls back a fenced-out holder's writes", async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const k = key()
    const result = await ledger.runInTransaction({ key: k }, async ({ tx, token }) => {
      // Meanwhile another holder takes the record over.
      await store.release('default', k, token)
      await store.acquire('default', k, fingerprintOf(null), 30_000)
      tx.push('zombie write')
      return 'late'
    })
    expect(result).toMatchObject({ kind: 'executed', outcome: 'fenced_out' })
    expect(store.committed).toEqual([])
  })

  it('rolls back and releases a transient outcome', async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const k = key()
    const result = await ledger.runInTransaction(
      { key: k },
      ({ tx }) => {
        tx.push('write')
        return 503
      },
      { encode: (status) => ({ status, headers: {}, body: new Uint8Array() }) },
    )
    expect(result).toMatchObject({ outcome: 'released' })
    expect(store.committed).toEqual([])
    expect((await store.get('default', k))?.status).toBe('in_progress')
    expect((await ledger.runInTransaction({ key: k }, () => 'retry')).kind).toBe('executed')
  })

  it("stores a returned final failure without the work's writes, or with them under failedWrites: 'commit'", async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const declined =
      (write: string) =>
      ({ tx }: { tx: string[] }) => {
        tx.push(write)
        return 422
      }
    const encode = (status: number) => ({ status, headers: {}, body: new Uint8Array() })
    const [rolled, kept] = [key(), key()]
    expect(await ledger.runInTransaction({ key: rolled }, declined('order'), { encode })).toMatchObject({
      kind: 'executed',
      outcome: 'failed',
    })
    expect(store.committed).toEqual([])
    expect((await store.get('default', rolled))?.status).toBe('failed')
    expect(await ledger.runInTransaction({ key: kept }, declined('audit'), { encode, failedWrites: 'commit' })).toMatchObject({
      outcome: 'failed',
    })
    expect(store.committed).toEqual(['audit'])
  })

  it("refuses a store that cannot roll back to a savepoint unless failedWrites: 'commit', and an unknown failedWrites", async () => {
    const store = new TxMemoryStore()
    Object.defineProperty(store, 'savepointInTransaction', { value: undefined })
    const ledger = new Ledger({ store })
    await expect(ledger.runInTransaction({ key: key() }, () => 1)).rejects.toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringContaining("failedWrites: 'commit'"),
    })
    expect(await ledger.runInTransaction({ key: key() }, () => 1, { failedWrites: 'commit' })).toMatchObject({ outcome: 'completed' })
    await expect(
      new Ledger({ store: new TxMemoryStore() }).runInTransaction({ key: key() }, () => 1, { failedWrites: 'keep' as never }),
    ).rejects.toMatchObject({ code: 'INVALID_OPTION', message: expect.stringContaining('"keep"') })
  })
})
