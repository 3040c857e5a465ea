/**
 * RedisStore on a Redis Cluster (issue 27, item 4): what a record costs in memory, how the records
 * spread over the masters, and throughput with Redis CPU per operation with 1, 3 and 6 masters.
 *
 * Each cluster is the bench's own (redis-server children on free loopback ports, no replicas, stopped at
 * the end); the shared Redis on 6379 is not used.
 *
 * - Bytes per record: `--records` completed records per body size, then `MEMORY USAGE <key> SAMPLES 0`
 *   summed over every key the store wrote (SCAN on each master), beside the growth of `used_memory` summed
 *   over the masters (which adds the expiry entry, the cluster's slot-to-key index and allocator slack).
 * - Spread: records per master (DBSIZE) after the throughput run, as max / mean.
 * - Throughput: new keys (acquire + complete: two scripts) and replays (one acquire of a completed key) at
 *   `--callers` concurrent callers from this one process, for `--ms` each, in `--rounds` alternating rounds;
 *   Redis CPU is the sum of `used_cpu_user + used_cpu_sys` over the masters, per operation.
 *
 * On the 2-core machine the client (this Node process, one core) is the limit long before 3 or 6
 * masters are: more masters split the same Redis CPU per operation over more processes, they do not
 * add cores. The per-operation CPU and the memory are what carry over to a real cluster.
 * Run alone: npx tsx bench/redis-cluster.bench.ts [--records 5000] [--ms 3000] [--rounds 2] [--callers 50]
 */
import { randomUUID } from 'node:crypto'
import { Cluster, Redis } from 'ioredis'
import { RedisStore } from '../src/backends/redis/index.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import type { Outcome } from '../src/core/store.js'
import { RedisCluster } from '../test/fixtures/redis/servers.js'
import { fmt, numberArg, report, table } from './lib.js'

const RECORDS = numberArg('records', 5_000)
const MS = numberArg('ms', 3_000)
const ROUNDS = numberArg('rounds', 2)
const CALLERS = numberArg('callers', 50)
const BODIES = [16, 256, 1_024, 4_096]
const MASTERS = [1, 3, 6]
const WINDOW = 4.32e8
const fp = fingerprintOf({ amount: 100 })
const scope = 'bench'

const outcomeOf = (bytes: number): Outcome => ({
  status: 'completed',
  response: { status: 201, headers: { 'content-type': 'application/json' }, body: new Uint8Array(bytes).fill(97) },
})

/** One direct connection per master, for INFO, DBSIZE, SCAN and MEMORY USAGE. */
function masterConnections(cluster: RedisCluster): Redis[] {
  return cluster.nodes.map(({ host, port }) => new Redis(port, host, { maxRetriesPerRequest: 1 }))
}

async function infoNumber(node: Redis, section: string, field: string): Promise<number> {
  const text = (await node.info(section)) as string
  const line = text.split('\r\n').find((l) => l.startsWith(`${field}:`))
  return Number(line?.slice(field.length + 1))
}

/** Redis CPU seconds (user + sys) summed over the masters. */
async function redisCpu(nodes: Redis[]): Promise<number> {
  let total = 0
  for (const node of nodes) total += (await infoNumber(node, 'cpu', 'used_cpu_user')) + (await infoNumber(node, 'cpu', 'used_cpu_sys'))
  return total
}

async function usedMemory(nodes: Redis[]): Promise<number> {
  let total = 0
  for (const node of nodes) total += await infoNumber(node, 'memory', 'used_memory')
  return total
}

/** Sum of MEMORY USAGE over every key under `prefix`, and how many keys that was. */
async function memoryUsage(nodes: Redis[], prefix: string): Promise<{ bytes: number; keys: number }> {
  let bytes = 0
  let keys = 0
  for (const node of nodes) {
    let cursor = '0'
    do {
      const [next, batch] = (await node.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1_000)) as [string, string[]]
      cursor = next
      for (const key of batch) {
        bytes += Number(await node.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'))
        keys++
      }
    } while (cursor !== '0')
  }
  return { bytes, keys }
}

async function inParallel(callers: number, count: number, op: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (next < count) await op(next++)
    }),
  )
}

