import { Redis } from 'ioredis'

/** Deletes every key under a prefix on the Redis at `url`: a suite's records (they expire anyway). */
export async function dropPrefix(url: string, prefix: string): Promise<void> {
  const redis = new Redis(url)
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
