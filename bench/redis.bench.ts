/**
 * RedisStore benchmark: acquire+complete cycles/s, replays/s and Ledger.run cycles/s at 1, 10 and
 * 50 concurrent callers, beside a raw SET loop through the same kind of ioredis client and
 * `redis-benchmark -t set` (when installed), measured in the same run against the same server.
 * A cycle is two round trips (acquire, complete), so its ceiling is about half the raw SET rate.
 * The columns of one caller count are measured in interleaved slices (raw SET, cycles, replays,
 * Ledger.run, then again), each warmed up first, so a neighbour's load on a shared machine falls
 * on all of them alike; the CPU each side spends per operation is recorded too.
 * Needs Redis on 127.0.0.1:6379, or REDIS_URL.
 * Run alone: npx tsx bench/redis.bench.ts [--ms 2000] [--rounds 4]
 */
import { execFileSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { RedisStore } from '../src/backends/redis/index.js'
import { acquireLua } from '../src/backends/redis/lua.generated.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import { Ledger } from '../src/core/ledger.js'
import type { Outcome } from '../src/core/store.js'
import { dropPrefix } from '../test/helpers/redis.js'
import { fmt, report, table } from './lib.js'

const msArg = process.argv.indexOf('--ms')
const MS = msArg > 0 ? Number(process.argv[msArg + 1]) : 2_000
const roundsArg = process.argv.indexOf('--rounds')
const ROUNDS = roundsArg > 0 ? Number(process.argv[roundsArg + 1]) : 4
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

/** The server's own ceiling for the acquire script: redis-benchmark EVALSHA on new keys (a fresh key space per call). */
async function acquireScriptCeiling(clients: number): Promise<number> {
  const sha = (await raw.script('LOAD', acquireLua)) as string
  const space = `${prefix}:rbacq:${randomUUID().slice(0, 8)}`
  // The record key and its steps key (untouched by a new key), then fingerprint, identity ('1|1|' scope key), lease, retention, grace.
  return redisBenchmark(clients, [
    'evalsha',
    sha,
    '2',
    `${space}:r:__rand_int__`,
    `${space}:t:__rand_int__`,
    fp,
    '1|1|sk',
    '30000',
    '60000',
    '1000',
  ])
}

/** CPU seconds the Redis server has used (user + system), from INFO. */
async function serverCpuSeconds(): Promise<number> {
  const info = await raw.info('cpu')
  const field = (name: string) => Number(info.match(new RegExp(`${name}:([0-9.]+)`))?.[1] ?? Number.NaN)
  return field('used_cpu_user') + field('used_cpu_sys')
}

/** Calls and µs so far of some commands, from INFO commandstats (what the server spent inside each). */
async function commandStats(): Promise<Record<'set' | 'evalsha', { calls: number; usec: number }>> {
  const info = await raw.info('commandstats')
  const stat = (name: string) => {
    const match = info.match(new RegExp(`cmdstat_${name}:calls=(\\d+),usec=(\\d+)`))
    return { calls: Number(match?.[1] ?? 0), usec: Number(match?.[2] ?? 0) }
  }
  return { set: stat('set'), evalsha: stat('evalsha') }
}

/** CPU µs per operation: this process (client) and the Redis server. */
interface Cpu {
  client: number
  server: number
}

interface Tally {
  done: number
  ms: number
  /** CPU µs of this process (the store or the raw client, and the loop) and of the Redis server. */
  clientCpuUs: number
  serverCpuUs: number
}

/**
 * Runs each op for about `ms` in all, with `callers` concurrent callers, in `ROUNDS` interleaved
 * slices after a warm-up slice of each, and tallies operations, time and CPU on both sides.
 */
async function interleaved(
  ops: Record<string, (i: number) => Promise<unknown>>,
  ms: number,
  callers: number,
): Promise<Record<string, Tally>> {
  let counter = 0
  const slice = async (op: (i: number) => Promise<unknown>, sliceMs: number) => {
    let done = 0
    const start = performance.now()
    const end = start + sliceMs
    await Promise.all(
      Array.from({ length: callers }, async () => {
        while (performance.now() < end) {
          await op(counter++)
          done++
        }
      }),
    )
    return { done, ms: performance.now() - start }
  }
  const tallies: Record<string, Tally> = {}
  for (const [name, op] of Object.entries(ops)) {
    await slice(op, Math.min(300, ms / 4))
    tallies[name] = { done: 0, ms: 0, clientCpuUs: 0, serverCpuUs: 0 }
  }
  for (let round = 0; round < ROUNDS; round++) {
    for (const [name, op] of Object.entries(ops)) {
      const tally = tallies[name] as Tally
      const server = await serverCpuSeconds()
      const client = process.cpuUsage()
      const { done, ms: took } = await slice(op, ms / ROUNDS)
      const used = process.cpuUsage(client)
      tally.serverCpuUs += ((await serverCpuSeconds()) - server) * 1e6
      tally.clientCpuUs += used.user + used.system
      tally.done += done
      tally.ms += took
    }
  }
  return tallies
}

async function main(): Promise<void> {
  const replayKeys = Array.from({ length: REPLAY_KEYS }, (_, i) => `replay-${i}`)
  for (const key of replayKeys) {
    const { token } = (await store.acquire(scope, key, fp, 30_000)) as { token: number }
    await store.complete(scope, key, token, outcome, 3_600_000)
  }
  const rows: Array<Array<string | number>> = []
  const ratios: Array<Array<string | number>> = []
  const costs: Array<Array<string | number>> = []
  const measured: Array<{ callers: number; ratio: number; setUs: Cpu; cycleUs: Cpu }> = []
  for (const callers of CALLERS) {
    const run = randomUUID().slice(0, 8)
    const statsBefore = await commandStats()
    const tallies = await interleaved(
      {
        rawSet: (i) => raw.set(`${prefix}:raw:${run}:${i}`, 'x', 'PX', 60_000),
        cycles: async (i) => {
          const key = `cycle-${run}-${i}`
          const acquired = await store.acquire(scope, key, fp, 30_000)
          if (acquired.kind !== 'acquired') throw new Error(`expected a new key, got ${acquired.kind}`)
          await store.complete(scope, key, acquired.token, outcome, 60_000)
        },
        replays: async (i) => {
          const result = await store.acquire(scope, replayKeys[i % REPLAY_KEYS] as string, fp, 30_000)
          if (result.kind !== 'replay') throw new Error(`expected a replay, got ${result.kind}`)
        },
        runs: (i) => ledger.run({ key: `run-${run}-${i}`, scope, fingerprint: fp }, () => ({ ok: true })),
      },
      MS,
      callers,
    )
    const statsAfter = await commandStats()
    const perCall = (name: 'set' | 'evalsha') =>
      (statsAfter[name].usec - statsBefore[name].usec) / (statsAfter[name].calls - statsBefore[name].calls)
    const rate = (name: string) => {
      const tally = tallies[name] as Tally
      return (1_000 * tally.done) / tally.ms
    }
    const [rawSet, cycles, replays, runs] = [rate('rawSet'), rate('cycles'), rate('replays'), rate('runs')]
    const external = redisBenchmark(callers, ['set', `${prefix}:rbset:__rand_int__`, 'x'])
    const script = await acquireScriptCeiling(callers)
    const show = (n: number) => (Number.isNaN(n) ? '-' : fmt(n))
    rows.push([callers, fmt(rawSet), show(external), show(script), fmt(cycles), fmt(replays), fmt(runs)])
    ratios.push([callers, `${fmt((100 * cycles) / rawSet)}%`, `${fmt((100 * replays) / rawSet)}%`])
    const cpu = (name: string) => {
      const tally = tallies[name] as Tally
      return `${fmt(tally.clientCpuUs / tally.done, 1)} / ${fmt(tally.serverCpuUs / tally.done, 1)}`
    }
    costs.push([callers, cpu('rawSet'), cpu('cycles'), cpu('replays'), fmt(perCall('set'), 1), fmt(perCall('evalsha'), 1)])
    const perOp = (name: string, side: 'clientCpuUs' | 'serverCpuUs') => (tallies[name] as Tally)[side] / (tallies[name] as Tally).done
    measured.push({
      callers,
      ratio: cycles / rawSet,
      setUs: { client: perOp('rawSet', 'clientCpuUs'), server: perOp('rawSet', 'serverCpuUs') },
      cycleUs: { client: perOp('cycles', 'clientCpuUs'), server: perOp('cycles', 'serverCpuUs') },
    })
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
    'CPU per operation, in µs, of this Node process (the client and its loop) / of the Redis server (from `INFO cpu`: its whole work, network included), over the same slices; and the time Redis spent inside each SET and each script call (from `INFO commandstats`; the script calls of cycles, replays and Ledger.run together):',
    '',
    table(['callers', 'raw SET', 'acquire+complete cycle', 'replay', 'Redis µs inside a SET', 'Redis µs inside a script call'], costs),
    '',
    'A cycle is one `acquire` of a new key and one `complete` of it: two round trips, a plain `SET NX GET` (no script) and the complete script; the target is 40% of the raw SET rate through the same client. A replay is one round trip (the same `SET NX GET` returns the stored record, answered without a script when it is far from expiry). `redis-benchmark` (C, one connection per caller, no pipelining) shows what the server itself can do: its SET rate, and its rate for the acquire script alone on new keys (which the store now runs only for keys that exist: in progress, near expiry, taken over). The columns of one caller count come from interleaved slices, so load from elsewhere on the machine (2 cores, shared) falls on them alike; still, compare rows of one run, not runs.',
    '',
    verdict(measured),
  ].join('\n')
  const flags = `${msArg > 0 ? ` --ms ${MS}` : ''}${roundsArg > 0 ? ` --rounds ${ROUNDS}` : ''}`
  report('redis', 'RedisStore (Redis over loopback)', `npx tsx bench/redis.bench.ts${flags}`, body)
}

/**
 * Whether the 40% target is met, and why not when it is not, from the CPU figures of the run. The
 * client and the server mostly take turns (an auto-pipelined batch goes out, its replies come
 * back, the next batch goes out), so an operation takes about client + server CPU time.
 */
function verdict(measured: Array<{ callers: number; ratio: number; setUs: Cpu; cycleUs: Cpu }>): string {
  const missed = measured.filter((m) => m.ratio < 0.4)
  if (missed.length === 0) return 'The 40% target is met at every caller count of this run.'
  const worst = missed[missed.length - 1] as (typeof measured)[number]
  const { setUs, cycleUs } = worst
  const us = (n: number) => fmt(n, 1)
  const setBoth = setUs.client + setUs.server
  // Turn-taking: cycles / raw SET = setBoth / (cycle client + cycle server); 40% needs this much client CPU at most.
  const clientBudget = setBoth / 0.4 - cycleUs.server
  const callers = missed.map((m) => m.callers)
  return [
    `**The 40% target is not met** at ${callers.length > 1 ? `${callers.slice(0, -1).join(', ')} and ${callers.at(-1)}` : callers[0]} caller${callers.length > 1 || callers[0] !== 1 ? 's' : ''} in this run.`,
    `At ${worst.callers} callers Redis spent ${us(cycleUs.server)} µs of CPU per cycle against ${us(setUs.server)} µs per raw SET, and this process ${us(cycleUs.client)} µs against ${us(setUs.client)} µs.`,
    `The two sides mostly take turns (an auto-pipelined batch goes out, its replies come back, the next batch goes out), so the expected ratio is (${us(setUs.client)} + ${us(setUs.server)}) / (${us(cycleUs.client)} + ${us(cycleUs.server)}) = ${fmt((100 * setBoth) / (cycleUs.client + cycleUs.server))}% (measured: ${fmt(100 * worst.ratio)}%).`,
    clientBudget <= 0
      ? `The server's share alone rules 40% out: a cycle costs Redis ${us(cycleUs.server)} µs, more than 2.5 times the ${us(setBoth)} µs a raw SET costs both sides together.`
      : `The server's share alone leaves no room for 40%: a cycle costs Redis ${us(cycleUs.server)} µs, against ${us(setBoth)} µs for a raw SET on both sides together, so the client would have to spend at most ${us(clientBudget)} µs per cycle (two calls), while one raw SET alone costs it ${us(setUs.client)} µs.`,
    "Redis pays for a script call, and for each `redis.call` in it, on top of the commands themselves (see the commandstats columns); an acquire of a new key is one plain SET NX GET PX, and a complete runs GET, TIME, SET (and PEXPIRETIME for a record the plain SET wrote; PUBLISH only when someone waits): what is left is mostly the fixed price of the complete's script call (about 5 µs on this server, against about 2 µs for a SET), which only a compare-and-set could avoid (Redis 8.4 `SET ... IFEQ`). The redis-benchmark columns show the same gap between SET and the acquire script with no Node client in the way.",
    'The "about half the raw SET rate" ceiling of the issue assumed that a script costs the server what a SET does; it costs several times more.',
  ].join(' ')
}

try {
  await main()
} finally {
  await dropPrefix(URL, prefix)
  await store.close()
  raw.disconnect()
}
