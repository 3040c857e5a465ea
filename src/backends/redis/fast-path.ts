import type { AcquireResult, StoredRecord } from '../../core/store.js'
import { type RedisArg, type RedisClientLike, sendBuffer, serverHasSetIfEq, toStoreError } from './client.js'
import type { RecordNames } from './keys.js'
import { casCompleted, fromPacked, isSettled, RECORD_TAG } from './record.js'
import { fail, scripts } from './scripts.js'

/** What the native acquire wrote to a key, kept until its holder completes it with SET ... IFEQ. */
export interface FreshRecord {
  /** The exact value (the IFEQ comparison). */
  value: string
  /** Its fingerprint and identity, which the completed record keeps. */
  tail: string
  /** When the acquire's reply came (performance.now()): the record's age at completion. */
  at: number
}

/** A recent record's key names, and what its native acquire wrote until its holder completes it. */
export interface Recent {
  scope: string
  names: RecordNames
  fresh: FreshRecord | undefined
}

/**
 * A complete, as a group commit's input: the complete script's arguments (token, status, head, body, ttl,
 * the key's TTL, channel), and the fresh record its acquire wrote when a batch may complete it by
 * compare-and-set.
 */
export interface Completion {
  names: RecordNames
  args: [token: number, status: 'c' | 'f', head: string, body: string | Buffer, ttlMs: number, keyTtlMs: number, channel: string]
  fresh: FreshRecord | undefined
}

/**
 * How far from its expiry, by this machine's clock, a completed record must be for the native acquire
 * to replay it without asking the server's clock: closer than that, the script decides. A clock ahead
 * of the server's by more than this could replay a record in its last minute past expiry (until Redis
 * drops the key at the end of its grace): a replay, never a second run.
 */
const NATIVE_REPLAY_MARGIN_MS = 60_000

/** The store's settings the fast path writes with. */
export interface FastPathOptions {
  /** Abandoned retention and expired grace, in ms, as command arguments. */
  retention: string
  grace: string
  /** The `nativeCompareAndSet` option: undefined to ask the server. */
  compareAndSet: boolean | undefined
  /** Whether the store groups completes (then fresh records are kept for the batch's compare-and-set). */
  grouping: boolean
  /** Drops the fresh records the store keeps: called when nothing will complete them by compare-and-set. */
  forgetFresh: () => void
}

/**
 * The commands that spare Redis a script: the common acquire as one `SET NX GET` (a new key, a far
 * replay), and the complete of a record this store acquired as one compare-and-set, `SET ... IFEQ` where
 * the server has it, or several in one call of complete-batch.lua (group commit). Each answers undefined
 * or false when the script must decide; the fences are the scripts' own (docs/redis.md).
 */
export class FastPath {
  readonly #retention: string
  readonly #grace: string
  readonly #graceMs: number
  /** A record key's TTL beyond its lease (abandoned retention + expired grace), in ms. */
  readonly #afterLeaseMs: number
  readonly #grouping: boolean
  readonly #forgetFresh: () => void
  /** Whether the server takes SET NX GET (Redis 7.0+): a new key is then acquired without a script. */
  #native = true
  /**
   * Whether complete may use SET ... IFEQ: undefined until the server's answer to INFO (asked once, at
   * the first new key), or as the option says.
   */
  #compareAndSet: boolean | undefined
  #detecting = false

  constructor(options: FastPathOptions) {
    this.#retention = options.retention
    this.#grace = options.grace
    this.#graceMs = Number(options.grace)
    this.#afterLeaseMs = Number(options.retention) + this.#graceMs
    this.#compareAndSet = options.compareAndSet
    this.#grouping = options.grouping
    this.#forgetFresh = options.forgetFresh
  }

  /** Whether acquire tries SET NX GET first (false once the server refused it). */
  get acquires(): boolean {
    return this.#native
  }

  /** Whether complete uses SET ... IFEQ: true, false, or undefined while the server is not asked yet. */
  get compareAndSet(): boolean | undefined {
    return this.#compareAndSet
  }

