import { isUtf8 } from 'node:buffer'
import { parseDuration } from '../../core/duration.js'
import { assertRecordStep } from '../../core/steps-store.js'
import {
  type AcquireResult,
  DEFAULT_ABANDONED_RETENTION_MS,
  type IdempotencyStore,
  type ListFilter,
  type Outcome,
  type StoredRecord,
  type Unsubscribe,
} from '../../core/store.js'
import { assertFingerprint, assertIdentity, assertOptionalPositiveInteger, assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { type BatchAnswer, GroupCommit } from '../group-commit.js'
import { assertOutcome, encodeHeaders, listLimit, matchesFilter } from '../records.js'
import { databaseOf, openClient, type RedisArg, type RedisClientLike, type Script, toStoreError } from './client.js'
import { checkDurability, Durability, followsConnection, type NotReplicatedError } from './durability.js'
import { type Completion, FastPath, type Recent } from './fast-path.js'
import { assertPrefix, type RecordNames, recordNames, recordPattern } from './keys.js'
import { adaptClient } from './node-redis.js'
import { Notifier } from './notifier.js'
import type { RedisStoreOptions } from './options.js'
import { packedHead, packedIdentity } from './record.js'
import { purgeScanned, ResumableScan, scanAll } from './scan.js'
import { acquireAnswer, fail, readAnswer, scripts } from './scripts.js'

/** How long close() lets QUIT wait for its reply before dropping the connection. */
const CLOSE_WAIT_MS = 1_000

/**
 * Records in Redis (one server, or a Cluster), shared by any number of processes and machines.
 * Every operation is one atomic step on one record (a packed string): a Lua script, or for a new key one
 * `SET NX GET`; changes are fenced by the token; leases and expiry are decided
 * by the Redis server's clock (`TIME`), and each record's key carries a TTL so Redis drops it
 * itself. Waiters are woken through pub/sub. Read docs/redis.md for what a crash or a failover
 * may lose.
 *
 * @example
 * import { Redis } from 'ioredis'
 * const store = new RedisStore({ client: new Redis({ maxRetriesPerRequest: 1 }) })
 * const ledger = new Ledger({ store })
 */
export class RedisStore implements IdempotencyStore {
  readonly name = 'redis'
  readonly serverClock = true
  /** Start of every key and channel name this store uses. */
  readonly prefix: string
  readonly #retention: string
  readonly #grace: string
  readonly #graceMs: number
  readonly #listScanLimit: number
  readonly #ownsClient: boolean
  readonly #notifications: boolean
  #client: RedisClientLike | undefined
  readonly #opening: Promise<RedisClientLike> | undefined
  #notifier: Notifier | undefined
  /** Set by `close()`: a later watch opens no subscriber (it would outlive the store); its waiter polls. */
  #closed = false
  /** The `socketTimeout` of the client the store opened from `url` (unset with the caller's client). */
  readonly #socketTimeoutMs: number | undefined
  #purgeScan: ResumableScan | undefined
  /** The native acquire and the compare-and-set complete (fast-path.ts). */
  readonly #fast: FastPath
  /**
   * The key names of recent records, and the fresh record each one's native acquire wrote, by key alone
   * (at most RECENT_RECORDS). A record's acquire and its complete find the same entry.
   */
  readonly #recent = new Map<string, Recent>()
  /** Whether completes are grouped: the option, on one server (a script's keys on a Cluster must share a slot). */
  readonly #grouping: boolean
  /** Completes, grouped (one server). */
  /** The `durability` option's waits; undefined (no cost) without it. */
  readonly #durable: Durability | undefined
  readonly #completions = new GroupCommit<Completion, boolean | Error>({
    one: (input) => this.#completeOne(input),
    many: (inputs) => this.#completeMany(inputs),
    identity: (input) => input.names.key,
    distinct: false,
    gaveUp: () => new Error('unreachable: a grouped complete is never sent again'),
    alone: () => false,
  })

  constructor(options: RedisStoreOptions) {
    if ((options?.client === undefined) === (options?.url === undefined)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'RedisStore needs exactly one of { client } (an ioredis Redis or Cluster) or { url } (redis://host:port).',
      )
    }
    this.prefix = options.prefix ?? 'idemkey'
    assertPrefix(this.prefix)
    this.#retention = String(parseDuration(options.abandonedRetention ?? DEFAULT_ABANDONED_RETENTION_MS, 'abandonedRetention'))
    this.#grace = String(parseDuration(options.expiredGrace ?? '1m', 'expiredGrace'))
    this.#graceMs = Number(this.#grace)
    this.#listScanLimit = options.listScanLimit ?? 100_000
    assertOptionalPositiveInteger(this.#listScanLimit, 'RedisStore listScanLimit')
    this.#notifications = options.notifications ?? true
    this.#ownsClient = options.client === undefined
    if ((options.client as { options?: { keyPrefix?: string } } | undefined)?.options?.keyPrefix) {
      // ioredis would prefix script keys but not SCAN patterns, so list and purge would miss records.
      throw new IdempotencyError(
        'INVALID_OPTION',
        'RedisStore cannot use an ioredis client with keyPrefix: pass a client without it and give the store { prefix } instead.',
      )
    }
    if (options.client) {
      this.#client = adaptClient(options.client)
      this.#grouping = (options.groupCommit ?? true) && this.#client.isCluster !== true
    } else {
      // The client opened from a URL is one server's.
      this.#grouping = options.groupCommit ?? true
      this.#socketTimeoutMs = parseDuration(options.socketTimeout ?? '10s', 'socketTimeout')
      // Checked now (a path that is no number is refused here), asked of the server when the client opens.
      const database = databaseOf(options.url as string)
      this.#opening = openClient(options.url as string, this.#socketTimeoutMs, database)
      // A failed open is reported by the first operation; never as an unhandled rejection.
      this.#opening.catch(() => {})
    }
    const durability = checkDurability(options.durability, this.#socketTimeoutMs)
    if (durability !== undefined && this.#client !== undefined) {
      if (this.#client.isCluster === true) {
        throw new IdempotencyError(
          'INVALID_OPTION',
          'RedisStore durability waits for the replicas of one primary (WAIT): it cannot follow a Cluster, whose writes land on many. Leave it out on a Cluster.',
        )
      }
      if (!followsConnection(this.#client)) {
        throw new IdempotencyError(
          'INVALID_OPTION',
          'RedisStore durability needs a client that reports a lost connection (an ioredis client, or a node-redis client): a WAIT sent after a reconnect would confirm nothing.',
        )
      }
    }
    this.#durable = durability === undefined ? undefined : new Durability(durability)
    this.#fast = new FastPath({
      retention: this.#retention,
      grace: this.#grace,
      compareAndSet: options.nativeCompareAndSet,
      grouping: this.#grouping,
      forgetFresh: () => this.#recent.clear(),
    })
  }

  acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    const durable = this.#durable
    if (durable === undefined) return this.#acquire(scope, key, fingerprint, leaseMs)
    // Not confirmed: the caller never learns its token, so the record is released for its retry, but
    // only on the connection that wrote it. After a lost connection the write may be on the promoted
    // replica or not, where the same token can start a new life: a release there could free another
    // caller's record. It is left to its lease.
    const acquired = (answer: AcquireResult) => answer.kind === 'acquired'
    const unconfirmed = (answer: AcquireResult) => this.release(scope, key, (answer as { token: number }).token)
    return this.#waited('acquire', durable, () => this.#acquire(scope, key, fingerprint, leaseMs), acquired, unconfirmed)
  }

  async #acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    assertIdentity(scope, key)
    assertFingerprint(fingerprint)
    assertPositiveInteger(leaseMs, 'leaseMs')
    const recent = this.#recentOf(scope, key)
    const names = recent.names
    const identity = packedIdentity(scope, key)
    if (this.#fast.acquires) {
      const client = this.#client ?? (await this.#ready('acquire'))
      const answered = await this.#fast.acquire(client, recent, fingerprint, identity, leaseMs, scope, key)
      if (answered !== undefined) return answered
    }
    const reply = (await this.#run(
      'acquire',
      scripts.acquire,
      names,
      [fingerprint, identity, leaseMs, this.#retention, this.#grace],
      true,
    )) as unknown[]
    return acquireAnswer(reply, names.key)
  }

  /** One complete, by the script (a lone caller: the compare-and-set would cost Redis as much). */
  #completeOne(input: Completion): Promise<boolean> {
    return this.#run('complete', scripts.complete, input.names, input.args, true).then((reply) => reply === 1)
  }

  /**
   * Several completes: the fresh records in one compare-and-set script call, then the script for each
   * record that call did not write and for each that was not fresh (renewed, taken over), as a lone
   * complete would.
   */
  async #completeMany(inputs: Completion[]): Promise<Array<BatchAnswer<boolean | Error>>> {
    const fresh = inputs.filter((input) => input.fresh !== undefined)
    const written = fresh.length > 1 ? await this.#fast.completeBatch(this.#client as RedisClientLike, fresh) : new Set<Completion>()
    // Each caller's own failure (a foreign value under its key) is its answer alone, not its neighbours'.
    return Promise.all(
      inputs.map((input) =>
        written.has(input)
          ? { value: true }
          : this.#completeOne(input).then(
              (value) => ({ value }),
              (error: Error) => ({ value: error }),
            ),
      ),
    )
  }

  /** Stores the step in the record's steps hash, fenced by token (docs/steps.md). */
  recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    const durable = this.#durable
    if (durable === undefined) return this.#recordStep(scope, key, token, name, result)
    return this.#waited('recordStep', durable, () => this.#recordStep(scope, key, token, name, result), stored)
  }

  async #recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    assertRecordStep(scope, key, token, name, result)
    if (!Number.isSafeInteger(token)) return false
    return (await this.#run('recordStep', scripts.recordStep, this.#names(scope, key), [token, `~${name}`, result ?? ''], true)) === 1
  }

  renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    const durable = this.#durable
    if (durable === undefined) return this.#renew(scope, key, token, leaseMs)
    return this.#waited('renew', durable, () => this.#renew(scope, key, token, leaseMs), stored)
  }

  async #renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(leaseMs, 'leaseMs')
    if (!Number.isSafeInteger(token)) return false
    const recent = this.#recentOf(scope, key)
    const names = recent.names
    recent.fresh = undefined // the script rewrites it: an IFEQ on it would only miss
    return (await this.#run('renew', scripts.renew, names, [token, leaseMs, this.#retention, this.#grace], true)) === 1
  }

  complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    const durable = this.#durable
    if (durable === undefined) return this.#complete(scope, key, token, outcome, ttlMs)
    // A completion whose replicas did not confirm is kept: the holder's retry finds it completed with its
    // own token, and waits for the replicas again instead of reading it as fenced out.
    const run = async () => (await this.#complete(scope, key, token, outcome, ttlMs)) || (await this.#completedBy(scope, key, token))
    return this.#waited('complete', durable, run, stored)
  }

  async #complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(ttlMs, 'ttlMs')
    assertOutcome(outcome)
    if (!Number.isSafeInteger(token)) return false
    const recent = this.#recentOf(scope, key)
    const names = recent.names
    const status = outcome.status === 'completed' ? 'c' : 'f'
    const head = packedHead(outcome.response.status, outcome.resourceId ?? null, encodeHeaders(outcome.response.headers))
    const body = bodyArg(outcome.response.body)
    const fresh = recent.fresh
    const client = this.#client
    if (fresh !== undefined) {
      recent.fresh = undefined
      if (token === 1 && this.#fast.compareAndSet === true && client !== undefined) {
        if (await this.#fast.complete(client, names.key, fresh, status, head, body, ttlMs)) return true
      }
    }
    const args: Completion['args'] = [token, status, head, body, ttlMs, ttlMs + this.#graceMs, names.channel]
    if (client !== undefined && this.#grouping) {
      // Only a fresh record this store wrote, still with token 1, may be completed by compare-and-set.
      const casFrom = token === 1 && this.#fast.compareAndSet !== true ? fresh : undefined
      const answer = await this.#completions.run({ names, args, fresh: casFrom })
      if (answer instanceof Error) throw answer
      return answer
    }
    return (await this.#run('complete', scripts.complete, names, args, true)) === 1
  }

  async release(scope: string, key: string, token: number): Promise<boolean> {
    assertIdentity(scope, key)
    if (!Number.isSafeInteger(token)) return false
    const recent = this.#recentOf(scope, key)
    const names = recent.names
    recent.fresh = undefined
    return (await this.#run('release', scripts.release, names, [token, this.#retention, this.#grace, names.channel], true)) === 1
  }

  async get(scope: string, key: string): Promise<StoredRecord | null> {
    assertIdentity(scope, key)
    const names = this.#names(scope, key)
    const record = await this.#read('get', names.key)
    return record && record.record.expiresAtMs > record.nowMs ? record.record : null
  }

  /**
   * Records for operators, oldest first. SCANs every node (each master of a cluster) for the
   * store's keys (one scope's when `filter.scope` is given), reads each (up to `listScanLimit`),
   * then filters and sorts: its cost grows with the number of records, so keep it off hot paths.
   */
  async list(filter: ListFilter = {}): Promise<StoredRecord[]> {
    const limit = listLimit(filter)
    if (limit === 0) return []
    const client = await this.#ready('list')
    let keys: string[]
    try {
      keys = await scanAll(client, recordPattern(this.prefix, filter.scope), this.#listScanLimit)
    } catch (error) {
      throw toStoreError('list', this.prefix, error, client)
    }
    const records: StoredRecord[] = []
    for (let i = 0; i < keys.length; i += 200) {
      const read = await Promise.all(keys.slice(i, i + 200).map((redisKey) => this.#read('list', redisKey)))
      for (const entry of read) if (entry && matchesFilter(entry.record, filter, entry.nowMs)) records.push(entry.record)
    }
    return records.sort((a, b) => a.createdAtMs - b.createdAtMs || compare(a.scope, b.scope) || compare(a.key, b.key)).slice(0, limit)
  }

  /**
   * Deletes up to `limit` records past their expiry. Redis drops every record's key by itself
   * (`expiredGrace` after it expired), so this is optional housekeeping: it SCANs onwards from
   * where the last call stopped and deletes what has expired, by the server's clock.
   */
  async purgeExpired(limit: number): Promise<number> {
    assertPositiveInteger(limit, 'limit')
    const client = await this.#ready('purgeExpired')
    this.#purgeScan ??= new ResumableScan(client, recordPattern(this.prefix))
    try {
      return await purgeScanned(client, this.#purgeScan, limit, this.prefix)
    } catch (error) {
      throw toStoreError('purgeExpired', this.prefix, error, client)
    }
  }

  async evict(scope: string, key: string): Promise<boolean> {
    assertIdentity(scope, key)
    const names = this.#names(scope, key)
    return (await this.#run('evict', scripts.evict, names, [names.channel], true)) === 1
  }

  /**
   * Wakes `onChange` when the record is completed, released or evicted (pub/sub); a no-op with
   * `notifications: false`. Flags the record as waited on (complete and release publish only then).
   */
  watch(scope: string, key: string, onChange: () => void): Unsubscribe {
    if (!this.#notifications || this.#closed) return () => {}
    assertIdentity(scope, key)
    const client = this.#client
    if (!client) return () => {} // still opening: the waiter polls
    this.#notifier ??= new Notifier(client, this.#socketTimeoutMs)
    const names = this.#names(scope, key)
    // A watcher that comes before its record leaves a marker for as long as an abandoned record lives.
    const flag = () => scripts.watch.run(client, names.key, [Number(this.#retention) + Number(this.#grace)])
    return this.#notifier.watch(names.channel, onChange, flag)
  }

  /** Closes the subscriber, and the client when the store opened it. */
  async close(): Promise<void> {
    this.#closed = true
    // The callers queued behind a batch in flight get their answers before the client goes.
    await this.#completions.idle()
    await this.#notifier?.close()
    this.#notifier = undefined
    if (!this.#ownsClient) return
    const client = await this.#opening?.catch(() => undefined)
    this.#client = undefined
    if (!client) return
    // QUIT needs a connection that answers. On one that does not (a hung server, another service on
    // the port) it waits out the socket timeout, and the client then goes on reconnecting for ever,
    // which keeps the process alive: a moment for QUIT, then the connection is dropped.
    let timer: NodeJS.Timeout | undefined
    await Promise.race([
      client.quit().catch(() => {}),
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, CLOSE_WAIT_MS)
      }),
    ])
    clearTimeout(timer)
    client.disconnect?.()
  }

  /**
   * The names of a record's keys. Each costs a SHA-256, and a run asks for the same ones twice
   * (acquire, then complete) within milliseconds: the most recent are kept, in a bounded map.
   */
  #names(scope: string, key: string): RecordNames {
    return this.#recentOf(scope, key).names
  }

  /**
   * The entry of (scope, key) among recent records. Keyed by the key alone, which the ledger hands to
   * acquire and complete as the same string (its hash is computed once and kept on it): a key joined
   * with its scope is a new string at every call, to build and hash again. A key that arrives under
   * another scope takes the entry over (the first scope's complete then names its record afresh).
   */
  #recentOf(scope: string, key: string): Recent {
    let recent = this.#recent.get(key)
    if (recent === undefined || recent.scope !== scope) {
      if (this.#recent.size >= RECENT_RECORDS) this.#recent.clear()
      recent = { scope, names: recordNames(this.prefix, scope, key), fresh: undefined }
      this.#recent.set(key, recent)
    }
    return recent
  }

  /**
   * With `durability`: runs one write and, when `wrote` says it changed the record, answers only once the
   * replicas confirm it; else `unconfirmed` undoes what it can (only while the connection that wrote it
   * is still the one in use) and the NotReplicatedError is thrown.
   */
  async #waited<T>(
    operation: string,
    durable: Durability,
    run: () => Promise<T>,
    wrote: (answer: T) => boolean,
    unconfirmed?: (answer: T) => Promise<unknown>,
  ): Promise<T> {
    const client = this.#client ?? (await this.#ready(operation))
    const epoch = durable.epochOf(client)
    const answer = await run()
    if (!wrote(answer)) return answer
    try {
      await durable.confirm(client, operation, epoch)
    } catch (error) {
      if (unconfirmed && !(error as NotReplicatedError).connectionLost && durable.epochOf(client) === epoch) {
        await unconfirmed(answer).catch(() => {})
      }
      throw error
    }
    return answer
  }

  /** Whether the record is completed or failed with `token`: the holder's own completion, stored earlier. */
  async #completedBy(scope: string, key: string, token: number): Promise<boolean> {
    const read = await this.#read('complete', this.#names(scope, key).key)
    return read !== null && read.record.status !== 'in_progress' && read.record.token === token
  }

  async #ready(operation: string): Promise<RedisClientLike> {
    if (this.#client) return this.#client
    try {
      this.#client = await (this.#opening as Promise<RedisClientLike>)
      return this.#client
    } catch (error) {
      throw toStoreError(operation, this.prefix, error)
    }
  }

  #run(operation: string, script: Script, names: RecordNames, args: RedisArg[], withSteps = false): Promise<unknown> {
    // The hot path, once the client is open: one promise chain, no extra async layer.
    const client = this.#client
    const steps = withSteps ? names.steps : undefined
    if (client) return script.run(client, names.key, args, steps).catch((error: unknown) => fail(operation, names.key, error, client))
    return this.#ready(operation).then((opened) =>
      script.run(opened, names.key, args, steps).catch((error: unknown) => fail(operation, names.key, error, opened)),
    )
  }

  /** A record with the server's time of the read, or null when the key is absent. */
  async #read(operation: string, redisKey: string): Promise<{ record: StoredRecord; nowMs: number } | null> {
    const client = this.#client ?? (await this.#ready(operation))
    let reply: unknown[]
    try {
      reply = (await scripts.read.run(client, redisKey, [])) as unknown[]
    } catch (error) {
      throw toStoreError(operation, redisKey, error, client)
    }
    return readAnswer(reply, redisKey)
  }
}

const stored = (written: boolean) => written

/** How many recent records (their key names, their fresh value) a store keeps at most (see #recentOf): a few hundred kilobytes. */
const RECENT_RECORDS = 4_096

/**
 * The body as a command argument. A Buffer argument makes ioredis build the command, and the whole
 * auto-pipelined batch it joins, as Buffers; a string keeps it on ioredis's cheaper string path.
 * Valid UTF-8 decodes and encodes back to the same bytes, so only such bodies go as text.
 */
function bodyArg(body: Uint8Array): string | Buffer {
  const bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength)
  return isUtf8(bytes) ? bytes.toString('utf8') : bytes
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0
}
