/**
 * Network faults between the app and its store (issue 28.5): PostgresStore, MySqlStore and
 * RedisStore each open their own pool or client through a TcpFaultProxy in front of the real server,
 * and a Ledger runs a stream of keys, each by 3 concurrent callers that retry as a client would,
 * while the proxy injects either transient faults (a latency spike, connections cut mid-query, a
 * blackhole longer than `storeTimeout` whose connections resume when it heals) or half-open
 * connections (a blackhole whose stalled connections never answer again, while new ones work).
 *
 * Checked through direct (non-proxied) connections afterwards:
 * - no key's effect ran twice (the effect bumps a counter in the real server, outside the proxy);
 * - every call settled (returned, or threw an IdempotencyError) within CALL_BOUND_MS: a liveness
 *   bound derived from the ledger's timeouts (docs/ledger.md, "Store outages"), not a timing test;
 * - every key was finally completed, and after the last heal the same store instance serves new keys
 *   at the first try (its pool or client recovered).
 */
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import { MySqlStore } from '../src/backends/mysql/index.js'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { RedisStore } from '../src/backends/redis/index.js'
import { Ledger } from '../src/core/ledger.js'
import type { IdempotencyStore } from '../src/core/store.js'
import { isIdempotencyError } from '../src/errors.js'
import { dropPrefix } from './helpers/redis.js'
import { serviceSkipReason } from './helpers/services.js'
import { TcpFaultProxy } from './helpers/tcp-fault-proxy.js'

const STORE_TIMEOUT_MS = 1_000
/**
 * The stores' own bound on an unanswered statement or command (PostgresStore `queryTimeout`,
 * RedisStore `socketTimeout`): what frees a half-open connection. Shorter than the lease minus the
 * outage, so a holder whose connection went dead still stores its outcome on a new one.
 */
const STORE_SOCKET_TIMEOUT_MS = 2_000
const WAIT_MS = 2_000
/**
 * Covers the whole transient sequence (faults from 0.3 s to 4.7 s, back to back) plus the store's
 * recovery after it, minus the ledger's margin: a holder that acquired as the faults began can still
 * store its outcome (at 6 s, MariaDB's recovery after the heal once came too late: one `unrecorded`).
 */
const LEASE_MS = 8_000
/**
 * The longest a `ledger.run` may take here: an acquire (one store call, cut at `storeTimeout`), a wait
 * for another holder (`wait`, plus the store call in flight at its end), the acquire after it, then
 * the complete, retried until shortly before the lease ends (plus its last call). Anything past this,
 * plus 2 s of margin for a loaded 2-core machine, is a hang.
 */
const CALL_BOUND_MS = 3 * STORE_TIMEOUT_MS + WAIT_MS + LEASE_MS + STORE_TIMEOUT_MS + 2_000
/** Each blackhole; longer than `storeTimeout`, so calls in flight time out. */
const BLACKHOLE_MS = 2_500
/** A new key every KEY_EVERY_MS for a plan's `loadMs`, each run by CALLERS concurrent callers. */
const KEY_EVERY_MS = 50
const CALLERS = 3

/** Counts each key's effect in the real server, through a connection that bypasses the proxy. */
interface Effects {
  bump(key: string): Promise<void>
  counts(): Promise<Map<string, number>>
  drop(): Promise<void>
}

interface Rig {
  name: string
  port: number
  /** The store under test, opened through the proxy on `proxyPort`. */
  open(proxyPort: number, id: string): IdempotencyStore
  /** The same table or prefix, straight to the server. */
  direct(id: string): IdempotencyStore
  effects(id: string): Promise<Effects>
  /** Drops what `open` created. */
  teardown(id: string): Promise<void>
}

const PG_DIRECT = 'postgres://root@127.0.0.1:5432/test'
const MYSQL_DIRECT = 'mysql://root@127.0.0.1:3306/test'
const REDIS_DIRECT = 'redis://127.0.0.1:6379'

