import { randomUUID } from 'node:crypto'
import { Redis } from 'ioredis'
import { RedisStore } from '../src/backends/redis/index.js'
import { describeLedgerProcesses } from './helpers/ledger-processes.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'redis://127.0.0.1:6379'
const skip = await serviceSkipReason('Redis', 6379)
const prefix = `idemkey-test-${randomUUID()}`

describe.skipIf(skip !== undefined)('RedisStore across crashing processes', () => {
  const client = new Redis(URL, { maxRetriesPerRequest: 1 })
  const store = new RedisStore({ client, prefix })
  afterAll(async () => {
    const keys = await client.keys(`${prefix}*`)
    if (keys.length > 0) await client.del(...keys)
    client.disconnect()
  })
  describeLedgerProcesses({ url: () => `${URL}?prefix=${prefix}`, store: () => store })
})
