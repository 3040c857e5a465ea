import { createHash } from 'node:crypto'
import { redactUrl } from '../../core/redact-url.js'
import { IdempotencyError, storeUnavailable } from '../../errors.js'

/** An argument of a Redis command. */
export type RedisArg = string | Buffer | number

/**
 * The subset of an ioredis client (`Redis` or `Cluster`) the store needs, declared structurally so
 * a store accepts your existing client without importing ioredis types. Replies must be Buffers
 * (`callBuffer`), so bodies round-trip byte for byte.
 */
export interface RedisClientLike {
  /** Sends one command; bulk replies come back as Buffers. */
  callBuffer(...args: [command: string, ...args: RedisArg[]]): Promise<unknown>
  /** A new connection with the same options: the store's subscriber for wake-ups. */
  duplicate(): RedisSubscriberLike
  quit(): Promise<unknown>
  /** Drops the connection at once and stops reconnecting (ioredis); used by `close()` when QUIT gets no answer. */
  disconnect?(): void
  /** `true` on an ioredis `Cluster`. */
  readonly isCluster?: boolean
  /** The master nodes of a cluster (ioredis `Cluster#nodes('master')`), scanned by `list` and `purgeExpired`. */
  nodes?(role: 'master'): RedisClientLike[]
  /**
   * Calls `listener` each time the connection is lost (the node-redis adapter; an ioredis client's
   * 'close' event serves instead). The `durability` option needs one or the other.
   */
  onConnectionLost?(listener: () => void): void
}

/** What the store uses of its subscriber connection (an ioredis `Redis` or `Cluster`). */
export interface RedisSubscriberLike {
  subscribe(...channels: string[]): Promise<unknown>
  unsubscribe(...channels: string[]): Promise<unknown>
  on(event: 'message', listener: (channel: string, message: string) => void): unknown
  on(event: 'error', listener: (error: Error) => void): unknown
  quit(): Promise<unknown>
  disconnect(): void
  /** ioredis answers PING in subscriber mode: the store's own subscriber sends one to find out a dead connection. */
  ping?(): Promise<unknown>
}

/**
 * Opens an ioredis client for a `redis://` or `rediss://` URL, tuned to fail fast: a command sent
 * while Redis is unreachable fails after one reconnect attempt instead of waiting in a queue, and
 * a connection attempt gives up after 2 s. The ledger then answers `STORE_UNAVAILABLE`. A connection
 * that stops answering for `socketTimeoutMs` while a command waits is destroyed and reconnected: a
 * half-open connection (a NAT or firewall that forgot it, a server host that vanished) would
 * otherwise hang every command sent on it for ever, since the kernel never closes it.
 */
export async function openClient(url: string, socketTimeoutMs: number, database = databaseOf(url)): Promise<RedisClientLike> {
  let Redis: typeof import('ioredis').Redis
  try {
    ;({ Redis } = await import('ioredis'))
  } catch (error) {
    throw new IdempotencyError('INVALID_OPTION', 'RedisStore({ url }) needs the ioredis package: npm install ioredis', { cause: error })
  }
  const client = new Redis(url, {
    maxRetriesPerRequest: 1,
    connectTimeout: 2_000,
    retryStrategy: (attempt: number) => Math.min(attempt * 50, 1_000),
    lazyConnect: false,
    // Armed only while a command waits for its reply; duplicate() (the subscriber) inherits it.
    socketTimeout: socketTimeoutMs,
    // Commands of concurrent callers issued in the same tick share one write: fewer syscalls on both sides.
    enableAutoPipelining: true,
  })
  // Errors reach the caller through the failed command; without a listener ioredis prints each one. The
  // last one is kept: a command given up while the connection is down says only that it was given up.
  client.on('error', (error: Error) => connectionErrors.set(client, error))
  client.on('ready', () => connectionErrors.delete(client))
  if (database > 0) {
    // ioredis selects the URL's database on each connect, and when Redis refuses it (past the server's
    // `databases`, 16 by default) it only emits an error and goes on in database 0: records would land
    // where no one looks. Asked once here, a refusal fails the store's operations instead.
    try {
      await client.select(database)
    } catch (error) {
      if ((error as Error).name === 'ReplyError') {
        client.disconnect()
        throw new IdempotencyError(
          'INVALID_OPTION',
          `Redis refused database ${database} of the URL ${redactUrl(url)} (${(error as Error).message}): a server has databases 0 to its \`databases\` setting minus 1 (0-15 by default). Give one of those in the URL's path.`,
          { cause: error },
        )
      }
      // Not reachable now: ioredis selects the database when it connects, and operations report the outage.
    }
  }
  return client as unknown as RedisClientLike
}

/**
 * The database number of a `redis://` URL's path (`redis://host:6379/2`: 2; none: 0). Anything else in
 * the path is refused: ioredis would send `SELECT NaN`, which Redis refuses, and go on in database 0.
 */
