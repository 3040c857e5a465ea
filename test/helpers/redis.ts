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

/** The connections the server holds under `name` (CLIENT SETNAME, ioredis `connectionName`, node-redis `name`). */
export async function connectionsNamed(admin: Redis, name: string): Promise<Array<{ id: string; addr: string; flags: string }>> {
  const list = (await admin.client('LIST')) as string
  return list
    .split('\n')
    .filter((line) => line.includes(` name=${name} `))
    .map((line) => ({
      id: /(?:^|\s)id=(\d+)/.exec(line)?.[1] ?? '',
      addr: /(?:^|\s)addr=(\S+)/.exec(line)?.[1] ?? '',
      flags: /\sflags=(\S+)/.exec(line)?.[1] ?? '',
    }))
}

/** How many clients are subscribed to `channel`. */
export async function subscribers(admin: Redis, channel: string): Promise<number> {
  const [, count] = (await admin.pubsub('NUMSUB', channel)) as [string, number]
  return Number(count)
}
