import type { Duration } from '../../core/duration.js'
import type { RedisClientLike } from './client.js'
import type { RedisDurability } from './durability.js'
import type { NodeRedisClientLike, NodeRedisClusterLike } from './node-redis.js'

/** Options of {@link RedisStore}: give it a client, or a URL to open one. */
export interface RedisStoreOptions {
  /**
   * Your ioredis `Redis` or `Cluster` (or anything with the same methods, see {@link RedisClientLike}), or
   * your connected node-redis client (`createClient()` of `redis`/`@redis/client`) or cluster (`createCluster()`);
   * `close()` leaves it open. Tune it to fail fast (see docs/redis.md): `maxRetriesPerRequest: 1`.
   */
  client?: RedisClientLike | NodeRedisClientLike | NodeRedisClusterLike
  /** A `redis://` or `rediss://` URL of one server; the store opens (and closes) its own ioredis client, tuned to fail fast. */
  url?: string
  /**
   * With `url`: how long the store's client waits for any reply while a command is outstanding before it
   * drops the connection and reconnects (the commands in flight fail with `STORE_UNAVAILABLE`). A
   * half-open connection (a NAT or firewall that forgot it, a Redis host that vanished) is never
   * closed by the kernel, and would otherwise hang every later command for ever; the subscriber
   * sends a PING that often while anyone waits, so a dead one is replaced too. Keep it above the
   * ledger's `storeTimeout`. With your own `client`, set ioredis's `socketTimeout` yourself. @default '10s'
   */
  socketTimeout?: Duration
  /** Start of every key and channel name the store uses (A-Z a-z 0-9 _ . : -). @default 'idemkey' */
  prefix?: string
  /** How long a record whose lease ended is kept (and its token counted) before Redis drops it. @default '24h' */
  abandonedRetention?: Duration
  /**
   * How long Redis keeps a record's key after the record expired. Meanwhile the record counts as
   * absent, but its token keeps counting (a late zombie stays fenced out) and `purgeExpired` can
   * delete it. @default '1m'
   */
  expiredGrace?: Duration
  /** Wake waiters through pub/sub (one subscriber connection per store, opened on first wait); `false`: waiters only poll. @default true */
  notifications?: boolean
  /** Most keys `list` reads (SCAN over every node, then one read per record). @default 100000 */
  listScanLimit?: number
  /**
   * Complete a record this store acquired with one native compare-and-set,
   * `SET key <outcome> IFEQ <the record it wrote> PX <ttl + grace>`, instead of the complete script: Valkey 8.1+ and Redis
   * 8.4+ have it. By default the store asks the server once (`INFO server`, its version) and uses it
   * when there; `false` keeps the script. A server that refuses it (an older node after a failover)
   * turns it off for the store's life; the script then completes every record. See docs/redis.md.
   * @default detected from the server's version
   */
  nativeCompareAndSet?: boolean
  /**
   * Group commit of completes, on one server (a Cluster sends each alone): the completes callers issue
   * while one is in flight go to Redis together, and the fresh records among them (acquired by this
   * store, token 1, untouched since) are completed by compare-and-set in one script call (what `SET ...
   * IFEQ` does on the servers that have it), each caller answered with its own answer; anything else (a
   * renewed record, one someone waits on, a taken-over one) by the complete script, fenced by its token, as
   * without group commit. Under load it spares Redis a script call per complete; a caller alone sends its
   * command at once (no timer). `false`: one script call per complete. See docs/redis.md, "Group commit".
   * @default true
   */
  groupCommit?: boolean
  /**
   * Answer an acquisition, a renewal, a completion or a recorded step only once `replicas` replicas have
   * it (`WAIT`; with `aof: true`, `WAITAOF`), so a failover that promotes one of them loses no
   * acknowledged record. A write they do not confirm within `timeout` fails with
   * `NotReplicatedError` (`STORE_UNAVAILABLE`; the record is kept, a retry is safe). One server
   * with replicas (Sentinel, or a managed primary): a Cluster is refused. See docs/redis.md,
   * "Replication and failover". @default undefined: answers as soon as the primary has the write
   */
  durability?: RedisDurability
}
