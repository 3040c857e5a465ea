/**
 * consumeRedisStreams on a Redis Cluster (three masters started here, on free loopback ports): it consumes
 * through an ioredis `Cluster`, and a message given up on reaches the dead-letter stream, which must share
 * the stream's slot (one script writes both); a pair that cannot is refused at start.
 */
import { randomUUID } from 'node:crypto'
import { Cluster, type Redis } from 'ioredis'
import { isIdempotencyError } from '../src/errors.js'
import { consumeRedisStreams, RedisStreamsPublisher } from '../src/messaging/brokers/redis-streams/index.js'
import { RedisCluster } from './fixtures/redis/servers.js'
import { eventually } from './helpers/eventually.js'
import { memoryInbox } from './helpers/memory-inbox.js'

const cluster = new RedisCluster()
await cluster.start()
afterAll(() => cluster.stop())

function client(): Cluster {
  const connected = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } })
  onTestFinished(() => connected.disconnect())
  return connected
}

describe('consumeRedisStreams on a Redis Cluster', () => {
  it('consumes through a Cluster client and dead-letters a message given up on to the stream of its hash tag', async () => {
    const stream = `{orders-${randomUUID()}}`
    const admin = client()
    const publisher = new RedisStreamsPublisher({ redis: admin as unknown as Redis, stream: () => stream })
    const outbox = (id: string) => ({
      id,
      topic: 'orders',
      partitionKey: null,
      payload: Buffer.from(JSON.stringify({ id })),
      contentType: 'application/json',
      headers: {},
      createdAtMs: Date.now(),
    })
    const results = await publisher.publish(['good-1', 'poison-1', 'good-2'].map(outbox) as never)
    expect(results.every((r) => r.ok)).toBe(true)
    const inbox = memoryInbox('cluster')
    const exhausted: string[] = []
    const running = await consumeRedisStreams({
      redis: client() as unknown as Redis,
      stream,
      group: 'g',
      consumer: 'c1',
      blockMs: 100,
      claimIdleMs: 200,
      maxAttempts: 2,
      // Asks the claimed entries' delivery counts (XPENDING, pipelined) through the cluster too.
      maxDeliveries: 10,
      inbox,
      handler: (_tx, message) => {
        if (message.id === 'poison-1') throw new Error('injected: this effect always fails')
      },
      onError: (error, message) => {
        if (isIdempotencyError(error) && error.code === 'RETRIES_EXHAUSTED') exhausted.push(message.id)
      },
    })
    await eventually(async () => (await admin.xlen(`${stream}:dead-letter`)) === 1, 'the poison message dead-lettered', 10_000)
    await running.stop()
    expect(inbox.applied.sort()).toEqual(['good-1', 'good-2'])
    expect(exhausted).toEqual(['poison-1'])
    expect(Number(((await admin.xpending(stream, 'g')) as [number])[0])).toBe(0)
    await admin.del(stream, `${stream}:dead-letter`)
  })

  it('refuses at start a stream and dead-letter stream without one hash tag, which no script can write together', async () => {
    const redis = client() as unknown as Redis
    const base = { redis, group: 'g', consumer: 'c1', inbox: memoryInbox('cluster'), handler: () => {} }
    await expect(consumeRedisStreams({ ...base, stream: `orders-${randomUUID()}`, maxAttempts: 3 })).rejects.toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringMatching(/hash tag/),
    })
    await expect(
      consumeRedisStreams({ ...base, stream: `{orders-${randomUUID()}}`, deadLetterStream: 'elsewhere', maxDeliveries: 5 }),
    ).rejects.toMatchObject({ code: 'INVALID_OPTION' })
  })
})
