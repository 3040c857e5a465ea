import type { Duration } from '../../core/duration.js'
import type { SqlTransactions } from '../../core/sql-transactions.js'
import type { PostgresDurability } from './durability.js'
import type { PgClientLike, PgPoolLike } from './pool.js'

/**
 * Isolation level of `store.transaction` (and so of `ledger.runInTransaction`).
 *
 * @example new PostgresStore({ pool, isolationLevel: 'serializable' })
 */
export type IsolationLevel = 'read committed' | 'repeatable read' | 'serializable'

/**
 * The purge loop of a long-running process: deletes expired records in bounded batches.
 *
 * @example new PostgresStore({ pool, gc: { interval: '5m', batchSize: 500, onError: (e) => log.warn(e) } })
 */
export interface PostgresGcOptions {
  /** How often a round of purging runs. @default '1m' */
  interval?: Duration
  /** Rows deleted per statement; a round repeats batches until one deletes fewer. @default 1000 */
  batchSize?: number
  /** Called when a round fails (the next round tries again). @default ignore */
  onError?: (error: unknown) => void
}

/**
 * Options shared by both ways of connecting.
 *
 * @example new PostgresStore({ pool, schema: 'app', table: 'idempotency', abandonedRetention: '6h' })
 */
export interface PostgresStoreCommonOptions {
  /** Schema of the table (created by `migrate()` if missing). @default 'public' */
  schema?: string
  /** Table name (a plain identifier, up to 63 characters). @default 'idemkey_records' */
  table?: string
  /** How long a record whose lease ended is kept before it may be purged. @default '24h' */
  abandonedRetention?: Duration
  /**
   * Wake waiters through LISTEN/NOTIFY (one shared listening connection per store, taken from the
   * pool while anyone waits). With `false`, waiters poll and completions send no NOTIFY. @default true
   */
  notifications?: boolean
  /** Isolation level of `transaction()` / `ledger.runInTransaction`. @default 'read committed' */
  isolationLevel?: IsolationLevel
  /**
   * Send the store's statements as named prepared statements (parsed and planned once per
   * connection). Turn off behind a pooler that cannot keep them (PgBouncer before 1.21 in
   * transaction mode). Always off with `layout: 'partitioned'`, whose statements are planned when
   * they run (a plan cached while a partition was new would scan it whole once filled). @default true
   */
  preparedStatements?: boolean
  /**
   * How long a statement the store sends on the pool may go unanswered before node-postgres fails it
   * (`STORE_UNAVAILABLE`) and the pool drops its connection. A half-open connection (a NAT or firewall
   * that forgot it, a server host that vanished) is never closed by the kernel: without this bound
   * each one would hold a pool slot for ever, and a few of them leave the store with no connection at
   * all. Keep it above the ledger's `storeTimeout`. Statements inside your transaction are not bounded
   * by it. @default '10s'
   */
  queryTimeout?: Duration
  /** Run a purge loop in this process (timers are unref'd; `close()` stops it). @default false */
  gc?: boolean | PostgresGcOptions
  /**
   * Group commit: operations of one kind (acquire, complete, renew, release, get) issued by
   * concurrent callers while one of that kind is in flight go out together when it returns, as one
   * statement and one commit, each caller answered as its own statement would have answered it. A
   * caller alone pays nothing (no timer). Statements inside your transaction are never batched.
   * `false`: one statement per operation. @default true
   */
  groupCommit?: boolean
  /**
   * How records are laid out (docs/postgres.md, "Time partitions"). `'plain'`: one table, expiry
   * deletes rows. `'partitioned'`: range partitions by creation time, one per `partitionInterval`;
   * expiry detaches and drops whole partitions once every record in them has expired (the `gc` loop
   * and `idemkey gc` do it, and create partitions ahead). An acquire that may write then takes an
   * advisory lock on its key (one transaction of four round trips instead of one statement), which
   * keeps exactly one record per (scope, key) across partitions. `migrate()` creates a new table in
   * this layout and refuses an existing table in the other; `convertLayout()` converts. @default 'plain'
   */
  layout?: 'plain' | 'partitioned'
  /**
   * The span of one partition, with `layout: 'partitioned'`, for a table `migrate()` creates (an
   * existing table keeps the interval it was created with). A partition is dropped once all its
   * records expired: with a 24 h TTL and 1 d partitions, disk holds about three days. @default '1d'
   */
  partitionInterval?: Duration
  /**
   * Acknowledge a completion only once a synchronous standby has it, so a failover loses no
   * acknowledged record (docs/postgres.md, "Replication and failover"). The store's own pool sets
   * `synchronous_commit` per session; before the first operation the store checks the session's
   * `synchronous_commit`, the server's `synchronous_standby_names` and that a standby streams as
   * synchronous, and refuses ({@link PostgresDurabilityError}) or warns. Unset: no check, no cost
   * (the server's own settings decide). @default undefined
   */
  durability?: PostgresDurability
}

/**
 * Options of {@link PostgresStore} when you pass your own pool (which `close()` leaves open).
 *
 * @example new PostgresStore<pg.PoolClient>({ pool: new pg.Pool({ connectionString }) })
 */
export interface PostgresStorePoolOptions<Client extends PgClientLike> extends PostgresStoreCommonOptions {
  /** Your node-postgres `Pool` (or anything shaped like it). */
  pool: PgPoolLike<Client>
  connectionString?: undefined
}

/**
 * Options of {@link PostgresStore} when the store opens (and closes) its own pool.
 *
 * @example new PostgresStore({ connectionString: 'postgres://app@127.0.0.1:5432/app', max: 20 })
 */
export interface PostgresStoreUrlOptions extends PostgresStoreCommonOptions {
  /** `postgres://user:password@host:port/database`; needs the `pg` package. */
  connectionString: string
  pool?: undefined
  /** Connections of the pool the store opens. @default 10 */
  max?: number
  /** How long opening a connection may take before `STORE_UNAVAILABLE`. @default '5s' */
  connectionTimeout?: Duration
}

/**
 * The data layer whose transactions `ledger.runInTransaction` runs in (docs/orm.md): with it, the work
 * gets the tool's own transaction object (`tx.insert(orders)…` in Drizzle, `tx.order.create` in
 * Prisma) and the record completes inside that transaction. Without it, `tx` is a pg client.
 *
 * @example new PostgresStore({ pool, transactions: drizzleTransactions(db) })
 */
export interface PostgresStoreTransactionsOption<Tx> {
  /** An adapter of your tool: `drizzleTransactions(db)` from `idemkey/drizzle`, `kyselyTransactions(db)`, … */
  transactions?: SqlTransactions<Tx>
}

/**
 * Options of {@link PostgresStore}: a pool, or a connection string.
 *
 * @example const options: PostgresStoreOptions = { connectionString: process.env.DATABASE_URL as string }
 */
export type PostgresStoreOptions<Client extends PgClientLike = PgClientLike> = PostgresStorePoolOptions<Client> | PostgresStoreUrlOptions
