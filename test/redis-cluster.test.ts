import { createHash, randomUUID } from 'node:crypto'
import { Cluster, Redis } from 'ioredis'
import { RedisStore } from '../src/backends/redis/index.js'
import { describeStore, describeStoreModel } from '../src/testing/index.js'
import { raceProcesses } from './fixtures/redis/racers.js'
import { RedisCluster } from './fixtures/redis/servers.js'

// The cluster is this file's own: three masters on free loopback ports, stopped in afterAll.
const cluster = new RedisCluster()
await cluster.start()
afterAll(() => cluster.stop())

function clusterClient(): Cluster {
  return new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } })
}

let contractClient: Cluster | undefined
describeStore(
  'redis cluster (3 masters)',
  () => {
    contractClient = clusterClient()
    return new RedisStore({ client: contractClient, prefix: `idemkey-test-${randomUUID()}` })
  },
  { teardown: () => contractClient?.disconnect() },
)

let modelClient: Cluster | undefined
describeStoreModel(
  'redis cluster (3 masters)',
  () => {
    modelClient = clusterClient()
    return new RedisStore({ client: modelClient, prefix: `idemkey-test-${randomUUID()}` })
  },
  { numRuns: 1_000, teardown: () => modelClient?.disconnect() },
)

describe('RedisStore on a cluster across processes', () => {
  it('runs each of 200 keys exactly once when 3 processes run them all at once through the cluster', async () => {
    const prefix = `idemkey-test-${randomUUID()}`
    const counter = `${prefix}:executions`
    const target = cluster.servers.map((server) => server.port).join(',')
    const reports = await raceProcesses({ mode: 'cluster', target, prefix, scope: 'procs', keys: 200, processes: 3, counter })
    const client = clusterClient()
    try {
      const executions = await client.hgetall(counter)
      expect(Object.keys(executions)).toHaveLength(200)
      for (const [key, times] of Object.entries(executions)) expect(times, key).toBe('1')
      expect(reports.reduce((sum, r) => sum + (r.seen['executed:completed'] ?? 0), 0)).toBe(200)
      expect(reports.reduce((sum, r) => sum + (r.seen.replayed ?? 0), 0)).toBe(400)
    } finally {
      client.disconnect()
    }
  })
})

describe('RedisStore on a cluster, when the cluster misbehaves', () => {
  const scope = () => `cluster-${randomUUID()}`
  const fp = (label: string) => createHash('sha256').update(label).digest('hex')

  it('spreads records over every master, and list and purge reach all of them', async () => {
    const client = clusterClient()
    const store = new RedisStore({ client, prefix: `idemkey-test-${randomUUID()}` })
    try {
      const s = scope()
      const keys = Array.from({ length: 30 }, (_, i) => `k${i}`)
      for (const key of keys) expect((await store.acquire(s, key, fp('a'), 60_000)).kind).toBe('acquired')
      const perNode = await Promise.all(
        client.nodes('master').map(async (node) => (await node.scan('0', 'MATCH', `${store.prefix}:r:*`, 'COUNT', 10_000))[1].length),
      )
      expect(perNode).toHaveLength(3)
      for (const count of perNode) expect(count).toBeGreaterThan(0)
      expect((await store.list({ scope: s, limit: 1_000 })).map((r) => r.key).sort()).toEqual([...keys].sort())
    } finally {
      await store.close()
      client.disconnect()
    }
  })

  it('answers STORE_UNAVAILABLE, not a wrong answer, when a plain client meets MOVED for keys on other masters', async () => {
    // A user who hands a single-node client to a cluster: two thirds of the keys live elsewhere.
    const plain = new Redis(cluster.nodes[0]?.port as number, '127.0.0.1', { maxRetriesPerRequest: 1 })
    const store = new RedisStore({ client: plain, prefix: `idemkey-test-${randomUUID()}` })
    try {
      const s = scope()
      const outcomes = await Promise.allSettled(Array.from({ length: 30 }, (_, i) => store.acquire(s, `k${i}`, fp('a'), 60_000)))
      const refused = outcomes.filter((o) => o.status === 'rejected')
      expect(refused.length).toBeGreaterThan(0)
      for (const o of refused) {
        expect(o.reason).toMatchObject({ name: 'IdempotencyError', code: 'STORE_UNAVAILABLE' })
        expect(String((o.reason as Error).cause)).toMatch(/MOVED/)
      }
      for (const o of outcomes) if (o.status === 'fulfilled') expect(o.value).toEqual({ kind: 'acquired', token: 1 })
    } finally {
      await store.close()
      plain.disconnect()
    }
  })

  // Last: it takes a master down for good.
  it('answers STORE_UNAVAILABLE while a master is down (CLUSTERDOWN), and never grants a held key twice', async () => {
    const client = clusterClient()
    const store = new RedisStore({ client, prefix: `idemkey-test-${randomUUID()}` })
    try {
      const s = scope()
      const keys = Array.from({ length: 12 }, (_, i) => `k${i}`)
      for (const key of keys) expect((await store.acquire(s, key, fp('a'), 60_000)).kind).toBe('acquired')
      await cluster.servers[2]?.stop('SIGKILL')
      // Once the survivors see the dead master (node timeout 1 s), every slot answers CLUSTERDOWN.
      const deadline = Date.now() + 30_000
      let sawDown = false
      while (!sawDown && Date.now() < deadline) {
        const outcomes = await Promise.allSettled(keys.map((key) => store.acquire(s, key, fp('a'), 60_000)))
        for (const o of outcomes) {
          if (o.status === 'fulfilled') expect(o.value.kind).toBe('in_progress')
          else {
            expect(o.reason).toMatchObject({ name: 'IdempotencyError', code: 'STORE_UNAVAILABLE' })
            if (/CLUSTERDOWN/.test(String((o.reason as Error).cause))) sawDown = true
          }
        }
      }
      expect(sawDown).toBe(true)
    } finally {
      await store.close()
      client.disconnect()
    }
  })
})
