import type { Redis } from 'ioredis'
import type { InboxMessage } from '../../inbox/types.js'
import { type ConsumeOptions, processMessage, type RunningConsumer } from '../shared.js'

/** Options of {@link consumeRedisStreams}. */
export interface ConsumeRedisStreamsOptions<Tx> extends ConsumeOptions<Tx> {
  /** An ioredis client used only by this consumer (it blocks on XREADGROUP). */
  redis: Redis
  stream: string
  /** Consumer group; created (from the start of the stream) if missing. */
  group: string
  /** This consumer's name within the group; unique per process. */
  consumer: string
  /** Entries read per call. @default 32 */
  count?: number
  /** How long one XREADGROUP blocks, in ms; also how long `stop()` may wait. @default 1000 */
  blockMs?: number
  /**
   * Entries pending this long (their consumer died, or their effect failed) are claimed with
   * XAUTOCLAIM and processed again. @default 30000
   */
  claimIdleMs?: number
}

type Entry = [id: Buffer, fields: Buffer[]]

function toInboxMessage(stream: string, [, fields]: Entry): InboxMessage {
  const map = new Map<string, Buffer>()
  for (let i = 0; i + 1 < fields.length; i += 2) map.set(String(fields[i]), fields[i + 1] as Buffer)
  const headers = map.has('headers') ? (JSON.parse(String(map.get('headers'))) as Record<string, string>) : {}
  // An entry without an `id` field cannot be deduplicated across republishes: the inbox refuses it.
  return { id: map.has('id') ? String(map.get('id')) : '', payload: map.get('payload') ?? Buffer.alloc(0), topic: stream, headers }
}

/**
 * Consumes a Redis stream through a consumer group and an inbox: an entry is XACKed only after its
 * transaction committed (or as a known duplicate). A failed entry stays pending and is claimed again
 * after `claimIdleMs`; entries of a dead consumer are claimed the same way. An entry redelivery
 * cannot fix (same ID, other payload; no ID) is XACKed and reported.
 *
 * @example
 * const running = await consumeRedisStreams({ redis, stream: 'orders', group: 'billing', consumer: 'billing-1', inbox, handler })
 */
export async function consumeRedisStreams<Tx>(options: ConsumeRedisStreamsOptions<Tx>): Promise<RunningConsumer> {
  const { redis, stream, group, consumer } = options
  const count = options.count ?? 32
  try {
    await redis.xgroup('CREATE', stream, group, '0', 'MKSTREAM')
  } catch (error) {
    if (!String((error as Error).message).includes('BUSYGROUP')) throw error
  }
  let stopping = false
  const handle = async (entry: Entry) => {
    const message = toInboxMessage(stream, entry)
    const verdict = await processMessage(options, message)
    if (verdict !== 'retry') await redis.xack(stream, group, entry[0])
  }
  const done = (async () => {
    while (!stopping) {
      try {
        const claimed = (await redis.callBuffer(
          'XAUTOCLAIM',
          stream,
          group,
          consumer,
          options.claimIdleMs ?? 30_000,
          '0-0',
          'COUNT',
          count,
        )) as unknown as [Buffer, Entry[]]
        for (const entry of claimed[1] ?? []) if (entry) await handle(entry)
        const read = (await redis.callBuffer(
          'XREADGROUP',
          'GROUP',
          group,
          consumer,
          'COUNT',
          count,
          'BLOCK',
          options.blockMs ?? 1000,
          'STREAMS',
          stream,
          '>',
        )) as Array<[Buffer, Entry[]]> | null
        for (const [, entries] of read ?? []) for (const entry of entries) await handle(entry)
      } catch (error) {
        if (stopping) break
        options.onError?.(error, { id: '', payload: '' })
        await new Promise((resolve) => setTimeout(resolve, 500))
      }
    }
  })()
  return {
    done,
    async stop() {
      stopping = true
      await done
    },
  }
}
