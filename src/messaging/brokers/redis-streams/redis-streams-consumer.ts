import type { Redis } from 'ioredis'
import { type Duration, parseDuration } from '../../../core/duration.js'
import { assertOptionalPositiveInteger } from '../../../core/validate.js'
import { IdempotencyError } from '../../../errors.js'
import {
  type ConsumeOptions,
  checkInboxWindow,
  consumerConcurrency,
  defaultInHand,
  delayOption,
  keyOf,
  maxAttemptsOption,
  positive,
  type RunningConsumer,
} from '../../consumer-options.js'
import { createDispatcher, type Verdict } from '../../dispatcher.js'
import type { InboxMessage } from '../../inbox/types.js'

/** Options of {@link consumeRedisStreams}. */
export interface ConsumeRedisStreamsOptions<Tx> extends ConsumeOptions<Tx> {
  /**
   * An ioredis client used only by this consumer (it blocks on XREADGROUP). The helper opens one
   * more connection from it (`duplicate()`) for XACK and XAUTOCLAIM, closed by `stop()`.
   */
  redis: Redis
  stream: string
  /** Consumer group; created (from the start of the stream) if missing, at start and whenever Redis lost it. */
  group: string
  /** This consumer's name within the group; unique per process. */
  consumer: string
  /**
   * Entries read per XREADGROUP call at most; also the most entries held unacked (running or
   * waiting for their key). @default concurrency x batchSize (256)
   */
  count?: number
  /** How long one XREADGROUP blocks, in ms; also how long `stop()` may wait. @default 1000 */
  blockMs?: number
  /**
   * Entries pending this long (their consumer died, or their effect failed) are claimed with
   * XAUTOCLAIM and processed again. @default 30000
   */
  claimIdleMs?: number
  /**
   * How many times an entry may be delivered (read, then claimed again) before it is dead-lettered
   * without running, as `maxAttempts` does (`deadLetterStream`, `RETRIES_EXHAUSTED`): the guard against
   * an entry whose effect stops the process each time, whose failures are never seen to be counted.
   * JetStream's `max_deliver` and a RabbitMQ quorum queue's `x-delivery-limit` do this at the broker;
   * Redis has no such limit, so the helper reads each claimed entry's delivery count (`XPENDING`). It
   * counts every delivery, also those handed back unapplied behind an earlier failed message of their
   * key: keep it well above `maxAttempts`. Unset: no limit.
   */
  maxDeliveries?: number
  /**
   * The stream's trimming by time: entries older than about this are dropped (the publisher's
   * `maxAge`, or your own `XTRIM MINID`). Until then a pending entry can be claimed again, so the
   * inbox must keep IDs at least this long; the helper warns (`IDEMKEY_INBOX_WINDOW`) when it does
   * not. Redis keeps no retention setting on a stream (its writers trim it), so the helper is told.
   */
  maxAge?: Duration
  /**
   * Where an entry goes once its effect has failed `maxAttempts` times: it is added to this stream
   * (its own fields, then `dead-letter-stream`, `dead-letter-entry`, `dead-letter-group` and
   * `dead-letter-consumer`) and acknowledged, by one script (never acknowledged without its copy).
   * Nothing trims it: read it, mend, and add the entries back to `stream` (docs/messaging.md, "A
   * message that always fails"). In Redis Cluster it must hash to the stream's slot: name the stream
   * with a hash tag (`{orders}`), which the default keeps (`{orders}:dead-letter`); a pair without one
   * tag is refused at start when `maxAttempts` or `maxDeliveries` is set.
   * @default `<stream>:dead-letter`
   */
  deadLetterStream?: string
}

type Entry = [id: Buffer, fields: Buffer[]]

/**
 * Moves a given-up entry: KEYS[1] its stream, KEYS[2] the dead-letter stream; ARGV[1] the group, ARGV[2]
 * the entry's ID, then the fields of the copy. A script stops at its first error, so an XADD that fails
 * (the dead-letter key holds another type, the server is out of memory) leaves the entry pending. A MULTI
 * did not: it ran the XACK after the failed XADD, and the entry, acknowledged without its copy, was lost
 * to every consumer.
 */
const MOVE_TO_DEAD_LETTERS = `redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])`

/**
 * What Redis Cluster hashes a key by: the part between its first `{` and the next `}` when that is not
 * empty, else the whole key. Two keys with one hash tag are in one slot.
 */
function hashTag(key: string): string {
  const open = key.indexOf('{')
  const close = open === -1 ? -1 : key.indexOf('}', open + 1)
  return close > open + 1 ? key.slice(open + 1, close) : key
}

/**
 * The inbox view of an entry, and why it cannot be handled (`refused`): its `headers` field is not a
 * JSON object. Redelivery cannot fix that, so such an entry is XACKed and reported, as one without ID.
 */