const postgres: Rig = {
  name: 'PostgreSQL',
  port: 5432,
  open: (port, id) =>
    new PostgresStore({ connectionString: `postgres://root@127.0.0.1:${port}/test`, table: id, queryTimeout: STORE_SOCKET_TIMEOUT_MS }),
  direct: (id) => new PostgresStore({ connectionString: PG_DIRECT, table: id }),
  async effects(id) {
    const pool = new pg.Pool({ connectionString: PG_DIRECT, max: 4 })
    const table = `${id}_effects`
    await pool.query(`CREATE TABLE ${table} (key text PRIMARY KEY, runs int NOT NULL)`)
    return {
      bump: async (key) => {
        await pool.query(`INSERT INTO ${table} VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET runs = ${table}.runs + 1`, [key])
      },
      counts: async () => {
        const { rows } = await pool.query<{ key: string; runs: number }>(`SELECT key, runs FROM ${table}`)
        return new Map(rows.map((row) => [row.key, row.runs]))
      },
      drop: async () => {
        await pool.query(`DROP TABLE IF EXISTS ${table}`)
        await pool.end()
      },
    }
  },
  async teardown(id) {
    const pool = new pg.Pool({ connectionString: PG_DIRECT, max: 1 })
    await pool.query(`DROP TABLE IF EXISTS ${id}`)
    await pool.end()
  },
}

const mysqlRig: Rig = {
  name: 'MariaDB',
  port: 3306,
  open: (port, id) => new MySqlStore({ uri: `mysql://root@127.0.0.1:${port}/test`, table: id, queryTimeout: STORE_SOCKET_TIMEOUT_MS }),
  direct: (id) => new MySqlStore({ uri: MYSQL_DIRECT, table: id }),
  async effects(id) {
    const pool = mysql.createPool({ uri: MYSQL_DIRECT, connectionLimit: 4 })
    const table = `${id}_effects`
    await pool.query(`CREATE TABLE ${table} (k VARCHAR(255) PRIMARY KEY, runs INT NOT NULL)`)
    return {
      bump: async (key) => {
        await pool.execute(`INSERT INTO ${table} VALUES (?, 1) ON DUPLICATE KEY UPDATE runs = runs + 1`, [key])
      },
      counts: async () => {
        const [rows] = await pool.query(`SELECT k, runs FROM ${table}`)
        return new Map((rows as { k: string; runs: number }[]).map((row) => [row.k, row.runs]))
      },
      drop: async () => {
        await pool.query(`DROP TABLE IF EXISTS ${table}`)
        await pool.end()
      },
    }
  },
  async teardown(id) {
    const pool = mysql.createPool({ uri: MYSQL_DIRECT, connectionLimit: 1 })
    await pool.query(`DROP TABLE IF EXISTS ${id}`)
    await pool.query(`DROP TABLE IF EXISTS ${id}_meta`)
    await pool.end()
  },
}

const redis: Rig = {
  name: 'Redis',
  port: 6379,
  open: (port, id) => new RedisStore({ url: `redis://127.0.0.1:${port}`, prefix: id, socketTimeout: STORE_SOCKET_TIMEOUT_MS }),
  direct: (id) => new RedisStore({ url: REDIS_DIRECT, prefix: id }),
  async effects(id) {
    const client = new Redis(REDIS_DIRECT)
    const hash = `${id}-effects`
    return {
      bump: async (key) => {
        await client.hincrby(hash, key, 1)
      },
      counts: async () => new Map(Object.entries(await client.hgetall(hash)).map(([key, runs]) => [key, Number(runs)])),
      drop: async () => {
        await client.del(hash)
        client.disconnect()
      },
    }
  },
  teardown: (id) => dropPrefix(REDIS_DIRECT, id),
}

/** What one `ledger.run` call did, and how long it took. */
interface Call {
  key: string
  ms: number
  settled: string
  typed: boolean
}

/** Everything the load saw, for the checks. */
interface Observed {
  calls: Call[]
  unrecorded: string[]
  /** Keys whose callers all gave up before any of them saw the outcome. */
  unfinished: string[]
  keys: string[]
}

