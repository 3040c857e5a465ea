/**
 * `idemkey/redis`: the Redis store (one server or a Cluster), on ioredis or node-redis.
 *
 * @example
 * import { RedisStore } from 'idemkey/redis'
 * const store = new RedisStore({ url: 'redis://127.0.0.1:6379' })
 */
export type { RedisArg, RedisClientLike, RedisSubscriberLike } from './client.js'
export { NotReplicatedError, type RedisDurability } from './durability.js'
export { type RecordNames, recordNames } from './keys.js'
export {
  fromNodeRedis,
  fromNodeRedisCluster,
  isNodeRedisClient,
  isNodeRedisCluster,
  type NodeRedisClientLike,
  type NodeRedisClusterLike,
} from './node-redis.js'
export type { RedisStoreOptions } from './options.js'
export { RedisStore } from './redis-store.js'