export function databaseOf(url: string): number {
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `RedisStore url "${redactUrl(url)}" is not a URL: give redis://host:port, or rediss://host:port for TLS.`,
    )
  }
  const path = parsed.pathname
  if (path === '' || path === '/') return 0
  if (!/^\/\d{1,9}$/.test(path)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `RedisStore url "${redactUrl(url)}": the path of a Redis URL is a database number, e.g. redis://127.0.0.1:6379/0, not "${path.slice(1)}".`,
    )
  }
  return Number(path.slice(1))
}

/** The last connection error of each client {@link openClient} made, until it is ready again. */
const connectionErrors = new WeakMap<object, Error>()

/**
 * Sends `command` with Buffer replies: through ioredis's `<command>Buffer` method when the client
 * has one, else through `callBuffer`.
 */
export function sendBuffer(client: RedisClientLike, command: string, args: RedisArg[]): Promise<unknown> {
  // ioredis has `evalshaBuffer`, `evalBuffer`, `scanBuffer` (untyped for eval): prefer them, since
  // `callBuffer` loses its command name under ioredis's `enableAutoPipelining`.
  const method = (client as unknown as Record<string, unknown>)[`${command}Buffer`]
  if (typeof method === 'function') return (method as (...a: RedisArg[]) => Promise<unknown>).apply(client, args)
  return client.callBuffer(command, ...args)
}

/** A Lua script called by its SHA1, loaded again with EVAL when Redis answers NOSCRIPT. */
export class Script {
  readonly sha: string
  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex')
  }

  /** Runs the script on the record's key and, when given, its steps key (the same hash tag, so the same slot). */
  run(client: RedisClientLike, key: string, args: RedisArg[], stepsKey?: string): Promise<unknown> {
    return this.runOn(client, stepsKey === undefined ? [1, key] : [2, key, stepsKey], args)
  }

  /** Runs the script on several keys (a group commit's batch, on one server): `keys` starts with their count. */
  runOn(client: RedisClientLike, keys: RedisArg[], args: RedisArg[]): Promise<unknown> {
    // A plain promise chain, not an async function: this runs twice per cycle, and each async
    // layer costs the event loop a few microtask turns. A client that throws still rejects.
    let sent: Promise<unknown>
    try {
      sent = sendBuffer(client, 'evalsha', [this.sha, ...keys, ...args])
    } catch (error) {
      return Promise.reject(error)
    }
    return sent.catch((error: unknown) => {
      // After a restart, a failover or SCRIPT FLUSH the server no longer knows the script.
      if (!isNoScript(error)) throw error
      return sendBuffer(client, 'eval', [this.source, ...keys, ...args])
    })
  }
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT')
}

/**
 * Turns a driver error into an idemkey error: a key of another type or a foreign hash is
 * `STORE_SCHEMA` (something else writes under the store's prefix), everything else is
 * `STORE_UNAVAILABLE` with the driver's error as `cause`.
 */
export function toStoreError(operation: string, key: string, error: unknown, client?: object): IdempotencyError {
  const message = error instanceof Error ? error.message : String(error)
  if (message.startsWith('WRONGTYPE') || message.includes('IDEMKEY_FOREIGN')) {
    return new IdempotencyError(
      'STORE_SCHEMA',
      `redis: ${operation} found ${key} holding something idemkey did not write (${message}). Another program writes under the store's prefix: give the store its own prefix, or delete the key (idemkey evict) if it is garbage.`,
      { cause: error },
    )
  }
  if (error instanceof Error && error.name === 'MaxRetriesPerRequestError') {
    // ioredis's own words ("Reached the max retries per request limit…") name an option, not the trouble.
    const last = client ? connectionErrors.get(client) : undefined
    const why = last ? ` (${last.message || (last as NodeJS.ErrnoException).code})` : ''
    return storeUnavailable(
      'redis',
      operation,
      error,
      `no connection to Redis${why}, and the command was given up after a reconnect attempt`,
    )
  }
  return storeUnavailable('redis', operation, error)
}

/**
 * Whether the server behind an `INFO server` reply takes `SET key value IFEQ old` (a native
 * compare-and-set): Valkey 8.1 and later (which still reports `redis_version:7.2.4`, so its own
 * `valkey_version` decides) and Redis 8.4 and later.
 */
export function serverHasSetIfEq(info: string): boolean {
  const field = (name: string) => new RegExp(`^${name}:(\\d+)\\.(\\d+)`, 'm').exec(info)
  const atLeast = (m: RegExpExecArray | null, major: number, minor: number) =>
    m !== null && (Number(m[1]) > major || (Number(m[1]) === major && Number(m[2]) >= minor))
  const valkey = field('valkey_version')
  if (valkey !== null || /^server_name:valkey/m.test(info)) return atLeast(valkey, 8, 1)
  return atLeast(field('redis_version'), 8, 4)
}