/** Runs a stream of keys, each by CALLERS callers that retry on STORE_UNAVAILABLE and in_progress. */
async function load(ledger: Ledger, scope: string, effects: Effects, loadMs: number): Promise<Observed> {
  const observed: Observed = { calls: [], unrecorded: [], unfinished: [], keys: [] }
  const startedAt = Date.now()
  const giveUpAt = startedAt + loadMs + CALL_BOUND_MS
  const caller = async (key: string): Promise<boolean> => {
    for (;;) {
      const at = performance.now()
      try {
        const result = await ledger.run({ key, scope, payload: { key } }, async () => {
          await effects.bump(key)
          return { key }
        })
        const settled = result.kind === 'executed' ? `executed:${result.outcome}` : result.kind
        observed.calls.push({ key, ms: performance.now() - at, settled, typed: true })
        if (result.kind === 'executed' && result.outcome === 'unrecorded') observed.unrecorded.push(key)
        if (result.kind === 'executed' || result.kind === 'replayed') return true
      } catch (error) {
        const typed = isIdempotencyError(error)
        const settled = typed ? error.code : `untyped: ${String(error)}`
        observed.calls.push({ key, ms: performance.now() - at, settled, typed })
      }
      if (Date.now() > giveUpAt) return false
      await sleep(50 + Math.random() * 100)
    }
  }
  const runs: Promise<void>[] = []
  for (let i = 0; Date.now() - startedAt < loadMs; i++) {
    const key = `k${i}`
    observed.keys.push(key)
    runs.push(
      Promise.all(Array.from({ length: CALLERS }, () => caller(key))).then((done) => {
        if (!done.includes(true)) observed.unfinished.push(key)
      }),
    )
    await sleep(KEY_EVERY_MS)
  }
  await Promise.all(runs)
  return observed
}

/** A fault plan: how long keys keep coming, and the faults, timed from the start of the load. */
interface Plan {
  name: string
  loadMs: number
  /** Injects the faults; returns what each did, for the report of a failure. */
  inject(proxy: TcpFaultProxy): Promise<string[]>
}

const transient: Plan = {
  name: 'latency spike, cuts mid-query, a blackhole that heals',
  loadMs: 5_500,
  async inject(proxy) {
    const log: string[] = []
    await sleep(300)
    proxy.delay(200)
    log.push('latency spike: 200 ms per chunk each way for 1 s')
    await sleep(1_000)
    proxy.delay(0)
    await sleep(200)
    log.push(`cut mid-query: ${proxy.cut()} connections`)
    await sleep(400)
    // The pool reconnects when a caller next needs it; on a loaded machine that can take longer than
    // 400 ms, and a cut of nothing tests nothing: wait (up to 500 ms more) for a connection to cut.
    for (let waited = 0; proxy.counts().open === 0 && waited < 500; waited += 20) await sleep(20)
    log.push(`cut mid-query: ${proxy.cut()} connections`)
    await sleep(300)
    proxy.blackhole()
    await sleep(BLACKHOLE_MS)
    log.push(`blackhole ${BLACKHOLE_MS} ms: ${proxy.counts().stalled} connections stalled, then resumed`)
    proxy.heal()
    return log
  },
}

const halfOpen: Plan = {
  name: 'half-open connections that never answer',
  loadMs: 5_000,
  async inject(proxy) {
    await sleep(800)
    proxy.blackhole()
    await sleep(BLACKHOLE_MS)
    const log = [`blackhole ${BLACKHOLE_MS} ms: ${proxy.counts().stalled} connections left half-open for ever`]
    proxy.heal({ stalled: 'hang' })
    return log
  },
}