function toInboxMessage(stream: string, [, fields]: Entry): { message: InboxMessage; refused?: IdempotencyError } {
  const map = new Map<string, Buffer>()
  for (let i = 0; i + 1 < fields.length; i += 2) map.set(String(fields[i]), fields[i + 1] as Buffer)
  // An entry without an `id` field cannot be deduplicated across republishes: the inbox refuses it.
  const message: InboxMessage = {
    id: map.has('id') ? String(map.get('id')) : '',
    payload: map.get('payload') ?? Buffer.alloc(0),
    topic: stream,
  }
  if (!map.has('headers')) return { message: { ...message, headers: {} } }
  try {
    const headers: unknown = JSON.parse(String(map.get('headers')))
    if (headers !== null && typeof headers === 'object' && !Array.isArray(headers)) {
      return { message: { ...message, headers: headers as Record<string, string> } }
    }
  } catch {
    // Reported below.
  }
  const refused = new IdempotencyError(
    'INVALID_ARGUMENT',
    `Redis stream "${stream}": entry ${String(message.id || '(no id)')} has a "headers" field that is not a JSON object; it is acknowledged and not applied.`,
  )
  return { message: { ...message, headers: {} }, refused }
}

/**
 * Consumes a Redis stream through a consumer group and an inbox: an entry is XACKed only after its
 * transaction committed (or as a known duplicate). A failed entry stays pending and is claimed again
 * after `claimIdleMs` (after `maxAttempts` failures, it is moved to `deadLetterStream`); entries of a
 * dead consumer are claimed the same way. An entry redelivery
 * cannot fix (same ID, other payload; no ID; a `headers` field that is not JSON) is XACKed and reported.
 * Entries are read in batches (XREADGROUP COUNT) and up to `concurrency` effects run at once; give
 * `partitionKey` to keep the entries of one key in order (by default there is no ordering).
 *
 * @example
 * const running = await consumeRedisStreams({ redis, stream: 'orders', group: 'billing', consumer: 'billing-1', inbox, handler })
 */
