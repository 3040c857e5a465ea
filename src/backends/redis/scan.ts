import { type RedisClientLike, sendBuffer } from './client.js'
import { scripts } from './scripts.js'

/** Keys SCAN asks for per call: big enough to cross a large keyspace quickly, small enough not to block Redis. */
const SCAN_COUNT = 1_000

/** The nodes that hold keys: every master of a cluster, or the one server. */
export function dataNodes(client: RedisClientLike): RedisClientLike[] {
  return client.isCluster && typeof client.nodes === 'function' ? client.nodes('master') : [client]
}

/** One SCAN step on one node: the next cursor and the matching keys. */
async function scanStep(node: RedisClientLike, cursor: string, pattern: string): Promise<[string, string[]]> {
  const [next, keys] = (await sendBuffer(node, 'scan', [cursor, 'MATCH', pattern, 'COUNT', SCAN_COUNT])) as [Buffer, Buffer[]]
  return [next.toString(), keys.map((key) => key.toString())]
}

/**
 * Every key matching `pattern` on every node, up to `max` keys. SCAN walks the whole keyspace of
 * each node (the pattern only filters what comes back): its cost grows with the database, not
 * with the matches.
 */
export async function scanAll(client: RedisClientLike, pattern: string, max: number): Promise<string[]> {
  const found: string[] = []
  for (const node of dataNodes(client)) {
    let cursor = '0'
    do {
      const [next, keys] = await scanStep(node, cursor, pattern)
      for (const key of keys) if (found.length < max) found.push(key)
      cursor = next
    } while (cursor !== '0' && found.length < max)
    if (found.length >= max) break
  }
  return found
}

/**
 * A SCAN that resumes where the last call stopped, across calls and nodes, so a bounded purge does
 * not walk the live records at the start of the keyspace again each time.
 */
export class ResumableScan {
  #node = 0
  #cursor = '0'
  #pending: string[] = []

  constructor(
    private readonly client: RedisClientLike,
    private readonly pattern: string,
  ) {}

  /** The next batch of keys; `done` is true when a full pass over every node ended with it. */
  async next(): Promise<{ keys: string[]; done: boolean }> {
    if (this.#pending.length > 0) {
      const keys = this.#pending
      this.#pending = []
      return { keys, done: false }
    }
    const nodes = dataNodes(this.client)
    if (this.#node >= nodes.length) this.#node = 0
    const [next, keys] = await scanStep(nodes[this.#node] as RedisClientLike, this.#cursor, this.pattern)
    this.#cursor = next
    let done = false
    if (next === '0') {
      this.#node++
      if (this.#node >= nodes.length) {
        this.#node = 0
        done = true
      }
    }
    return { keys, done }
  }

  /** Gives back keys a caller did not get to, for the next call. */
  putBack(keys: string[]): void {
    this.#pending = keys.concat(this.#pending)
  }
}

/**
 * Deletes up to `limit` records past their expiry among the keys `scan` finds onwards from where it
 * stopped last (by the server's clock, in the purge script); the keys it did not reach are put back.
 */
export async function purgeScanned(client: RedisClientLike, scan: ResumableScan, limit: number, prefix: string): Promise<number> {
  let purged = 0
  for (;;) {
    const { keys, done } = await scan.next()
    for (let i = 0; i < keys.length && purged < limit; ) {
      const chunk = keys.slice(i, i + (limit - purged))
      i += chunk.length
      const deleted = await Promise.all(chunk.map((redisKey) => scripts.purge.run(client, redisKey, [], stepsKeyOf(prefix, redisKey))))
      purged += deleted.filter((n) => n === 1).length
      if (purged >= limit) scan.putBack(keys.slice(i))
    }
    if (purged >= limit || done) return purged
  }
}

/** The steps key beside a record key found by SCAN (`<prefix>:r:<scope hash>:{tag}` → `<prefix>:t:{tag}`). */
function stepsKeyOf(prefix: string, redisKey: string): string {
  return `${prefix}:t:${redisKey.slice(redisKey.lastIndexOf('{'))}`
}
