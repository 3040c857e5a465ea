/**
 * Failover of a replicated Redis under load: a primary, a replica and three sentinels on loopback
 * (test/fixtures/redis/sentinel-set.ts). Sixteen callers run a Ledger over a RedisStore that follows the
 * sentinels (ioredis `{ sentinels, name }`): mostly new keys, a third of the requests a duplicate of an
 * earlier key, every failed request retried by its caller until it gets an answer. Meanwhile the test
 * kills the primary with SIGKILL at random moments, every other time 100-400 ms after cutting its
 * replication link (the replica reconnects within a second: a network blip, then a crash), waits for the sentinels to promote the
 * replica, and starts the dead node again as the new primary's replica. What it counts:
 *
 * - lost: keys whose answer reached a caller (an executed run, or a replay) and that a later request
 *   did not replay with that same answer (it ran the work again, or replayed another answer); a last
 *   pass after the load asks every answered key once more;
 * - doubles: extra executions of the work, per key (the effect counter lives in this process, outside
 *   Redis): a key whose work ran three times counts two;
 * - unrecorded: runs answered `fenced_out` or `unrecorded` by the ledger (an answer given, no record kept).
 *
 * Asynchronous replication (no `durability`): the counts are printed (docs/redis.md quotes them), and the
 * run must lose something, which shows these counts can fail. `durability: { replicas: 1 }`: 0 lost, 0
 * doubles over 20 failovers (unrecorded answers counted and logged: see the durable test). IDEMKEY_FAILOVER_SOAK=1: 200 failovers instead.
 */
import { spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type RedisDurability, RedisStore } from '../src/backends/redis/index.js'
import { isIdempotencyError } from '../src/errors.js'
import { Ledger } from '../src/index.js'
import { MASTER_NAME, SentinelSet } from './fixtures/redis/sentinel-set.js'
import { isCI } from './helpers/services.js'

const soak = process.env.IDEMKEY_FAILOVER_SOAK === '1'
const DURABLE_FAILOVERS = soak ? 200 : 20
const ASYNC_FAILOVERS = soak ? 50 : 6
const CALLERS = 16

const missing =
  spawnSync('redis-server', ['--version']).status === 0 ? undefined : 'redis-server is not on the PATH (apt-get install redis-server)'
if (missing) {
  if (isCI()) throw new Error(`CI=${process.env.CI} and ${missing}: the failover suite needs it.`)
  console.warn(`\n!!! SKIPPED (redis-server missing): ${missing}\n`)
}

interface Counts {
  failovers: number
  answered: number
  executions: number
  lost: number
  doubles: number
  unrecorded: number
  retries: number
}

