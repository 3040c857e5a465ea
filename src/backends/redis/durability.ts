/**
 * The Redis store's `durability` option: an acquisition, a renewal, a completion or a recorded step is
 * answered only once `replicas` replicas have it (`WAIT`), and with `aof` once it is fsynced to the AOF of
 * the primary and of those replicas (`WAITAOF`, Redis 7.2+). A write the replicas do not confirm fails
 * with {@link NotReplicatedError}; docs/redis.md, "Replication and failover".
 */
import { type Duration, parseDuration } from '../../core/duration.js'
import { IdempotencyError } from '../../errors.js'
import { type RedisClientLike, sendBuffer } from './client.js'

/** The `durability` option of RedisStore. */
export interface RedisDurability {
  /**
   * How many replicas must have a write before the store answers (`WAIT <replicas> <timeout>`). Give the
   * number of replicas your failover may promote: a replica that did not confirm may be the one promoted.
   */
  replicas: number
  /**
   * How long a write waits for its replicas before it fails with {@link NotReplicatedError}. The
   * connection waits meanwhile (Redis answers nothing else on it), so keep it well below the ledger's
   * `storeTimeout` and the client's `socketTimeout`. @default '1s'
   */
  timeout?: Duration
  /**
   * Also wait until the write is fsynced to the append-only file of the primary and of `replicas`
   * replicas (`WAITAOF 1 <replicas> <timeout>`): Redis 7.2 or later, `appendonly yes` on every node. A
   * server without WAITAOF fails every durable write with `INVALID_OPTION`. @default false
   */
  aof?: boolean
}

/**
 * A write that Redis took but that its replicas did not confirm in time (or whose connection was lost
 * before they did): the store withholds the answer. Its code is `STORE_UNAVAILABLE`, so the ledger
 * retries a completion while the lease lasts and the HTTP layer answers 503; the record is kept as
 * written, so a retry is safe (a completion retried by the same holder is confirmed, not refused).
 *
 * @example
 * catch (error) { if (error instanceof NotReplicatedError) log.warn(error.confirmed, 'of', error.required) }
 */
export class NotReplicatedError extends IdempotencyError {
  /** The store operation whose write was not confirmed: acquire, renew, complete or recordStep. */
  readonly operation: string
  /** The replicas the option asks for. */
  readonly required: number
  /** The replicas that confirmed (0 when the connection was lost first). */
  readonly confirmed: number
  /** Whether the connection was lost before the replicas answered (a failover, most likely). */
  readonly connectionLost: boolean

  constructor(operation: string, required: number, confirmed: number, why: string, cause?: unknown, connectionLost = false) {
    super(
      'STORE_UNAVAILABLE',
      `redis: ${operation} was written on the primary, but ${why}, so its answer is withheld (durability: { replicas: ${required} }). The record is kept: a retry is safe.`,
      cause === undefined ? undefined : { cause },
    )
    this.operation = operation
    this.required = required
    this.confirmed = confirmed
    this.connectionLost = connectionLost
  }
}

/** The option, checked: throws INVALID_OPTION with what is wrong. */
export function checkDurability(
  option: RedisDurability | undefined,
  socketTimeoutMs: number | undefined,
): { replicas: number; timeoutMs: number; aof: boolean } | undefined {
  if (option === undefined) return undefined
  const bad = (what: string) => new IdempotencyError('INVALID_OPTION', `RedisStore durability: ${what}`)
  if (typeof option !== 'object' || option === null) throw bad('give { replicas: n, timeout?: "1s", aof?: false }, or leave it out.')
  const known = ['replicas', 'timeout', 'aof']
  const unknown = Object.keys(option).filter((name) => !known.includes(name))
  if (unknown.length > 0) throw bad(`unknown field ${unknown.join(', ')} (it takes ${known.join(', ')}).`)
  if (!Number.isSafeInteger(option.replicas) || option.replicas < 1) {
    throw bad(`replicas must be a whole number of replicas, 1 or more, got ${String(option.replicas)}.`)
  }
  const timeoutMs = parseDuration(option.timeout ?? '1s', 'RedisStore durability.timeout')
  // WAIT 0 waits for ever: a replica that never comes back would hang every write.
  if (timeoutMs < 1) throw bad('timeout must be at least 1ms (WAIT with 0 waits for ever).')
  if (socketTimeoutMs !== undefined && timeoutMs >= socketTimeoutMs) {
    throw bad(`timeout (${timeoutMs}ms) must be below socketTimeout (${socketTimeoutMs}ms): the connection is silent while it waits.`)
  }
  if (option.aof !== undefined && typeof option.aof !== 'boolean') throw bad(`aof must be true or false, got ${String(option.aof)}.`)
  return { replicas: option.replicas, timeoutMs, aof: option.aof ?? false }
}

/** The part of a client whose connection losses the durability follows (ioredis: 'close'). */
interface Closable {
  on(event: 'close', listener: () => void): unknown
}

