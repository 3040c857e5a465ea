/**
 * What a new key's acquire and complete cost the Redis server, before and after a change of the
 * scripts, measured in one run (issue 27 item 5, docs/redis.md "What a request costs Redis").
 *
 * Starts its own redis-server on a free loopback port (so `INFO commandstats` and the process's CPU
 * hold nothing but this run's commands; the shared 6379 is never touched), then alternates blocks:
 * - `before`: the commands the store sent at commit 6462905, by hand: its `SET ... NX GET PX` of a
 *   fresh record, then `EVALSHA` of that commit's complete script (bench/redis-script-cost/), with the
 *   same arguments;
 * - `after`: today's RedisStore on the same server: `acquire` then `complete`;
 * - `peer`: for scale, what @node-idempotency's Redis storage sends for a new key: `SET ... NX PX` of its
 *   in-progress JSON, then `SET ... PX` of the response's JSON (no fence).
 * Each block resets the statistics, acquires N new keys (N callers' worth in flight at once, auto
 * pipelined like the peers bench's load), reads `usec_per_call` of SET, resets again, completes them,
 * and reads `usec_per_call` of EVALSHA (which includes the `redis.call`s inside) and of any native
 * command; the Redis process's CPU (user + system, /proc: the network work included) is read around
 * the whole block. The median (and the least) of the rounds is reported. Linux only.
 *
 * Run: npx tsx bench/redis-script-cost.ts [--keys 10000] [--rounds 3] [--inflight 50]
 */
import { createHash } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Redis } from 'ioredis'
import { encodeHeaders } from '../src/backends/records.js'
import { RedisStore, recordNames } from '../src/backends/redis/index.js'
import { packedHead, packedIdentity } from '../src/backends/redis/record.js'
import type { Outcome } from '../src/core/store.js'
import { freePort, RedisServer } from '../test/fixtures/redis/servers.js'
import { fmt, numberArg, percentile, table } from './lib.js'

const KEYS = numberArg('--keys', 10_000)
const ROUNDS = numberArg('--rounds', 3)
const INFLIGHT = numberArg('--inflight', 50)
const PREFIX = 'h4-script-cost'
const SCOPE = 'default'
const LEASE = 30_000
const RETENTION = 86_400_000
const GRACE = 60_000
const TTL = 86_400_000
const FINGERPRINT = createHash('sha256').update('a charge').digest('hex')
/** What the peers bench's route answers, as the Express adapter stores it. */
const OUTCOME: Outcome = {
  status: 'completed',
  response: {
    status: 201,
    headers: { 'content-type': 'application/json; charset=utf-8' },
    body: new TextEncoder().encode('{"id":"ch_0123456789","amount":1299}'),
  },
}
const BEFORE_COMPLETE = readFileSync(join(dirname(fileURLToPath(import.meta.url)), 'redis-script-cost', 'complete-6462905.lua'), 'utf8')

interface Costs {
  /** µs inside Redis per acquire (the SET NX GET). */
  acquire: number
  /** µs inside Redis per complete (EVALSHA with its calls, or a native SET). */
  complete: number
  /** What the complete ran, as commandstats lists it. */
  completeCommands: string
  /** µs of the Redis process's CPU per acquire + complete, network included. */
  processCpu: number
}

const dir = mkdtempSync(join(tmpdir(), 'idemkey-script-cost-'))
const server = new RedisServer(await freePort(), dir, [])
await server.start()
const redisPid = await serverPid(server.port)
const raw = new Redis(server.url, { enableAutoPipelining: true })
const store = new RedisStore({ url: server.url, prefix: PREFIX, abandonedRetention: RETENTION, expiredGrace: GRACE })
const beforeSha = (await raw.script('LOAD', BEFORE_COMPLETE)) as string

/** The pid of the redis-server listening on `port` (the fixture does not expose its child). */
async function serverPid(port: number): Promise<number> {
  const probe = new Redis(port, '127.0.0.1')
  try {
    const info = (await probe.info('server')) as string
    return Number(/process_id:(\d+)/.exec(info)?.[1])
  } finally {
    probe.disconnect()
  }
}

function processCpuMicros(): number {
  const fields = (readFileSync(`/proc/${redisPid}/stat`, 'utf8').split(') ')[1] as string).split(' ')
  return (Number(fields[11]) + Number(fields[12])) * 10_000
}

/** usec_per_call and calls of every command in INFO commandstats. */
async function commandStats(): Promise<Map<string, { calls: number; usec: number }>> {
  const info = (await raw.info('commandstats')) as string
  const stats = new Map<string, { calls: number; usec: number }>()
  for (const m of info.matchAll(/cmdstat_([^:]+):calls=(\d+),usec=(\d+)/g)) {
    stats.set(m[1] as string, { calls: Number(m[2]), usec: Number(m[3]) })
  }
  return stats
}

/** Runs `op` for keys 0..KEYS-1, INFLIGHT at a time. */
async function each(op: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0
  await Promise.all(
    Array.from({ length: INFLIGHT }, async () => {
      while (next < KEYS) await op(next++)
    }),
  )
}

