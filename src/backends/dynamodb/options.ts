import type { Clock } from '../../core/clock.js'
import type { Duration } from '../../core/duration.js'
import type { DynamoDbClientLike } from './client.js'
import type { DynamoDbAttributeNames } from './schema.js'

/** Options of {@link DynamoDbStore}. */
export interface DynamoDbStoreOptions {
  /** The table's name. Create it with `await store.migrate()` (or see docs/dynamodb.md for the schema). */
  table: string
  /**
   * Your `DynamoDBClient` (from `@aws-sdk/client-dynamodb`); `close()` leaves it open. Without it the
   * store makes its own from `clientConfig` (region and credentials from the environment by default).
   */
  client?: DynamoDbClientLike
  /** Configuration of the client the store makes when no `client` is given, e.g. `{ region, endpoint }`. */
  clientConfig?: Record<string, unknown>
  /** Attribute names of the table's keys and TTL, for a table shared with other items. */
  attributes?: DynamoDbAttributeNames
  /** Start of every partition key the store writes; `list` and `purgeExpired` only touch items under it. @default 'idemkey#' */
  keyPrefix?: string
  /** The value written into the sort key, when `attributes.sortKey` is set. @default 'idemkey' */
  sortKeyValue?: string
  /**
   * DynamoDB has no server clock: leases run on the callers' clocks. A lease is taken over only once it
   * ended this long ago by the taker's clock, so callers whose clocks differ by less than this never
   * overlap. @default '1s'
   */
  clockSkew?: Duration
  /** How long a record whose lease ended is kept (and its token counted) before it may be purged. @default '24h' */
  abandonedRetention?: Duration
  /**
   * How long after a record expired its TTL attribute lets DynamoDB delete it. Meanwhile the record counts as
   * absent but its token keeps counting, so a late zombie stays fenced out. @default '1h'
   */
  expiredGrace?: Duration
  /** The clock of leases and expiry. Give it the ledger's `ManualClock` in tests. @default systemClock */
  clock?: Clock
  /**
   * How long a request the store sends (its retries included) may go unanswered before it is abandoned:
   * it fails (`STORE_UNAVAILABLE`) and its connection is destroyed. The SDK sets no such bound, and a
   * half-open connection (a NAT or firewall that forgot it) never answers: each would keep its request
   * waiting and its socket in use for ever, until none is left. Also bounds requests on your own
   * `client`. Keep it above the ledger's `storeTimeout`; `0` bounds nothing. @default '10s'
   */
  requestTimeout?: Duration
}