/** What the masters spend per second doing nothing (cron, cluster bus), to subtract from a measurement. */
async function idleCpuPerSecond(nodes: Redis[]): Promise<number> {
  const cpu0 = await redisCpu(nodes)
  const start = performance.now()
  await new Promise((resolve) => setTimeout(resolve, 1_000))
  return ((await redisCpu(nodes)) - cpu0) / ((performance.now() - start) / 1_000)
}

/**
 * Runs `op` for `ms` at `callers`; returns operations, elapsed seconds, client CPU seconds and Redis CPU
 * seconds above the masters' idle rate (`idle` per second).
 */
async function timed(nodes: Redis[], ms: number, callers: number, op: (i: number) => Promise<unknown>, idle = 0) {
  const cpu0 = await redisCpu(nodes)
  const client0 = process.cpuUsage()
  let done = 0
  let counter = 0
  const start = performance.now()
  const end = start + ms
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (performance.now() < end) {
        await op(counter++)
        done++
      }
    }),
  )
  const seconds = (performance.now() - start) / 1_000
  const client = process.cpuUsage(client0)
  const redis = (await redisCpu(nodes)) - cpu0 - idle * seconds
  return { done, seconds, clientCpu: (client.user + client.system) / 1e6, redisCpu: Math.max(0, redis) }
}

const memoryRows: Array<Array<string | number>> = []
const throughputRows: Array<Array<string | number>> = []
const spreadRows: Array<Array<string | number>> = []
let perRecord1k = Number.NaN
let warmed = false

for (const masters of MASTERS) {
  const cluster = new RedisCluster(masters)
  await cluster.start()
  console.log(`${masters} master(s) up: ${cluster.nodes.map((n) => n.port).join(', ')}`)
  const nodes = masterConnections(cluster)
  const client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 }, enableAutoPipelining: true })
  try {
    if (masters === 3) {
      // Memory per record, on the 3-master cluster (a record's cost does not depend on the master count).
      // The first size is written twice: the first pass grows the servers' own tables, not only records.
      for (const bytes of [BODIES[0] as number, ...BODIES]) {
        const prefix = `mem${bytes}`
        const store = new RedisStore({ client, prefix })
        const outcome = outcomeOf(bytes)
        const before = await usedMemory(nodes)
        await inParallel(CALLERS, RECORDS, async (i) => {
          const key = `k-${i}`
          const acquired = await store.acquire(scope, key, fp, 30_000)
          if (acquired.kind !== 'acquired') throw new Error(`${key}: ${acquired.kind}`)
          await store.complete(scope, key, acquired.token, outcome, 86_400_000)
        })
        const grown = (await usedMemory(nodes)) - before
        const usage = await memoryUsage(nodes, prefix)
        if (usage.keys !== RECORDS) console.warn(`expected ${RECORDS} keys under ${prefix}, found ${usage.keys}`)
        const perRecord = usage.bytes / RECORDS
        for (const node of nodes) await node.flushall()
        if (memoryRows.length === 0 && warmed === false) {
          warmed = true
          continue
        }
        if (bytes === 1_024) perRecord1k = grown / RECORDS
        memoryRows.push([fmt(bytes), fmt(usage.keys / RECORDS, 1), fmt(perRecord), fmt(grown / RECORDS)])
      }
    }

    const prefix = `tp-${randomUUID().slice(0, 6)}`
    const store = new RedisStore({ client, prefix })
    const outcome = outcomeOf(256)
    // The replay keys, completed once.
    const replayKeys = 1_000
    await inParallel(CALLERS, replayKeys, async (i) => {
      const acquired = await store.acquire(scope, `replay-${i}`, fp, 30_000)
      if (acquired.kind === 'acquired') await store.complete(scope, `replay-${i}`, acquired.token, outcome, 3_600_000)
    })
    let fresh = 0
    const newKey = async () => {
      const key = `new-${fresh++}`
      const acquired = await store.acquire(scope, key, fp, 30_000)
      if (acquired.kind !== 'acquired') throw new Error(`${key}: ${acquired.kind}`)
      await store.complete(scope, key, acquired.token, outcome, 3_600_000)
    }
    const replay = async (i: number) => {
      const result = await store.acquire(scope, `replay-${i % replayKeys}`, fp, 30_000)
      if (result.kind !== 'replay') throw new Error(`replay-${i % replayKeys}: ${result.kind}`)
    }
    console.log('  replay keys written; measuring')
    await timed(nodes, 500, CALLERS, newKey) // warm-up
    const idle = await idleCpuPerSecond(nodes)
    const totals = {
      newKeys: { done: 0, seconds: 0, clientCpu: 0, redisCpu: 0 },
      replays: { done: 0, seconds: 0, clientCpu: 0, redisCpu: 0 },
    }
    for (let round = 0; round < ROUNDS; round++) {
      for (const [name, op] of [
        ['newKeys', newKey],
        ['replays', replay],
      ] as const) {
        const r = await timed(nodes, MS, CALLERS, op, idle)
        const t = totals[name]
        t.done += r.done
        t.seconds += r.seconds
        t.clientCpu += r.clientCpu
        t.redisCpu += r.redisCpu
      }
    }
    const us = (seconds: number, done: number) => fmt((seconds * 1e6) / done, 1)
    throughputRows.push([
      masters,
      fmt(totals.newKeys.done / totals.newKeys.seconds),
      us(totals.newKeys.redisCpu, totals.newKeys.done),
      us(totals.newKeys.clientCpu, totals.newKeys.done),
      fmt(totals.replays.done / totals.replays.seconds),
      us(totals.replays.redisCpu, totals.replays.done),
      us(totals.replays.clientCpu, totals.replays.done),
    ])
    const sizes: number[] = []
    for (const node of nodes) sizes.push(await node.dbsize())
    const mean = sizes.reduce((a, b) => a + b, 0) / sizes.length
    spreadRows.push([masters, sizes.map((n) => fmt(n)).join(' / '), fmt(Math.max(...sizes) / mean, 3)])
  } finally {
    client.disconnect()
    for (const node of nodes) node.disconnect()
    await cluster.stop()
  }
}

