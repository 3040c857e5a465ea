/**
 * Deletes the Redis records a bench's apps wrote: every key matching one of `patterns` (SCAN, then UNLINK
 * in batches). The apps' records are kept for a day by their TTL; left behind in database 0 they slow
 * every SCAN on the server, the test suites' included. Plain JavaScript, so the .mjs scripts (run without
 * tsx) and peers.ts share it.
 *
 * @example
 * await unlinkMatching(['peers-idemkey:*', 'cpu-*', '*:cpu-*'])
 */
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')

/** @param {string[]} patterns SCAN MATCH patterns. @param {string} [url] the server (REDIS_URL, else the local one). */
export async function unlinkMatching(patterns, url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379') {
  const { Redis } = createRequire(join(ROOT, 'package.json'))('ioredis')
  const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  try {
    await redis.connect()
    for (const pattern of patterns) {
      let cursor = '0'
      do {
        const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000)
        if (keys.length > 0) await redis.unlink(...keys)
        cursor = next
      } while (cursor !== '0')
    }
  } finally {
    redis.disconnect()
  }
}
