/**
 * node-redis (`redis` / `@redis/client`, v4 and later) behind the client interface RedisStore uses, so
 * an app that already holds a node-redis client passes it as it is: `new RedisStore({ client })`.
 * Structural: idemkey does not import node-redis.
 */
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

/** Whether `client` is a node-redis client (and not an ioredis one). */
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

function close(client: NodeRedisClientLike): Promise<unknown> {
  if (typeof client.close === 'function') return client.close()
  if (typeof client.quit === 'function') return client.quit()
  return Promise.resolve()
}

/** The subscriber the store listens on: a duplicate of the app's client, connected on first use. */
function subscriberOf(client: NodeRedisClientLike): RedisSubscriberLike {
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
    callBuffer: (command: string, ...args: RedisArg[]) =>
      bytes.sendCommand([command, ...args.map((arg) => (typeof arg === 'number' ? String(arg) : arg))]),
    duplicate: () => subscriberOf(client.duplicate()),
    quit: () => close(client),
  }
}
