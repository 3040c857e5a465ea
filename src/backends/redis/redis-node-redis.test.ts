/**
 * RedisStore on a node-redis client (`createClient` of redis/@redis/client) the app already holds:
 * the whole store contract (watch notifications through a duplicate subscriber included) and the
 * model, against the real server.
 */
import { randomUUID } from 'node:crypto'
import { createClient } from '@redis/client'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import { RedisStore } from './index.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)

for (const suite of ['contract', 'model'] as const) {
  const prefix = `idemkey-test-node-redis-${randomUUID()}`
  let client: ReturnType<typeof createClient> | undefined
  const create = async () => {
    client = createClient({ url: URL })
    client.on('error', () => {})
    await client.connect()
    return new RedisStore({ client, prefix })
  }
  const teardown = async () => {
    await dropPrefix(URL, prefix)
    await client?.close()
  }
  if (suite === 'contract') describeStore('redis (your node-redis client)', create, { skip, teardown })
  else describeStoreModel('redis (your node-redis client)', create, { skip, teardown })
}
