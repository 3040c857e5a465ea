import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { RedisStore } from '../src/stores/redis/index.js'
import { describeStore, describeStoreModel } from '../src/testing/index.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)

/** Deletes every key under a prefix: the suites' records (they expire anyway). */
async function dropPrefix(prefix: string): Promise<void> {
  const redis = new Redis(URL)
  try {
    let cursor = '0'
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000)
      if (keys.length > 0) await redis.del(...keys)
      cursor = next
    } while (cursor !== '0')
  } finally {
    redis.disconnect()
  }
}

const urlPrefix = `idemkey-test-${randomUUID()}`
describeStore('redis (url)', () => new RedisStore({ url: URL, prefix: urlPrefix }), {
  skip,
  teardown: () => dropPrefix(urlPrefix),
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
      await dropPrefix(clientPrefix)
      client?.disconnect()
    },
  },
)

const modelPrefix = `idemkey-test-${randomUUID()}`
describeStoreModel('redis', () => new RedisStore({ url: URL, prefix: modelPrefix }), {
  skip,
  teardown: () => dropPrefix(modelPrefix),
})
