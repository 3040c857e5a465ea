import { randomUUID } from 'node:crypto'
import { Cluster } from 'ioredis'
import { RedisStore } from '../src/backends/redis/index.js'
import { RedisCluster } from './fixtures/redis/servers.js'
import { describeLedgerProcesses } from './helpers/ledger-processes.js'

// The cluster is this file's own: three masters on free loopback ports, stopped in afterAll.
const cluster = new RedisCluster()
await cluster.start()
afterAll(() => cluster.stop())
const prefix = `idemkey-test-${randomUUID()}`

describe('RedisStore on a cluster across crashing processes', () => {
  const client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } })
  const store = new RedisStore({ client, prefix })
  afterAll(() => client.disconnect())
  describeLedgerProcesses({
    url: () => `cluster:${cluster.servers.map((server) => server.port).join(',')}?prefix=${prefix}`,
    store: () => store,
  })
})