  /**
   * The common acquire without a script: one `SET key <fresh record> NX GET PX <lease + retention +
   * grace>`. A new key (by far the most common acquire) is taken by that SET alone, its lease kept as
   * durations that the scripts turn into server-clock times from the key's expiry (`absolute` in
   * _lib.lua), so it costs Redis a SET instead of a script. When the key exists the SET changes
   * nothing and returns the record: a completed record far from its expiry is replayed (or is a
   * mismatch) from it; anything else (in progress, a takeover, near expiry, a watch marker, a foreign
   * value or type) goes to the acquire script, which decides on the server's clock. Servers before
   * Redis 7.0 refuse SET NX GET: the store then uses the script for every acquire.
   */
  async acquire(
    client: RedisClientLike,
    recent: Recent,
    fingerprint: string,
    identity: string,
    leaseMs: number,
    scope: string,
    key: string,
  ): Promise<AcquireResult | undefined> {
    const redisKey = recent.names.key
    const fresh = `${RECORD_TAG}00n|${leaseMs}|${this.#retention}|${this.#grace}|${fingerprint}${identity}`
    const px = leaseMs + this.#afterLeaseMs
    let prior: unknown
    try {
      prior = await sendBuffer(client, 'set', [redisKey, fresh, 'PX', px, 'NX', 'GET'])
    } catch (error) {
      const message = (error as Error)?.message ?? ''
      // Before Redis 7.0 (NX and GET together are a syntax error): the script alone from now on.
      if (/syntax error/i.test(message)) this.#native = false
      // WRONGTYPE (another type under the key): the script reports it.
      if (/syntax error|WRONGTYPE/i.test(message)) return undefined
      throw toStoreError('acquire', redisKey, error, client)
    }
    if (prior === null) {
      if (this.#compareAndSet !== false || this.#grouping) this.#rememberFresh(client, recent, fresh, fingerprint + identity)
      return { kind: 'acquired', token: 1 }
    }
    return Buffer.isBuffer(prior) ? settledRecord(prior, redisKey, fingerprint, scope, key) : undefined
  }

  /**
   * Completes with one SET ... IFEQ: it writes only when the key still holds, byte for byte, the fresh
   * record this store's acquire wrote (token 1, in progress, nobody waiting, no steps, never renewed),
   * so it is fenced exactly as the script's token check is; true when written. Any other value (another
   * token, a renewal, a waiter's flag, an expiry) or no key: false, and the script decides.
   */
  async complete(
    client: RedisClientLike,
    redisKey: string,
    fresh: FreshRecord,
    status: 'c' | 'f',
    head: string,
    body: string | Buffer,
    ttlMs: number,
  ): Promise<boolean> {
    const value = this.#completedValue(fresh, status, head, body, ttlMs, performance.now())
    try {
      return (await sendBuffer(client, 'set', [redisKey, value, 'IFEQ', fresh.value, 'PX', ttlMs + this.#graceMs])) !== null
    } catch (error) {
      const message = (error as Error)?.message ?? ''
      // A server without IFEQ (a node older than its peers, an option forced on): the script from now on.
      if (/syntax error/i.test(message)) this.#settleCompareAndSet(false)
      if (/syntax error|WRONGTYPE/i.test(message)) return false
      throw toStoreError('complete', redisKey, error, client)
    }
  }

  /**
   * Completes the fresh records of a group commit's batch (more than one) in one call of
   * complete-batch.lua, each by compare-and-set as `SET ... IFEQ` does; returns those it wrote. The rest
   * are the complete script's to decide.
   */
  async completeBatch(client: RedisClientLike, fresh: Completion[]): Promise<Set<Completion>> {
    const keys: RedisArg[] = [fresh.length]
    const args: RedisArg[] = []
    const now = performance.now()
    for (const input of fresh) {
      const record = input.fresh as FreshRecord
      const [, status, head, body, ttlMs, keyTtlMs] = input.args
      keys.push(input.names.key)
      args.push(record.value, this.#completedValue(record, status, head, body, ttlMs, now), keyTtlMs)
    }
    const replies = (await scripts.completeBatch
      .runOn(client, keys, args)
      .catch((error: unknown) => fail('complete', (fresh[0] as Completion).names.key, error, client))) as unknown[]
    const written = new Set<Completion>()
    for (const [i, input] of fresh.entries()) if (replies[i] === 1) written.add(input)
    return written
  }

  /**
   * Keeps the fresh record the native acquire just wrote, for its holder's SET ... IFEQ complete, and
   * asks the server once whether it has that SET (INFO server).
   */
  #rememberFresh(client: RedisClientLike, recent: Recent, value: string, tail: string): void {
    recent.fresh = { value, tail, at: performance.now() }
    if (this.#compareAndSet !== undefined || this.#detecting) return
    this.#detecting = true
    sendBuffer(client, 'info', ['server']).then(
      (info) => this.#settleCompareAndSet(serverHasSetIfEq(String(info))),
      // INFO refused (an ACL) or lost: the script, which every server runs, completes every record.
      () => this.#settleCompareAndSet(false),
    )
  }

  #settleCompareAndSet(available: boolean): void {
    this.#compareAndSet = available
    // Group commit completes fresh records by compare-and-set without the native SET: they stay.
    if (!available && !this.#grouping) this.#forgetFresh()
  }

  /**
   * The value a fresh record takes when completed by compare-and-set (native `SET ... IFEQ`, or a group
   * commit's batch). It keeps how long the holder held the record, which readers take from the server's
   * time of the write to date its creation. Measured here between the acquire's reply and this write,
   * it is shorter than the server's interval, so it is rounded down: rounded to the nearest, it could
   * pass that interval by a fraction and date the record a millisecond before its acquire.
   */
  #completedValue(fresh: FreshRecord, status: 'c' | 'f', head: string, body: string | Buffer, ttlMs: number, now: number): string | Buffer {
    return casCompleted(status, ttlMs, this.#grace, Math.max(0, Math.floor(now - fresh.at)), fresh.tail, head, body)
  }
}

/**
 * The answer a record returned by the native acquire's SET gives without the script: a completed or
 * failed record of this scope and key, at least {@link NATIVE_REPLAY_MARGIN_MS} from its expiry, is a
 * replay, or a mismatch when the fingerprint differs. Anything else is the script's to decide.
 */
function settledRecord(v: Buffer, redisKey: string, fingerprint: string, scope: string, key: string): AcquireResult | undefined {
  if (!isSettled(v)) return undefined
  let record: StoredRecord
  try {
    record = fromPacked(v, redisKey)
  } catch {
    return undefined // damaged or foreign: the script reports it
  }
  if (record.scope !== scope || record.key !== key) return undefined
  if (record.expiresAtMs - Date.now() < NATIVE_REPLAY_MARGIN_MS) return undefined
  if (record.fingerprint !== fingerprint) return { kind: 'mismatch' }
  return { kind: 'replay', record }
}