/** Resolves with `promise`, or rejects after `ms`: a close that hangs must fail the test, not time it out. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took more than ${ms} ms`)), ms)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

async function faultRun(rig: Rig, plan: Plan): Promise<void> {
  const id = `tcpf_${randomUUID().replaceAll('-', '').slice(0, 12)}`
  const scope = `tcp-faults-${id}`
  const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: rig.port })
  const store = rig.open(proxy.port, id)
  const direct = rig.direct(id)
  const effects = await rig.effects(id)
  const ledger = new Ledger({ store, lease: LEASE_MS, wait: WAIT_MS, storeTimeout: STORE_TIMEOUT_MS })
  let closed: Promise<void> = Promise.resolve()
  try {
    await (store as { migrate?: () => Promise<void> }).migrate?.()
    const [observed, log] = await Promise.all([load(ledger, scope, effects, plan.loadMs), plan.inject(proxy)])
    const report = `${rig.name} faults: ${log.join('; ')}`

    // Every fault bit: connections were open to cut and to stall.
    expect(
      log.filter((line) => /: 0 connections/.test(line)),
      report,
    ).toEqual([])
    const slow = observed.calls.filter((call) => call.ms > CALL_BOUND_MS)
    expect(slow.slice(0, 5), `calls past the bound of ${CALL_BOUND_MS} ms; ${report}`).toEqual([])
    const untyped = observed.calls.filter((call) => !call.typed)
    expect(untyped.slice(0, 5), `errors that are not IdempotencyError; ${report}`).toEqual([])
    expect(observed.unrecorded, `outcomes given up as unrecorded; ${report}`).toEqual([])
    expect(observed.unfinished, `keys no caller finished in time; ${report}`).toEqual([])

    const counts = await effects.counts()
    const twice = observed.keys.filter((key) => (counts.get(key) ?? 0) > 1)
    expect(twice, `keys whose effect ran more than once; ${report}`).toEqual([])
    const never = observed.keys.filter((key) => (counts.get(key) ?? 0) === 0)
    expect(never, `keys whose effect never ran; ${report}`).toEqual([])
    for (const key of observed.keys) {
      const record = await direct.get(scope, key)
      expect(record?.status, `record of ${key}; ${report}`).toBe('completed')
    }

    // The same store instance serves new keys at the first try: its pool or client recovered.
    const fresh = await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const key = `after-${i}`
        const result = await ledger.run({ key, scope, payload: { key } }, async () => {
          await effects.bump(key)
          return { key }
        })
        return result.kind === 'executed' ? result.outcome : result.kind
      }),
    )
    expect(fresh, report).toEqual(Array(20).fill('completed'))
    const faults = observed.calls.filter((call) => call.settled === 'STORE_UNAVAILABLE').length
    console.info(`${rig.name}: ${observed.keys.length} keys, ${observed.calls.length} calls (${faults} STORE_UNAVAILABLE); ${report}`)
  } finally {
    proxy.heal()
    // After the checks, so that a close that hangs is reported without hiding what they found.
    closed = within(ledger.close(), 5_000, `${rig.name}: the store's close()`)
    await closed.catch(() => {})
    await proxy.close()
    await direct.close()
    await effects.drop()
    await rig.teardown(id)
  }
  await closed
}

const rigs = [postgres, mysqlRig, redis]
const skips = new Map<Rig, string | undefined>()
for (const rig of rigs) skips.set(rig, await serviceSkipReason(rig.name, rig.port))
const TEST_TIMEOUT_MS = 6_000 + 2 * CALL_BOUND_MS + 30_000

// Each test has its own proxy, table or prefix and scope: they run side by side to keep the file short.
describe.concurrent('TCP faults between the ledger and its store', () => {
  for (const rig of rigs) {
    const skip = skips.get(rig) !== undefined
    ;(skip ? it.skip : it)(
      `${rig.name}, ${transient.name}: no double run, every call settles within its bound, every key completes`,
      () => faultRun(rig, transient),
      TEST_TIMEOUT_MS,
    )
    ;(skip ? it.skip : it)(
      `${rig.name}, ${halfOpen.name}: no double run, bounded calls, and the pool recovers`,
      () => faultRun(rig, halfOpen),
      TEST_TIMEOUT_MS,
    )
  }
})

/** How long one store call on a half-open connection may take with a bound of HALF_OPEN_TIMEOUT_MS: the bound, plus margin. */
const HALF_OPEN_TIMEOUT_MS = 500
const HALF_OPEN_SETTLES_MS = HALF_OPEN_TIMEOUT_MS + 2_500

/**
 * The same fault with one connection and no ledger: the store itself must end a call on a half-open
 * connection within its own bound, and its next call must run on a new connection.
 */
async function halfOpenAlone(rig: Rig, open: (port: number, id: string) => IdempotencyStore): Promise<void> {
  const id = `tcpf_${randomUUID().replaceAll('-', '').slice(0, 12)}`
  const scope = `tcp-faults-${id}`
  const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: rig.port })
  const store = open(proxy.port, id)
  try {
    await (store as { migrate?: () => Promise<void> }).migrate?.()
    expect(await store.get(scope, 'k')).toBeNull()
    proxy.blackhole()
    proxy.heal({ stalled: 'hang' })
    expect(proxy.counts().stalled).toBeGreaterThan(0)
    const at = performance.now()
    // Settles (an IdempotencyError, or an answer when the client resent it on a new connection): never hangs.
    const first = await within(
      store.get(scope, 'k').then(
        () => 'answered',
        (error: unknown) => (isIdempotencyError(error) ? error.code : `untyped: ${String(error)}`),
      ),
      HALF_OPEN_SETTLES_MS,
      `${rig.name}: a call on a half-open connection`,
    )
    expect(['answered', 'STORE_UNAVAILABLE']).toContain(first)
    expect(performance.now() - at).toBeGreaterThanOrEqual(HALF_OPEN_TIMEOUT_MS - 50)
    expect(await within(store.get(scope, 'k'), HALF_OPEN_SETTLES_MS, `${rig.name}: the call after it`)).toBeNull()
    await within(store.close(), 5_000, `${rig.name}: close() after a half-open connection`)
  } finally {
    await proxy.close()
    await rig.teardown(id)
  }
}

