/**
 * node-redis (`redis` / `@redis/client`, v5 and later: `withTypeMapping` gives Buffer replies) behind the client interface RedisStore uses, so
 * an app that already holds a node-redis client passes it as it is: `new RedisStore({ client })`.
 * Structural: idemkey does not import node-redis.
 */
import { IdempotencyError } from '../../errors.js'
import type { RedisArg, RedisClientLike, RedisSubscriberLike } from './client.js'

/** node-redis's RESP type code of a bulk string ('$'), mapped to Buffer so records come back as bytes. */
const BLOB_STRING = 36

/** The part of a node-redis client the adapter uses. */
export interface NodeRedisClientLike {
  sendCommand(args: Array<string | Buffer>): Promise<unknown>
  withTypeMapping(mapping: Record<number, unknown>): { sendCommand(args: Array<string | Buffer>): Promise<unknown> }
  duplicate(): NodeRedisClientLike
  connect(): Promise<unknown>
  readonly isOpen: boolean
  subscribe(channels: string | string[], listener: (message: string, channel: string) => void): Promise<unknown>
  unsubscribe(channels?: string | string[]): Promise<unknown>
  on(event: 'error', listener: (error: Error) => void): unknown
  close?(): Promise<unknown>
  quit?(): Promise<unknown>
  destroy?(): void
  disconnect?(): unknown
}

/** The part of a node-redis cluster (`createCluster`) the adapter uses, beside what a client has. */
export interface NodeRedisClusterLike extends Omit<NodeRedisClientLike, 'sendCommand' | 'withTypeMapping' | 'duplicate'> {
  sendCommand(firstKey: string | Buffer | undefined, isReadonly: boolean | undefined, args: Array<string | Buffer>): Promise<unknown>
  withTypeMapping(mapping: Record<number, unknown>): NodeRedisClusterLike
  duplicate(): NodeRedisClusterLike
  readonly masters: readonly unknown[]
  nodeClient(node: unknown): Promise<NodeRedisClientLike>
}

/** Whether `client` is a node-redis cluster (`createCluster`): it routes by key and knows its masters. */
export function isNodeRedisCluster(client: unknown): client is NodeRedisClusterLike {
  const candidate = client as Partial<NodeRedisClusterLike> | null
  return isNodeRedisClient(client) && typeof candidate?.nodeClient === 'function' && 'masters' in (candidate as object)
}

/** Whether `client` is a node-redis client or cluster (and not an ioredis one). */
export function isNodeRedisClient(client: unknown): client is NodeRedisClientLike {
  const candidate = client as Partial<NodeRedisClientLike & { callBuffer: unknown }> | null
  return (
    typeof candidate === 'object' &&
    candidate !== null &&
    typeof candidate.sendCommand === 'function' &&
    typeof candidate.withTypeMapping === 'function' &&
    typeof candidate.callBuffer !== 'function'
  )
}

function close(client: Pick<NodeRedisClientLike, 'close' | 'quit'>): Promise<unknown> {
  if (typeof client.close === 'function') return client.close()
  if (typeof client.quit === 'function') return client.quit()
  return Promise.resolve()
}

/** The subscriber the store listens on: a duplicate of the app's client, connected on first use. */
function subscriberOf(client: Omit<NodeRedisClientLike, 'sendCommand' | 'withTypeMapping' | 'duplicate'>): RedisSubscriberLike {
  const listeners: Array<(channel: string, message: string) => void> = []
  let connecting: Promise<unknown> | undefined
  const ready = (): Promise<unknown> => {
    if (client.isOpen) return Promise.resolve()
    connecting ??= client.connect()
    return connecting
  }
  const onMessage = (message: string, channel: string) => {
    for (const listener of listeners) listener(channel, message)
  }
  return {
    async subscribe(...channels) {
      await ready()
      return client.subscribe(channels, onMessage)
    },
    async unsubscribe(...channels) {
      if (!client.isOpen) return
      return client.unsubscribe(channels)
    },
    on(event: 'message' | 'error', listener: ((channel: string, message: string) => void) | ((error: Error) => void)) {
      if (event === 'message') listeners.push(listener as (channel: string, message: string) => void)
      else client.on('error', listener as (error: Error) => void)
      return this
    },
    quit: () => (client.isOpen ? close(client) : Promise.resolve()),
    disconnect() {
      if (typeof client.destroy === 'function') client.destroy()
      else Promise.resolve(client.disconnect?.()).catch(() => {})
    },
  }
}