export async function consumeRedisStreams<Tx>(options: ConsumeRedisStreamsOptions<Tx>): Promise<RunningConsumer> {
  const { redis, stream, group, consumer } = options
  const concurrency = consumerConcurrency(options)
  const count = positive(options.count, defaultInHand(options, concurrency), 'count')
  const claimIdleMs = delayOption(options.claimIdleMs, 30_000, 'claimIdleMs')
  // BLOCK 0 is Redis's "wait for ever": stop() would never return.
  const blockMs = delayOption(options.blockMs, 1000, 'blockMs', 1)
  maxAttemptsOption(options)
  assertOptionalPositiveInteger(options.maxDeliveries, 'consumeRedisStreams: maxDeliveries')
  const maxDeliveries = options.maxDeliveries
  if (
    options.deadLetterStream !== undefined &&
    (typeof options.deadLetterStream !== 'string' || options.deadLetterStream === '' || options.deadLetterStream === options.stream)
  ) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `consumeRedisStreams: deadLetterStream must be the name of another stream, got ${JSON.stringify(options.deadLetterStream)}.`,
    )
  }
  const deadLetterStream = options.deadLetterStream ?? `${stream}:dead-letter`
  const givesUp = options.maxAttempts !== undefined || options.maxDeliveries !== undefined
  if (givesUp && (redis as { isCluster?: boolean }).isCluster === true && hashTag(stream) !== hashTag(deadLetterStream)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `consumeRedisStreams on a Redis Cluster: "${stream}" and its dead-letter stream "${deadLetterStream}" are written by one script, so they must hash to one slot, and these may not. Name the stream with a hash tag, e.g. "{orders}" (its dead letters then go to "{orders}:dead-letter"), or give a deadLetterStream with the stream's tag.`,
    )
  }
  if (options.maxAge !== undefined) {
    const maxAgeMs = parseDuration(options.maxAge, 'maxAge')
    checkInboxWindow(options.inbox.consumer, `Redis stream "${stream}" (maxAge)`, options.inbox.retentionMs, maxAgeMs)
  }
  const createGroup = async () => {
    try {
      await redis.xgroup('CREATE', stream, group, '0', 'MKSTREAM')
    } catch (error) {
      if (!String((error as Error).message).includes('BUSYGROUP')) throw error
    }
  }
  await createGroup()
  // XACKs must not queue behind the blocking XREADGROUP on the reader's connection.
  const acker = redis.duplicate({ enableAutoPipelining: false })
  const dispatcher = createDispatcher(options, concurrency, `moved to stream "${deadLetterStream}" and acknowledged`)
  let stopping = false
  const settle = async (entry: Entry, message: InboxMessage, verdict: Verdict) => {
    if (verdict === 'retry' || verdict === 'return') return // stays pending: claimed again after claimIdleMs
    const [id, fields] = entry
    try {
      if (verdict === 'dead') {
        // Copied and acknowledged by one script, which stops at the copy's error: never acknowledged
        // without its copy, never in both for long.
        const origin = ['dead-letter-stream', stream, 'dead-letter-entry', id, 'dead-letter-group', group, 'dead-letter-consumer', consumer]
        await acker.eval(MOVE_TO_DEAD_LETTERS, 2, stream, deadLetterStream, group, id, ...fields, ...origin)
      } else await acker.xack(stream, group, id)
    } catch (error) {
      // Not acked: the entry is claimed again after claimIdleMs and the inbox answers duplicate. One
      // given up on stays given up: the dispatcher hears it was not moved and gives it up at its next failure.
      options.onError?.(error, message)
      if (verdict === 'dead') throw error
    }
  }
  // Entry IDs in hand: XAUTOCLAIM may hand back one still waiting here for its key; it is not run twice.
  const inHand = new Set<string>()
  /**
   * `claimed`: delivered before (to a consumer that did not acknowledge it). `deliveries`, for claimed
   * entries under `maxDeliveries`: how often each was delivered, by entry ID.
   */
  const dispatch = (entries: Entry[], claimed: boolean, deliveries?: Map<string, number>) => {
    for (const entry of entries) {
      if (!entry) continue // XAUTOCLAIM answers nil for entries deleted meanwhile
      const entryId = String(entry[0])
      if (inHand.has(entryId)) continue
      const { message, refused } = toInboxMessage(stream, entry)
      if (refused) {
        // Refused, not thrown: a throw would leave the entry in hand, pending for ever, and drop the rest of its read.
        options.onError?.(refused, message)
        void settle(entry, message, 'reject')
        continue
      }
      inHand.add(entryId)
      const key = keyOf(options, message, () => null)
      const settleIt = (verdict: Verdict) => settle(entry, message, verdict).finally(() => inHand.delete(entryId))
      const delivered = deliveries?.get(entryId) ?? 0
      if (maxDeliveries !== undefined && delivered > maxDeliveries) {
        dispatcher.giveUp(key, message, settleIt, `was delivered ${delivered} times, over maxDeliveries (${maxDeliveries})`)
      } else dispatcher.push(key, message, settleIt, claimed)
    }
  }

  /** How often each claimed entry has been delivered, this claim included (one XPENDING each, pipelined). */
  const deliveryCounts = async (entries: Entry[]): Promise<Map<string, number>> => {
    const pipeline = acker.pipeline()
    const ids = entries.filter(Boolean).map((entry) => String(entry[0]))
    for (const id of ids) pipeline.xpending(stream, group, id, id, 1)
    const replies = (await pipeline.exec()) ?? []
    const counts = new Map<string, number>()
    for (const [error, reply] of replies) {
      const row = (reply as Array<[string, string, number, number]> | undefined)?.[0]
      if (!error && row) counts.set(String(row[0]), Number(row[3]))
    }
    return counts
  }
  let lastClaim = Number.NEGATIVE_INFINITY
  const done = (async () => {
    while (!stopping) {
      try {
        await dispatcher.room(count)
        if (stopping) break
        // Entries idle for claimIdleMs cannot appear faster than that: no need to ask on every read.
        if (Date.now() - lastClaim >= Math.min(claimIdleMs, 1_000)) {
          lastClaim = Date.now()
          const claimed = (await acker.callBuffer(
            'XAUTOCLAIM',
            stream,
            group,
            consumer,
            claimIdleMs,
            '0-0',
            'COUNT',
            count - dispatcher.inHand,
          )) as unknown as [Buffer, Entry[]]
          const entries = claimed[1] ?? []
          dispatch(entries, true, maxDeliveries !== undefined && entries.length > 0 ? await deliveryCounts(entries) : undefined)
          if (dispatcher.inHand >= count) continue
        }
        const read = (await redis.callBuffer(
          'XREADGROUP',
          'GROUP',
          group,
          consumer,
          'COUNT',
          count - dispatcher.inHand,
          'BLOCK',
          blockMs,
          'STREAMS',
          stream,
          '>',
        )) as Array<[Buffer, Entry[]]> | null
        for (const [, entries] of read ?? []) dispatch(entries, false)
      } catch (error) {
        if (stopping) break
        options.onError?.(error, { id: '', payload: '' })
        await new Promise((resolve) => setTimeout(resolve, 500))
        // The stream or its group is gone (a Redis restart without persistence, a DEL, XGROUP DESTROY):
        // every read answered NOGROUP for ever. Create the group again, as at start.
        if (String((error as Error)?.message).includes('NOGROUP') && !stopping) await createGroup().catch(() => {})
      }
    }
    await dispatcher.idle()
    acker.disconnect()
  })()
  return {
    done,
    async stop() {
      stopping = true
      await done
    },
  }
}