describe('a store ends a call on a half-open connection by itself, and its next call reconnects', () => {
  it.skipIf(skips.get(postgres) !== undefined)('PostgresStore (queryTimeout, a pool of one connection)', () =>
    halfOpenAlone(
      postgres,
      (port, table) =>
        new PostgresStore({
          connectionString: `postgres://root@127.0.0.1:${port}/test`,
          table,
          max: 1,
          notifications: false,
          queryTimeout: HALF_OPEN_TIMEOUT_MS,
        }),
    ),
  )
  it.skipIf(skips.get(mysqlRig) !== undefined)('MySqlStore (queryTimeout, a pool of one connection)', () =>
    halfOpenAlone(
      mysqlRig,
      (port, table) =>
        new MySqlStore({ uri: `mysql://root@127.0.0.1:${port}/test`, table, connectionLimit: 1, queryTimeout: HALF_OPEN_TIMEOUT_MS }),
    ),
  )
  it.skipIf(skips.get(redis) !== undefined)('RedisStore (socketTimeout of the client it opens)', () =>
    halfOpenAlone(
      redis,
      (port, prefix) =>
        new RedisStore({ url: `redis://127.0.0.1:${port}`, prefix, notifications: false, socketTimeout: HALF_OPEN_TIMEOUT_MS }),
    ),
  )
})

describe('PostgresStore wake-ups after a half-open connection', () => {
  it.skipIf(skips.get(postgres) !== undefined)(
    'a LISTEN sent on a half-open connection ends within queryTimeout, and the store listens again on a new one',
    async () => {
      const id = `tcpf_${randomUUID().replaceAll('-', '').slice(0, 12)}`
      const scope = `tcp-faults-${id}`
      const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: postgres.port })
      const store = new PostgresStore({
        connectionString: `postgres://root@127.0.0.1:${proxy.port}/test`,
        table: id,
        max: 3,
        queryTimeout: HALF_OPEN_TIMEOUT_MS,
      })
      try {
        await store.migrate()
        const acquired = await store.acquire(scope, 'k', 'a'.repeat(64), 60_000)
        if (acquired.kind !== 'acquired') throw new Error(`expected to acquire, got ${acquired.kind}`)
        // Two idle connections in the pool (two statements at once), then both go half-open: the first
        // watch's flag statement takes one, and the listener's first LISTEN goes out on the other.
        await Promise.all([store.get(scope, 'k'), store.list({ scope })])
        expect(proxy.counts().open).toBe(2)
        proxy.blackhole()
        proxy.heal({ stalled: 'hang' })
        const unwatchFirst = store.watch?.(scope, 'k', () => {})
        const deadline = Date.now() + HALF_OPEN_SETTLES_MS + 2_000
        while (!(await store.listening()) && Date.now() < deadline) await sleep(50)
        expect(await store.listening(), 'the store listens again within its bound').toBe(true)
        unwatchFirst?.()
        // That first watch's flag statement met the other half-open connection (and failed: its waiter
        // polls). A watch now flags the record on a live connection, and the completion notifies.
        let woken = 0
        const unwatch = store.watch?.(scope, 'k', () => {
          woken++
        })
        await sleep(200)
        woken = 0
        const outcome = { status: 'completed' as const, response: { status: 200, headers: {}, body: Buffer.from('{}') }, resourceId: null }
        // Another idle connection of the pool may be half-open too: its statement fails within queryTimeout.
        let stored = false
        for (let i = 0; i < 3 && !stored; i++) stored = await store.complete(scope, 'k', acquired.token, outcome, 60_000).catch(() => false)
        expect(stored).toBe(true)
        const wokenBy = Date.now() + 2_000
        while (woken === 0 && Date.now() < wokenBy) await sleep(10)
        expect(woken, 'the completion woke the watcher').toBeGreaterThan(0)
        unwatch?.()
        await within(store.close(), 5_000, 'PostgreSQL: close() after a half-open LISTEN')
      } finally {
        await proxy.close()
        await postgres.teardown(id)
      }
    },
    30_000,
  )
})