/**
 * Adapts a connected node-redis client to the store. RedisStore does it by itself for a node-redis
 * client passed as `client`; call it only to hold the adapted client yourself.
 */
export function fromNodeRedis(client: NodeRedisClientLike): RedisClientLike {
  const bytes = client.withTypeMapping({ [BLOB_STRING]: Buffer })
  return {
    callBuffer: (command: string, ...args: RedisArg[]) => bytes.sendCommand([command, ...wire(args)]),
    duplicate: () => subscriberOf(client.duplicate()),
    quit: () => close(client),
    onConnectionLost: (listener) => {
      // node-redis reports a lost socket as an 'error', then 'reconnecting'; 'end' when closed.
      for (const event of ['error', 'reconnecting', 'end'] as const) (client.on as (e: string, l: () => void) => unknown)(event, listener)
    },
  }
}

/** An argument as node-redis sends it: numbers become strings. */
const wire = (args: RedisArg[]) => args.map((arg) => (typeof arg === 'number' ? String(arg) : arg))

/**
 * The key a command is routed by: a script's first key (after the script and the key count), else the
 * first argument. Every command the store sends names its record's key, so the cluster sends it to the
 * slot that holds it.
 */
function routingKey(command: string, args: RedisArg[]): string | Buffer | undefined {
  const name = command.toLowerCase()
  const key = name === 'evalsha' || name === 'eval' ? args[2] : args[0]
  return typeof key === 'number' ? String(key) : key
}

/**
 * Adapts a connected node-redis cluster (`createCluster`) to the store: commands are routed by their
 * record's key, `list`/`purgeExpired` scan every master (through `nodeClient`), and wake-ups come through a
 * duplicate of the cluster. RedisStore does it by itself for a cluster passed as `client`.
 */
export function fromNodeRedisCluster(cluster: NodeRedisClusterLike): RedisClientLike {
  const bytes = cluster.withTypeMapping({ [BLOB_STRING]: Buffer })
  const node = (master: unknown): RedisClientLike => ({
    callBuffer: async (command: string, ...args: RedisArg[]) => {
      const client = await bytes.nodeClient(master)
      return client.sendCommand([command, ...wire(args)])
    },
    duplicate: () => {
      throw new Error('a cluster node is only scanned')
    },
    quit: async () => {},
  })
  return {
    callBuffer: (command: string, ...args: RedisArg[]) => bytes.sendCommand(routingKey(command, args), false, [command, ...wire(args)]),
    duplicate: () => subscriberOf(cluster.duplicate()),
    quit: () => close(cluster),
    isCluster: true,
    nodes: () => bytes.masters.map(node),
  }
}

/**
 * The client the store sends its commands through: a node-redis 5+ cluster or client behind the adapter,
 * an ioredis one as it is. Refuses at construction a client the store would only fail on later: one with
 * neither ioredis's `callBuffer` nor node-redis 5's `withTypeMapping` (node-redis 4, `redis@4` /
 * `@redis/client@1`, has `sendCommand` but no way to ask for Buffer replies).
 */
export function adaptClient(client: RedisClientLike | NodeRedisClientLike | NodeRedisClusterLike): RedisClientLike {
  if (typeof (client as { getMasterNode?: unknown }).getMasterNode === 'function') {
    // createSentinel()'s sendCommand takes (isReadonly, args) and spreads commands over a pool of
    // connections, where a WAIT would not see the write it follows.
    throw new IdempotencyError(
      'INVALID_OPTION',
      'RedisStore({ client }) does not take node-redis\'s createSentinel() client: pass an ioredis client that follows your sentinels, new Redis({ sentinels, name }) (docs/redis.md, "Replication and failover").',
    )
  }
  if (isNodeRedisCluster(client)) return fromNodeRedisCluster(client)
  if (isNodeRedisClient(client)) return fromNodeRedis(client)
  if (typeof (client as { callBuffer?: unknown }).callBuffer === 'function') return client as RedisClientLike
  const hint =
    typeof (client as { sendCommand?: unknown }).sendCommand === 'function'
      ? ' This looks like node-redis 4 (redis@4, @redis/client@1), which cannot return replies as bytes: upgrade to redis@5 or later.'
      : ''
  throw new IdempotencyError(
    'INVALID_OPTION',
    `RedisStore({ client }) takes an ioredis Redis or Cluster, or a node-redis 5+ client or cluster.${hint}`,
  )
}