/** One block: KEYS new keys acquired, then completed, by `acquire` and `complete`. */
async function block(
  round: number,
  acquire: (key: string) => Promise<unknown>,
  complete: (key: string) => Promise<unknown>,
): Promise<Costs> {
  const keyOf = (i: number) => `k-${round}-${i}-${'x'.repeat(24)}`
  const cpuBefore = processCpuMicros()
  await raw.config('RESETSTAT')
  await each((i) => acquire(keyOf(i)))
  const acquired = await commandStats()
  await raw.config('RESETSTAT')
  await each((i) => complete(keyOf(i)))
  const completed = await commandStats()
  const processCpu = (processCpuMicros() - cpuBefore) / KEYS
  const set = acquired.get('set') ?? { calls: 1, usec: 0 }
  const script = completed.get('evalsha')
  const topLevel = script ?? completed.get('set') ?? { calls: 1, usec: 0 }
  const inner = [...completed.entries()]
    .filter(([name]) => name !== 'evalsha' && name !== 'info' && name !== 'config|resetstat')
    .map(([name, s]) => `${fmt(s.calls / KEYS, 2)} ${name} ${fmt(s.usec / s.calls, 2)}`)
  await raw.flushall()
  return {
    acquire: set.usec / set.calls,
    complete: topLevel.usec / topLevel.calls,
    completeCommands: `${script ? 'evalsha 1 (' : ''}${inner.join(', ')}${script ? ')' : ''}`,
    processCpu,
  }
}

const before = (round: number) =>
  block(
    round,
    (key) => {
      const fresh = `ik100n|${LEASE}|${RETENTION}|${GRACE}|${FINGERPRINT}${packedIdentity(SCOPE, key)}`
      return raw.set(recordNames(PREFIX, SCOPE, key).key, fresh, 'PX', LEASE + RETENTION + GRACE, 'NX', 'GET')
    },
    (key) => {
      const names = recordNames(PREFIX, SCOPE, key)
      const { response } = OUTCOME
      const head = packedHead(response.status, null, encodeHeaders(response.headers))
      const body = Buffer.from(response.body).toString('utf8')
      return raw.evalsha(beforeSha, 2, names.key, names.steps, 1, 'c', head, body, TTL, GRACE, names.channel)
    },
  )
/** What @node-idempotency's Redis storage sends for a new key (its JSON, roughly): two unfenced SETs. */
const peer = (round: number) =>
  block(
    round,
    (key) => raw.set(`${PREFIX}:peer:${key}`, JSON.stringify({ status: 0, fingerPrint: FINGERPRINT }), 'PX', TTL, 'NX'),
    (key) => {
      const body = Buffer.from(OUTCOME.response.body).toString('utf8')
      const payload = {
        status: 1,
        fingerPrint: FINGERPRINT,
        response: { body, additional: { statusCode: 201, headers: OUTCOME.response.headers } },
      }
      return raw.set(`${PREFIX}:peer:${key}`, JSON.stringify(payload), 'PX', TTL)
    },
  )
const after = (round: number) =>
  block(
    round,
    (key) => store.acquire(SCOPE, key, FINGERPRINT, LEASE),
    (key) => store.complete(SCOPE, key, 1, OUTCOME, TTL),
  )

const SIDES = ['before', 'after', 'peer'] as const
const results: Record<(typeof SIDES)[number], Costs[]> = { before: [], after: [], peer: [] }
try {
  await store.acquire(SCOPE, 'warm-up', FINGERPRINT, LEASE) // opens the store's client
  for (let round = 0; round < ROUNDS; round++) {
    results.before.push(await before(round))
    results.after.push(await after(round))
    results.peer.push(await peer(round))
  }
} finally {
  await store.close()
  raw.disconnect()
  await server.stop()
  rmSync(dir, { recursive: true, force: true })
}

/**
 * Median and, in brackets, least of the rounds: usec_per_call is wall time inside Redis, so a round in
 * which the shared machine took the CPU away from Redis mid-call reads high; the least is the closest to
 * what the work itself costs.
 */
const median = (costs: Costs[], pick: (c: Costs) => number) =>
  `${fmt(percentile(costs.map(pick), 50), 2)} (${fmt(Math.min(...costs.map(pick)), 2)})`
console.log(
  table(
    [
      '',
      'acquire, µs per call',
      'complete, µs per call',
      'complete runs (calls per request, µs per call; first round)',
      'Redis process CPU per acquire + complete, µs',
    ],
    SIDES.map((side) => [
      side,
      median(results[side], (c) => c.acquire),
      median(results[side], (c) => c.complete),
      results[side][0]?.completeCommands ?? '',
      median(results[side], (c) => c.processCpu),
    ]),
  ),
)
console.log(
  `\n${ROUNDS} rounds of ${KEYS} new keys, ${INFLIGHT} in flight, alternating; medians (least). Rounds: ` +
    SIDES.map((side) => `${side} complete ${results[side].map((c) => fmt(c.complete, 2)).join('/')} µs`).join('; '),
)