describe('PostgresStore wake-ups when its LISTEN connection goes half-open', () => {
  it.skipIf(skips.get(postgres) !== undefined)(
    'the listener finds out within twice queryTimeout, wakes its waiters and listens on a new connection',
    async () => {
      const id = `tcpf_${randomUUID().replaceAll('-', '').slice(0, 12)}`
      const scope = `tcp-faults-${id}`
      const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: postgres.port })
      const store = new PostgresStore({
        connectionString: `postgres://root@127.0.0.1:${proxy.port}/test`,
        table: id,
        queryTimeout: HALF_OPEN_TIMEOUT_MS,
      })
      try {
        await store.migrate()
        const acquired = await store.acquire(scope, 'k', 'a'.repeat(64), 60_000)
        if (acquired.kind !== 'acquired') throw new Error(`expected to acquire, got ${acquired.kind}`)
        let woken = 0
        const unwatch = store.watch?.(scope, 'k', () => {
          woken++
        })
        expect(await store.listening()).toBe(true)
        await sleep(200)
        woken = 0
        // Every connection goes half-open, the listening one too: no notice can reach it any more.
        proxy.blackhole()
        proxy.heal({ stalled: 'hang' })
        const stalledAt = Date.now()
        while (woken === 0 && Date.now() - stalledAt < 2 * HALF_OPEN_TIMEOUT_MS + 2_000) await sleep(20)
        expect(woken, 'the waiter was woken when the listening connection was found dead').toBeGreaterThan(0)
        const deadline = Date.now() + HALF_OPEN_SETTLES_MS
        while (!(await store.listening()) && Date.now() < deadline) await sleep(50)
        expect(await store.listening(), 'the store listens again on a new connection').toBe(true)
        unwatch?.()
        await within(store.close(), 5_000, 'PostgreSQL: close() after a half-open LISTEN connection')
      } finally {
        await proxy.close()
        await postgres.teardown(id)
      }
    },
    30_000,
  )
})

describe('RedisStore wake-ups when its subscriber connection goes half-open', () => {
  it.skipIf(skips.get(redis) !== undefined)(
    'a PING every socketTimeout finds the dead subscriber; it reconnects, and the next completion wakes the waiter',
    async () => {
      const id = `tcpf_${randomUUID().replaceAll('-', '').slice(0, 12)}`
      const scope = `tcp-faults-${id}`
      const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: redis.port })
      const store = new RedisStore({ url: `redis://127.0.0.1:${proxy.port}`, prefix: id, socketTimeout: HALF_OPEN_TIMEOUT_MS })
      try {
        const acquired = await store.acquire(scope, 'k', 'a'.repeat(64), 60_000)
        if (acquired.kind !== 'acquired') throw new Error(`expected to acquire, got ${acquired.kind}`)
        let woken = 0
        const unwatch = store.watch(scope, 'k', () => {
          woken++
        })
        // Subscribed once the watcher's "may have changed" call came.
        const subscribedBy = Date.now() + 2_000
        while (woken === 0 && Date.now() < subscribedBy) await sleep(10)
        expect(woken, 'subscribed').toBeGreaterThan(0)
        // Every connection goes half-open, the subscriber too: no message can reach it any more.
        proxy.blackhole()
        proxy.heal({ stalled: 'hang' })
        // A probe, its socketTimeout, the reconnect and the new SUBSCRIBE.
        await sleep(3 * HALF_OPEN_TIMEOUT_MS + 500)
        woken = 0
        const outcome = { status: 'completed' as const, response: { status: 200, headers: {}, body: Buffer.from('{}') }, resourceId: null }
        // The command connection was half-open too: its first command fails within socketTimeout.
        let stored = false
        for (let i = 0; i < 3 && !stored; i++) stored = await store.complete(scope, 'k', acquired.token, outcome, 60_000).catch(() => false)
        expect(stored).toBe(true)
        const wokenBy = Date.now() + 2_000
        while (woken === 0 && Date.now() < wokenBy) await sleep(10)
        expect(woken, 'the completion woke the waiter through the new subscriber connection').toBeGreaterThan(0)
        unwatch()
        await within(store.close(), 5_000, 'Redis: close() after a half-open subscriber')
      } finally {
        await proxy.close()
        await redis.teardown(id)
      }
    },
    30_000,
  )
})
