/**
 * RedisStore benchmark: acquire+complete cycles/s, replays/s and Ledger.run cycles/s at 1, 10 and
 * 50 concurrent callers, beside a raw SET loop through the same kind of ioredis client and
 * `redis-benchmark -t set` (when installed), measured in the same run against the same server.
 * A cycle is two round trips (acquire, complete), so its ceiling is about half the raw SET rate.
 * Needs Redis on 127.0.0.1:6379, or REDIS_URL.
 * Run alone: npx tsx bench/redis.bench.ts [--ms 2000]
 */
import { execFileSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { fingerprintOf } from '../src/core/fingerprint.js'
import { Ledger } from '../src/core/ledger.js'
import { RedisStore } from '../src/stores/redis/index.js'
import { acquireLua } from '../src/stores/redis/lua.generated.js'
import type { Outcome } from '../src/stores/store.js'
import { fmt, opsPerSecond, report, table } from './lib.js'

const msArg = process.argv.indexOf('--ms')
const MS = msArg > 0 ? Number(process.argv[msArg + 1]) : 2_000
const URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379'
const CALLERS = [1, 10, 50]
const REPLAY_KEYS = 1_000
const prefix = `idemkey-bench-${randomUUID().slice(0, 8)}`
const fp = fingerprintOf({ amount: 100 })
const body = new TextEncoder().encode('{"id":"ch_1","amount":100}')
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: { 'content-type': 'application/json' }, body } }

// The same client settings RedisStore uses for a URL, so the baseline pays what the store pays.
const raw = new Redis(URL, { maxRetriesPerRequest: 1, enableAutoPipelining: true })
const store = new RedisStore({ url: URL, prefix })
const ledger = new Ledger({ store })
const scope = 'bench'

/** redis-benchmark's rate for `command` with `clients` connections, or NaN when it is not installed. */
function redisBenchmark(clients: number, command: string[]): number {
  const { hostname, port } = new globalThis.URL(URL)
  const n = clients === 1 ? 20_000 : 100_000
  try {
    const csv = execFileSync(
      'redis-benchmark',
      ['-h', hostname, '-p', port || '6379', '-n', String(n), '-c', String(clients), '-r', '1000000', '--csv', ...command],
      { encoding: 'utf8', timeout: 60_000 },
    )
    const line = csv.split('\n').filter((l) => l.trim() && !l.startsWith('"test"'))[0]
    return line ? Number(JSON.parse(`[${line}]`)[1]) : Number.NaN
  } catch (error) {
    console.warn(`redis-benchmark ${command[0]} failed: ${String((error as { stderr?: unknown }).stderr ?? error).trim()}`)
    return Number.NaN
  }
}

/** The server's own ceiling for the acquire script: redis-benchmark EVALSHA on new keys. */
async function acquireScriptCeiling(clients: number): Promise<number> {
  const sha = (await raw.script('LOAD', acquireLua)) as string
  return redisBenchmark(clients, ['evalsha', sha, '1', `${prefix}:rbacq:__rand_int__`, 's', 'k', fp, '30000', '60000', '1000'])
}

async function main(): Promise<void> {
  const replayKeys = Array.from({ length: REPLAY_KEYS }, (_, i) => `replay-${i}`)
  for (const key of replayKeys) {
    const { token } = (await store.acquire(scope, key, fp, 30_000)) as { token: number }
    await store.complete(scope, key, token, outcome, 3_600_000)
  }
  const rows: Array<Array<string | number>> = []
  const ratios: Array<Array<string | number>> = []
  for (const callers of CALLERS) {
    const run = randomUUID().slice(0, 8)
    const rawSet = await opsPerSecond((i) => raw.set(`${prefix}:raw:${run}:${i}`, 'x', 'PX', 60_000), MS, callers)
    const cycles = await opsPerSecond(
      async (i) => {
        const key = `cycle-${run}-${i}`
        const acquired = await store.acquire(scope, key, fp, 30_000)
        if (acquired.kind !== 'acquired') throw new Error(`expected a new key, got ${acquired.kind}`)
        await store.complete(scope, key, acquired.token, outcome, 60_000)
      },
      MS,
      callers,
    )
    const replays = await opsPerSecond(
      async (i) => {
        const result = await store.acquire(scope, replayKeys[i % REPLAY_KEYS] as string, fp, 30_000)
        if (result.kind !== 'replay') throw new Error(`expected a replay, got ${result.kind}`)
      },
      MS,
      callers,
    )
    const runs = await opsPerSecond(
      (i) => ledger.run({ key: `run-${run}-${i}`, scope, fingerprint: fp }, () => ({ ok: true })),
      MS,
      callers,
    )
    const external = redisBenchmark(callers, ['set', `${prefix}:rbset:__rand_int__`, 'x'])
    const script = await acquireScriptCeiling(callers)
    const show = (n: number) => (Number.isNaN(n) ? '-' : fmt(n))
    rows.push([callers, fmt(rawSet), show(external), show(script), fmt(cycles), fmt(replays), fmt(runs)])
    ratios.push([callers, `${fmt((100 * cycles) / rawSet)}%`, `${fmt((100 * replays) / rawSet)}%`])
  }
  const info = (await raw.info('server')).match(/redis_version:(\S+)/)?.[1] ?? '?'
  const persistence = await raw.config('GET', 'appendonly')
  const body = [
    `Server: Redis ${info} on the same machine (appendonly ${String((persistence as string[])[1])}), one ioredis connection each for the store and the raw loop, both with enableAutoPipelining (what RedisStore sets on a client it opens from a URL).`,
    '',
    table(
      [
        'callers',
        'raw SET/s (ioredis)',
        'redis-benchmark SET/s',
        'redis-benchmark acquire script/s',
        'acquire+complete cycles/s',
        'replays/s',
        'Ledger.run cycles/s',
      ],
      rows,
    ),
    '',
    table(['callers', 'cycles / raw SET', 'replays / raw SET'], ratios),
    '',
    'A cycle is one `acquire` of a new key and one `complete` of it: two round trips and two Lua scripts, so its ceiling is about 50% of the raw SET rate through the same client; the target is 40%. A replay is one round trip (the acquire script returns the stored record). `redis-benchmark` (C, one connection per caller, no pipelining) shows what the server itself can do: its SET rate, and its rate for the acquire script alone on new keys, which is the server-side ceiling of the first half of a cycle (each Lua script makes 3-5 `redis.call`s plus the script call itself, so the server spends several times the work of a SET on it). The server shares the machine (2 cores) with the benchmark: compare rows of one run, not runs.',
  ].join('\n')
  report('redis', 'RedisStore (Redis over loopback)', `npx tsx bench/redis.bench.ts${msArg > 0 ? ` --ms ${MS}` : ''}`, body)
}

try {
  await main()
} finally {
  let cursor = '0'
  do {
    const [next, keys] = await raw.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000)
    if (keys.length > 0) await raw.del(...keys)
    cursor = next
  } while (cursor !== '0')
  await store.close()
  raw.disconnect()
}