/** Runs the load over `set` while `failovers` primaries are killed; returns what it counted. */
async function failoverRun(set: SentinelSet, failovers: number, durability: RedisDurability | undefined): Promise<Counts> {
  const client = new Redis({
    sentinels: set.sentinelAddresses,
    name: MASTER_NAME,
    maxRetriesPerRequest: 1,
    connectTimeout: 1_000,
    enableAutoPipelining: true,
    retryStrategy: () => 50,
    sentinelRetryStrategy: () => 50,
  })
  client.on('error', () => {})
  const store = new RedisStore({ client, prefix: 'fo', ...(durability ? { durability } : {}) })
  const unrecordedWhy: string[] = []
  const ledger = new Ledger({
    store,
    lease: '15s',
    wait: '1s',
    storeTimeout: '5s',
    onEvent: (event) => {
      if (event.type === 'unrecorded' || event.type === 'fenced_out') {
        unrecordedWhy.push(`${event.type} ${event.key} token ${event.token}${'error' in event ? ` ${String(event.error)}` : ''}`)
      }
    },
  })
  const scope = `fo-${randomUUID()}`
  const effects = new Map<string, number>()
  const answers = new Map<string, string>()
  const lostKeys = new Set<string>()
  const counts: Counts = { failovers: 0, answered: 0, executions: 0, lost: 0, doubles: 0, unrecorded: 0, retries: 0 }
  let next = 0

  const answered = (key: string, value: string) => {
    counts.answered++
    const earlier = answers.get(key)
    if (earlier === undefined) answers.set(key, value)
    else if (earlier !== value && !lostKeys.has(key)) lostKeys.add(key)
  }

  /** One request, retried by its caller until it gets an answer (or `until` passes). */
  const request = async (key: string, until: number) => {
    while (Date.now() < until) {
      try {
        const result = await ledger.run({ scope, key, payload: { key } }, async () => {
          const n = (effects.get(key) ?? 0) + 1
          effects.set(key, n)
          counts.executions++
          return `${key}#${n}`
        })
        if (result.kind === 'executed') {
          if (result.outcome !== 'completed') counts.unrecorded++
          answered(key, result.value)
          return
        }
        if (result.kind === 'replayed') {
          answered(key, result.value)
          return
        }
        if (result.kind === 'mismatch') throw new Error(`mismatch on ${key}`)
      } catch (error) {
        if (!isIdempotencyError(error) || error.code !== 'STORE_UNAVAILABLE') throw error
      }
      counts.retries++
      await sleep(30 + Math.random() * 70)
    }
  }

  let stopping = false
  const callers = Array.from({ length: CALLERS }, async () => {
    while (!stopping) {
      const known = next > 0 && Math.random() < 1 / 3
      const key = known ? `k${Math.floor(Math.random() * next)}` : `k${next++}`
      await request(key, Date.now() + 60_000)
    }
  })

  try {
    for (let i = 0; i < failovers; i++) {
      await sleep(200 + Math.random() * 600)
      if (i % 2 === 0) {
        await set.dropReplicationLinks()
        await sleep(100 + Math.random() * 300)
      }
      const old = await set.killPrimary()
      await set.waitPromotion(old)
      await set.restartOld(old)
      counts.failovers++
    }
    await sleep(500)
  } finally {
    stopping = true
    await Promise.all(callers)
  }
  // The last pass: every answered key once more, which must replay its answer.
  const keys = [...answers.keys()]
  for (let i = 0; i < keys.length; i += 64) {
    await Promise.all(keys.slice(i, i + 64).map((key) => request(key, Date.now() + 30_000)))
  }
  if (unrecordedWhy.length > 0) console.log(`answers without a record: ${unrecordedWhy.slice(0, 5).join('; ')}`)
  counts.lost = lostKeys.size
  for (const n of effects.values()) counts.doubles += n - 1
  await store.close()
  client.disconnect()
  return counts
}

describe.skipIf(missing)('RedisStore through a Sentinel failover (kill -9 of the primary under load)', () => {
  let set: SentinelSet
  beforeAll(async () => {
    set = new SentinelSet({ replicas: 1 })
    await set.start()
  }, 60_000)
  afterAll(async () => {
    await set?.stop()
  })

  it('loses acknowledged records with asynchronous replication (no durability): counts reported', async () => {
    const counts = await failoverRun(set, ASYNC_FAILOVERS, undefined)
    console.log(`redis failover, asynchronous replication: ${JSON.stringify(counts)}`)
    expect(counts.failovers).toBe(ASYNC_FAILOVERS)
    // The same load and checks as the durable test below, without the WAIT: they must find the loss,
    // or they could not fail there either.
    expect(counts.lost + counts.doubles).toBeGreaterThan(0)
  }, 480_000)

  it(
    'durability { replicas: 1 }: no acknowledged record lost, no effect run twice over 20 failovers',
    async () => {
      const counts = await failoverRun(set, DURABLE_FAILOVERS, { replicas: 1, timeout: '1s' })
      console.log(`redis failover, durability { replicas: 1 }: ${JSON.stringify(counts)}`)
      expect(counts.failovers).toBe(DURABLE_FAILOVERS)
      expect(counts.answered).toBeGreaterThan(DURABLE_FAILOVERS * 20)
      // What the durable mode promises: no acknowledged record lost, no effect run twice. An answer the ledger
      // released `unrecorded` (the replicas confirmed none of its completion's retries for a whole lease, so
      // the ledger's store-outage rule answers the caller and reports it) is counted and logged above, and its
      // key is audited like any other by the lost and doubles counts. CI saw 2 in 20 failovers once.
      expect({ lost: counts.lost, doubles: counts.doubles }).toEqual({ lost: 0, doubles: 0 })
    },
    soak ? 3_600_000 : 480_000,
  )
})
