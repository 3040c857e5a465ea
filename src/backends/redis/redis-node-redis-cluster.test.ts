/**
 * RedisStore on a node-redis cluster (`createCluster` of redis/@redis/client) the app already holds: the
 * whole store contract (wake-ups through a duplicate of the cluster, list and purge over every master)
 * and the model, against a real three-master cluster this file starts on free loopback ports.
 */
import { randomUUID } from 'node:crypto'
import { createCluster } from '@redis/client'
import { RedisCluster } from '../../../test/fixtures/redis/servers.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import { RedisStore } from './index.js'

const cluster = new RedisCluster()
await cluster.start()
afterAll(() => cluster.stop())

for (const suite of ['contract', 'model'] as const) {
  let client: ReturnType<typeof createCluster> | undefined
  const create = async () => {
    client = createCluster({ rootNodes: cluster.nodes.map(({ host, port }) => ({ url: `redis://${host}:${port}` })) })
    client.on('error', () => {})
    await client.connect()
    return new RedisStore({ client, prefix: `idemkey-nrc-${randomUUID()}` })
  }
  const teardown = async () => {
    await client?.close()
  }
  if (suite === 'contract') describeStore('redis cluster (your node-redis cluster, 3 masters)', create, { teardown })
  else describeStoreModel('redis cluster (your node-redis cluster, 3 masters)', create, { teardown, numRuns: 300 })
}
