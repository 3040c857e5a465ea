import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { dropPrefix } from '../../../test/helpers/redis.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { describeStore, describeStoreModel } from '../../testing/index.js'
import { RedisStore } from './index.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)

const urlPrefix = `idemkey-test-${randomUUID()}`
describeStore('redis (url)', () => new RedisStore({ url: URL, prefix: urlPrefix }), {
  skip,
  teardown: () => dropPrefix(URL, urlPrefix),
})

const clientPrefix = `idemkey-test-${randomUUID()}`
let client: Redis | undefined
describeStore(
  'redis (your ioredis client)',
  () => {
    client = new Redis(URL, { maxRetriesPerRequest: 1 })
    return new RedisStore({ client, prefix: clientPrefix })
  },
  {
    skip,
    teardown: async () => {
      await dropPrefix(URL, clientPrefix)
      client?.disconnect()
    },
  },
)

const modelPrefix = `idemkey-test-${randomUUID()}`
describeStoreModel('redis', () => new RedisStore({ url: URL, prefix: modelPrefix }), {
  skip,
  teardown: () => dropPrefix(URL, modelPrefix),
})