interface Waiter {
  epoch: number
  resolve: () => void
  reject: (error: unknown) => void
  operation: string
}

/**
 * Confirms writes with WAIT (or WAITAOF), one command for every write answered while the previous one
 * was in flight: WAIT covers every write its connection sent before it, so callers queue behind the one
 * in flight and go out together, as the group commit does.
 *
 * WAIT counts the writes of its own connection. A connection lost between a write and its WAIT (a
 * failover: the client reconnects to the new primary) would have the WAIT ask the new primary about
 * nothing and answer at once; so every close of the client's connection moves an epoch on, and a write
 * whose epoch moved before its WAIT answered is not confirmed.
 */
export class Durability {
  readonly replicas: number
  readonly #timeoutMs: number
  readonly #aof: boolean
  #epoch = 0
  readonly #followed = new WeakSet<object>()
  #queue: Waiter[] = []
  #busy = false
  /** With aof: whether the server has WAITAOF (asked once, INFO server), or the error to fail with. */
  #waitAof: Promise<void> | undefined

  constructor(option: { replicas: number; timeoutMs: number; aof: boolean }) {
    this.replicas = option.replicas
    this.#timeoutMs = option.timeoutMs
    this.#aof = option.aof
  }

  /** The epoch of the client's connection now: take it before a write, give it to {@link confirm}. */
  epochOf(client: RedisClientLike): number {
    this.#follow(client)
    return this.#epoch
  }

  /** Waits until the replicas have every write this connection sent since `epoch`. */
  async confirm(client: RedisClientLike, operation: string, epoch: number): Promise<void> {
    if (this.#aof) {
      this.#waitAof ??= hasWaitAof(client).catch((error: unknown) => {
        // Only the server's answer is kept; a lost INFO is asked again next time.
        if ((error as IdempotencyError).code !== 'INVALID_OPTION') this.#waitAof = undefined
        throw error
      })
      await this.#waitAof
    }
    return new Promise<void>((resolve, reject) => {
      this.#queue.push({ epoch, resolve, reject, operation })
      if (!this.#busy) this.#send(client)
    })
  }

  #send(client: RedisClientLike): void {
    const batch = this.#queue
    this.#queue = []
    this.#busy = true
    const args = this.#aof ? [1, this.replicas, this.#timeoutMs] : [this.replicas, this.#timeoutMs]
    sendBuffer(client, this.#aof ? 'waitaof' : 'wait', args)
      .then(
        (reply) => {
          const confirmed = this.#aof ? ((reply as number[])[0] === 1 ? Number((reply as number[])[1]) : 0) : Number(reply)
          for (const waiter of batch) {
            if (waiter.epoch !== this.#epoch) waiter.reject(this.#lost(waiter.operation))
            else if (confirmed >= this.replicas) waiter.resolve()
            else
              waiter.reject(
                new NotReplicatedError(
                  waiter.operation,
                  this.replicas,
                  confirmed,
                  `only ${confirmed} of ${this.replicas} replicas confirmed it within ${this.#timeoutMs}ms (${this.#aof ? 'WAITAOF' : 'WAIT'})`,
                ),
              )
          }
        },
        (error: unknown) => {
          for (const waiter of batch) waiter.reject(this.#lost(waiter.operation, error))
        },
      )
      .finally(() => {
        this.#busy = false
        if (this.#queue.length > 0) this.#send(client)
      })
  }

  #lost(operation: string, cause?: unknown): NotReplicatedError {
    return new NotReplicatedError(
      operation,
      this.replicas,
      0,
      'the connection to it was lost before its replicas confirmed it',
      cause,
      true,
    )
  }

  #follow(client: RedisClientLike): void {
    if (this.#followed.has(client)) return
    this.#followed.add(client)
    const closable = client as unknown as Partial<Closable>
    if (typeof closable.on === 'function') closable.on('close', () => this.#epoch++)
    else client.onConnectionLost?.(() => this.#epoch++)
  }
}

/** Whether a client can report a lost connection (ioredis's 'close', or the node-redis adapter's hook). */
export function followsConnection(client: object): boolean {
  return typeof (client as Partial<Closable>).on === 'function' || typeof (client as RedisClientLike).onConnectionLost === 'function'
}

/** Resolves when the server has WAITAOF (Redis 7.2+); rejects with INVALID_OPTION naming its version otherwise. */
async function hasWaitAof(client: RedisClientLike): Promise<void> {
  const info = String(await sendBuffer(client, 'info', ['server']))
  const version = /^redis_version:(\d+)\.(\d+)/m.exec(info)
  const major = Number(version?.[1] ?? 0)
  const minor = Number(version?.[2] ?? 0)
  if (major > 7 || (major === 7 && minor >= 2)) return
  throw new IdempotencyError(
    'INVALID_OPTION',
    `RedisStore durability.aof needs WAITAOF (Redis 7.2 or later); this server is ${version ? `${major}.${minor}` : 'of an unknown version'}. Upgrade it, or leave aof out to wait for replicas only (WAIT).`,
  )
}
