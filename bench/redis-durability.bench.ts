/**
 * What RedisStore's `durability: { replicas: 1 }` costs: acquire + complete cycles/s on a primary with
 * one replica, with and without the wait for the replica (WAIT 1 after the acquisition and after the
 * completion), at 1 and 16 callers. Starts its own primary and replica (redis-server, no persistence) on
 * free loopback ports, so nothing else runs on them; the two stores alternate in slices, so a
 * neighbour's load on a shared machine falls on both alike.
 * Run alone: npx tsx bench/redis-durability.bench.ts [--ms 1500] [--rounds 3]
 */
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { RedisStore } from '../src/backends/redis/index.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import type { Outcome } from '../src/core/store.js'
import { freePort, RedisServer, tempDir } from '../test/fixtures/redis/servers.js'
import { fmt, numberArg, opsPerSecond, report, table } from './lib.js'

const MS = numberArg('ms', 1_500)
const ROUNDS = numberArg('rounds', 3)
const CALLERS = [1, 16]
const fp = fingerprintOf({ amount: 100 })
const body = new TextEncoder().encode('{"id":"ch_1","amount":100}')
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: { 'content-type': 'application/json' }, body } }

const dir = tempDir('durability-bench')
const primary = new RedisServer(await freePort(), `${dir.path}`, ['--appendonly', 'no'])
await primary.start()
const replicaDir = tempDir('durability-bench-replica')
const replica = new RedisServer(await freePort(), replicaDir.path, ['--appendonly', 'no', '--replicaof', '127.0.0.1', String(primary.port)])
await replica.start()
const admin = new Redis(primary.port, '127.0.0.1')
while (!/slave0:.*state=online/.test(await admin.info('replication'))) await sleep(50)

const stores = {
  async: new RedisStore({ url: primary.url, prefix: `bench-${randomUUID().slice(0, 8)}` }),
  durable: new RedisStore({ url: primary.url, prefix: `bench-${randomUUID().slice(0, 8)}`, durability: { replicas: 1, timeout: '1s' } }),
}
const scope = 'bench'

/** One acquire + complete of a new key. */
const cycle = (store: RedisStore) => async (i: number) => {
  const key = `k${i}-${randomUUID()}`
  const acquired = await store.acquire(scope, key, fp, 30_000)
  if (acquired.kind !== 'acquired') throw new Error(`unexpected ${acquired.kind}`)
  await store.complete(scope, key, acquired.token, outcome, 3_600_000)
}

const rates: Record<string, Record<number, number[]>> = { async: {}, durable: {} }
try {
  for (let round = 0; round < ROUNDS; round++) {
    for (const callers of CALLERS) {
      for (const name of ['async', 'durable'] as const) {
        const rate = await opsPerSecond(cycle(stores[name]), MS, callers)
        ;(rates[name] as Record<number, number[]>)[callers] = [...((rates[name] as Record<number, number[]>)[callers] ?? []), rate]
      }
    }
  }
} finally {
  await stores.async.close()
  await stores.durable.close()
  admin.disconnect()
  await replica.stop('SIGKILL')
  await primary.stop('SIGKILL')
  dir.remove()
  replicaDir.remove()
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] as number
const rows = CALLERS.map((callers) => {
  const a = median(rates.async?.[callers] ?? [])
  const d = median(rates.durable?.[callers] ?? [])
  return [String(callers), fmt(a), fmt(d), fmt(d / a, 2)]
})
report(
  'redis-durability',
  'Redis: the cost of durability (WAIT for a replica)',
  `npx tsx bench/redis-durability.bench.ts --ms ${MS} --rounds ${ROUNDS}`,
  `Acquire + complete cycles/s of new keys on a primary with one replica on loopback (Redis ${(await import('node:child_process')).execFileSync('redis-server', ['--version'], { encoding: 'utf8' }).match(/v=(\S+)/)?.[1]}), median of ${ROUNDS} rounds of ${MS} ms, the two stores alternating. durable: \`durability: { replicas: 1 }\` (a WAIT 1 after the acquisition and after the completion, shared by the writes answered while one is in flight).\n\n${table(['callers', 'asynchronous', 'durable', 'durable / asynchronous'], rows)}`,
)
