/**
 * Faults as a test suite (issue 12): two `idemkey proxy` processes share a throwaway PostgreSQL or
 * Redis, clients send every key from 2-3 concurrent clients and retry through either proxy, and the
 * store or a proxy is crashed or frozen mid-load. Afterwards: no key ran twice (but for the documented
 * case of a proxy killed mid-request, and then only after the lease), every key that ran has a
 * completed record, and every client got a final answer with the same bytes as the others.
 *
 * Needs `npm run build` (the proxies run from dist). IDEMKEY_FAULTS_BIN=path/to/bin/idemkey.js runs
 * the same faults against another build, e.g. an older commit's.
 */
import { spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { RedisStore } from '../src/backends/redis/index.js'
import type { IdempotencyStore, StoredRecord } from '../src/core/store.js'
import { CountingUpstream, type Execution, killProxy, Load, type ProxyProcess, startProxy } from './fixtures/faults/harness.js'
import { check, type FaultEvent, type Verdict } from './fixtures/faults/invariants.js'
import { freezePostgres, killPostgres, type PostgresTree, removeStaleLocks, signalAll, thawPostgres } from './fixtures/faults/processes.js'
import { canStartThrowaway, startThrowaway, type ThrowawayServer } from './fixtures/postgres/throwaway-server.js'
import { freePort, RedisServer, tempDir } from './fixtures/redis/servers.js'
import { isCI } from './helpers/services.js'

const ROOT = join(import.meta.dirname, '..')
const BIN = process.env.IDEMKEY_FAULTS_BIN ?? join(ROOT, 'bin/idemkey.js')
const LEASE_MS = 10_000
/** The lease outlives the 3 s outages, so a holder whose store comes back in time can still record its outcome. */
const PROXY_FLAGS = ['--lease', '10s', '--wait', '2s']
/** ~75 keys/s × 2.33 clients: ~175 requests/s before retries, for 9 s. */
const LOAD = { durationMs: 9_000, keysPerSecond: 75, keyDeadlineMs: 30_000, maxRetryDelayMs: 500 }
const FAULT_AT_MS = 2_500
const OUTAGE_MS = 3_000
const REDIS_RESTART_MS = 3_000
const TEST_TIMEOUT_MS = 120_000

const CI = isCI()

/** Loud skip on a user's machine, a failure in CI: a missing server never turns into a silent green. */
function skipReason(name: string, reason: string | undefined): string | undefined {
  if (reason === undefined) return undefined
  if (CI) throw new Error(`CI=true and ${reason}`)
  console.warn(`\n!!! SKIPPED (fault suite, ${name}): ${reason}\n`)
  return reason
}

const pgSkip = skipReason(
  'PostgreSQL',
  canStartThrowaway() ? undefined : 'the PostgreSQL 15 binaries (initdb, pg_ctl) are not in /usr/lib/postgresql/15/bin (or $PG_BIN)',
)
const redisSkip = skipReason(
  'Redis',
  spawnSync('redis-server', ['--version']).status === 0 ? undefined : 'redis-server is not on the PATH (apt-get install redis-server)',
)

function assertBuilt(): void {
  if (!existsSync(BIN)) throw new Error(`${BIN} is missing.`)
  if (BIN === join(ROOT, 'bin/idemkey.js') && !existsSync(join(ROOT, 'dist/cli/main.js'))) {
    throw new Error('dist/cli/main.js is missing: run `npm run build` first.')
  }
}

/** What a fault sees while it runs. */
interface FaultContext {
  proxies: ProxyProcess[]
  load: Load
  mark(what: string): void
  /**
   * Waits (at most 2 s) until the upstream runs 2 requests at once (forwarded by the proxy on
   * `proxyPort`, when given), notes them as hit, and returns: call it right before the fault, so the
   * fault lands on work that ran and has no stored outcome yet.
   */
  strike(proxyPort?: number): Promise<void>
}

interface FaultPlan {
  name: string
  storeUrl: string
  upstream: CountingUpstream
  openStore(): IdempotencyStore
  /** Runs the fault (and undoes it); returns the keys in flight at a killed proxy, when it killed one. */
  inject(ctx: FaultContext): Promise<Map<string, number> | undefined>
  /** Why the fault did not bite, if it did not (so a fault that missed cannot pass as a green run). */
  missed(verdict: Verdict): string | undefined
}

/** Every record in the store, whatever its scope (retried while the store is still recovering). */
async function allRecords(store: IdempotencyStore): Promise<StoredRecord[]> {
  for (let i = 0; ; i++) {
    try {
      return await store.list({ includeExpired: true, limit: 1_000_000 })
    } catch (error) {
      if (i >= 50) throw error
      await sleep(200)
    }
  }
}

/** Two proxies, steady load, the fault at FAULT_AT_MS, then every invariant. */
async function runFault(plan: FaultPlan): Promise<void> {
  const startedAt = Date.now()
  const events: FaultEvent[] = []
  const proxies: ProxyProcess[] = []
  let load: Load | undefined
  let inFlightAtKill: Map<string, number> | undefined
  let hit: Execution[] = []
  try {
    for (let i = 0; i < 2; i++) {
      proxies.push(await startProxy(BIN, ['--upstream', plan.upstream.url, '--store', plan.storeUrl, ...PROXY_FLAGS]))
    }
    const running = new Load({ proxies: proxies.map((p) => p.url), prefix: `${plan.name}-${randomUUID().slice(0, 8)}`, ...LOAD })
    load = running
    const mark = (what: string) => events.push({ at: Date.now(), what })
    const strike = async (proxyPort?: number) => {
      await plan.upstream.busy(2, 2_000, proxyPort)
      hit = plan.upstream.running(proxyPort)
      mark(`the fault strikes ${hit.length} executions in flight: ${hit.map((run) => run.key).join(', ')}`)
    }
    const [loaded, faulted] = await Promise.allSettled([
      running.run(),
      sleep(FAULT_AT_MS).then(() => plan.inject({ proxies, load: running, mark, strike })),
    ])
    if (faulted.status === 'rejected') throw faulted.reason
    if (loaded.status === 'rejected') throw loaded.reason
    inFlightAtKill = faulted.value
  } finally {
    for (const proxy of proxies) await killProxy(proxy)
  }
  const store = plan.openStore()
  let records: StoredRecord[]
  try {
    records = await allRecords(store)
  } finally {
    await store.close()
  }
  const verdict = check({
    name: plan.name,
    load,
    upstream: plan.upstream,
    records,
    events,
    proxyLogs: proxies.map((p) => p.stderr),
    leaseMs: LEASE_MS,
    inFlightAtKill,
    hit,
    trace: process.env.FAULTS_TRACE === '1',
  })
  console.log(`${verdict.summary} in ${((Date.now() - startedAt) / 1_000).toFixed(1)}s`)
  if (verdict.timelines) console.log(verdict.timelines)
  expect(verdict.problems, `${verdict.summary}\n${verdict.timelines}`).toEqual([])
  expect(plan.missed(verdict)).toBeUndefined()
}

/** How many attempts failed in a way only the fault explains: 503 from the store, or a broken connection. */
function failedAttempts(verdict: Verdict): number {
  let n = 0
  for (const [outcome, count] of verdict.outcomes) if (!/^\d+$/.test(outcome) || outcome === '503') n += count
  return n
}

const biteIfFailed = (verdict: Verdict) => (failedAttempts(verdict) > 0 ? undefined : 'no request failed: the fault missed the load')
const biteIfSlow = (verdict: Verdict) =>
  verdict.slowestMs >= 2_000 ? undefined : `the slowest request took ${verdict.slowestMs} ms: the freeze missed the load`

describe.skipIf(pgSkip !== undefined)('faults: 2 proxies sharing a throwaway PostgreSQL', () => {
  let server: ThrowawayServer
  let dataDir = ''
  let socketDir = ''
  let frozen: PostgresTree | undefined
  const upstream = new CountingUpstream(30)
  const openStore = () => new PostgresStore({ connectionString: server.url, max: 2 })

  beforeAll(async () => {
    assertBuilt()
    server = await startThrowaway()
    const client = new pg.Client({ connectionString: server.url })
    await client.connect()
    try {
      dataDir = (await client.query('SHOW data_directory')).rows[0].data_directory
      socketDir = String((await client.query('SHOW unix_socket_directories')).rows[0].unix_socket_directories)
        .split(',')[0]
        ?.trim() as string
    } finally {
      await client.end()
    }
    await upstream.start()
  })
  afterAll(async () => {
    if (frozen) thawPostgres(frozen)
    await upstream.close()
    await server?.destroy()
  })

  it(
    'SIGKILL of every PostgreSQL process mid-load, restarted 3 s later: no key runs twice, every executed key is recorded',
    async () => {
      await runFault({
        name: 'pg-sigkill',
        storeUrl: server.url,
        upstream,
        openStore,
        inject: async ({ mark, strike }) => {
          await strike()
          mark('SIGKILL every PostgreSQL process')
          const tree = await killPostgres(dataDir)
          mark(`PostgreSQL gone (postmaster ${tree.postmaster} and ${tree.children.length} children)`)
          await sleep(OUTAGE_MS)
          removeStaleLocks(dataDir, socketDir, server.port)
          mark('restarting PostgreSQL')
          await server.start()
          mark('PostgreSQL accepts connections again')
          return undefined
        },
        missed: biteIfFailed,
      })
    },
    TEST_TIMEOUT_MS,
  )

  it(
    'SIGSTOP of the postmaster and its children for 3 s, then SIGCONT: no key runs twice, every executed key is recorded',
    async () => {
      await runFault({
        name: 'pg-sigstop',
        storeUrl: server.url,
        upstream,
        openStore,
        inject: async ({ mark, strike }) => {
          await strike()
          mark('SIGSTOP every PostgreSQL process')
          frozen = freezePostgres(dataDir)
          try {
            await sleep(OUTAGE_MS)
          } finally {
            thawPostgres(frozen)
            frozen = undefined
            mark('SIGCONT every PostgreSQL process')
          }
          return undefined
        },
        missed: biteIfSlow,
      })
    },
    TEST_TIMEOUT_MS,
  )

  it(
    'SIGKILL of one proxy mid-load: clients fail over; only keys in flight at it may run again, after their lease',
    async () => {
      await runFault({
        name: 'proxy-sigkill',
        storeUrl: server.url,
        upstream,
        openStore,
        inject: async ({ proxies, load, mark, strike }) => {
          const victim = proxies[1] as ProxyProcess
          await strike(victim.port)
          // Taken in the same tick as the kill: nothing can be sent in between.
          const open = load.openAt(1)
          victim.child.kill('SIGKILL')
          mark(`SIGKILL proxy 1 (${open.size} keys in flight at it)`)
          await victim.exited
          return open
        },
        // The executions it struck at proxy 1 have no stored outcome: each must run once more, after the lease.
        missed: (verdict) =>
          biteIfFailed(verdict) ?? (verdict.allowedDoubles.length > 0 ? undefined : 'no key in flight at proxy 1 ran again'),
      })
    },
    TEST_TIMEOUT_MS,
  )
})

describe.skipIf(redisSkip !== undefined)('faults: 2 proxies sharing a throwaway Redis (appendonly yes, appendfsync always)', () => {
  let redis: RedisServer
  let dir: { path: string; remove(): void }
  let stoppedPid: number | undefined
  const upstream = new CountingUpstream(30)
  const openStore = () => new RedisStore({ url: redis.url })

  /** The server's pid, from INFO (the fixture keeps its child process to itself). */
  async function redisPid(): Promise<number> {
    const client = new Redis(redis.port, '127.0.0.1', { maxRetriesPerRequest: 1 })
    try {
      const match = /process_id:(\d+)/.exec(await client.info('server'))
      if (!match) throw new Error('INFO server has no process_id')
      return Number(match[1])
    } finally {
      client.disconnect()
    }
  }

  beforeAll(async () => {
    assertBuilt()
    dir = tempDir('faults')
    redis = new RedisServer(await freePort(), dir.path, ['--appendonly', 'yes', '--appendfsync', 'always'])
    await redis.start()
    await upstream.start()
  })
  afterAll(async () => {
    if (stoppedPid !== undefined) signalAll([stoppedPid], 'SIGCONT')
    await upstream.close()
    await redis?.stop('SIGKILL')
    dir?.remove()
  })

  it(
    'SIGKILL of Redis mid-load, restarted 3 s later on its AOF: no key runs twice, every executed key is recorded',
    async () => {
      await runFault({
        name: 'redis-sigkill',
        storeUrl: redis.url,
        upstream,
        openStore,
        inject: async ({ mark, strike }) => {
          await strike()
          mark('SIGKILL redis-server')
          await redis.stop('SIGKILL')
          mark('redis-server gone')
          await sleep(REDIS_RESTART_MS)
          mark('restarting redis-server')
          await redis.start()
          mark('redis-server answers again')
          return undefined
        },
        missed: biteIfFailed,
      })
    },
    TEST_TIMEOUT_MS,
  )

  it(
    'SIGSTOP of Redis for 3 s, then SIGCONT: no key runs twice, every executed key is recorded',
    async () => {
      const pid = await redisPid()
      await runFault({
        name: 'redis-sigstop',
        storeUrl: redis.url,
        upstream,
        openStore,
        inject: async ({ mark, strike }) => {
          await strike()
          mark('SIGSTOP redis-server')
          stoppedPid = pid
          signalAll([pid], 'SIGSTOP')
          try {
            await sleep(OUTAGE_MS)
          } finally {
            signalAll([pid], 'SIGCONT')
            stoppedPid = undefined
            mark('SIGCONT redis-server')
          }
          return undefined
        },
        missed: biteIfSlow,
      })
    },
    TEST_TIMEOUT_MS,
  )
})