const gib = (bytes: number) => fmt(bytes / 2 ** 30)
const sizing = [3, 6, 12, 24].map((masters) => [masters, gib((perRecord1k * WINDOW) / masters), gib((2 * perRecord1k * WINDOW) / masters)])

const command = `npx tsx bench/redis-cluster.bench.ts --records ${RECORDS} --ms ${MS} --rounds ${ROUNDS} --callers ${CALLERS}`
report(
  'redis-cluster',
  'Redis Cluster: bytes per record, spread over masters, throughput and Redis CPU per operation',
  command,
  [
    `Bytes per record (${fmt(RECORDS)} completed records per body size, 3 masters): \`MEMORY USAGE\` summed over the keys the store wrote, and the growth of \`used_memory\` over the masters (which also counts the expiry entry, the cluster's slot index and allocator slack).`,
    '',
    table(['body (bytes)', 'keys per record', 'MEMORY USAGE per record', 'used_memory growth per record'], memoryRows),
    '',
    `Throughput from one Node.js client process at ${CALLERS} callers (${ROUNDS} rounds of ${MS} ms each, alternating), body 256 B. Redis CPU is \`used_cpu_user + used_cpu_sys\` summed over the masters, less their idle rate measured over a second before, per operation; client CPU is this process's. A new key is two scripts (acquire, complete), a replay one.`,
    '',
    table(
      [
        'masters',
        'new keys/s',
        'Redis CPU us per new key',
        'client CPU us per new key',
        'replays/s',
        'Redis CPU us per replay',
        'client CPU us per replay',
      ],
      throughputRows,
    ),
    '',
    'Records per master after the throughput run (each record is one key named by a digest of scope and key, so slots spread them evenly):',
    '',
    table(['masters', 'keys per master', 'max / mean'], spreadRows),
    '',
    `Sizing for ${fmt(WINDOW)} records (5,000 writes/s x 24 h) at ${fmt(perRecord1k)} bytes per record (body 1 KiB, \`used_memory\` growth above): memory per master, without and with one replica per master counted on the same hosts.`,
    '',
    table(['masters', 'GiB per master', 'GiB per master, with a replica each'], sizing),
    '',
    'What 2 cores cannot show: one client process and every master share two cores, so new keys/s here is bounded by the machine, not by the cluster; on separate hosts each master brings its own core and the Redis CPU per operation divides among them. The per-operation CPU and the bytes per record are the figures that carry over.',
  ].join('\n'),
)
