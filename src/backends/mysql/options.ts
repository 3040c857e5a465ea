import type { Duration } from '../../core/duration.js'
import type { SqlTransactions } from '../../core/sql-transactions.js'
import type { MySqlPoolLike, MySqlTransaction } from './pool.js'

/** Options of {@link MySqlStore}: give it a pool, or a URI to open one. */
export interface MySqlStoreOptions<Tx = MySqlTransaction> {
  /** Your mysql2 promise pool (`mysql2/promise` `createPool`); `close()` leaves it open. */
  pool?: MySqlPoolLike
  /** A `mysql://user:password@host:port/database` URI; the store opens (and closes) its own mysql2 pool. */
  uri?: string
  /** Connections of the pool the store opens from `uri`. @default 10 */
  connectionLimit?: number
  /**
   * With `uri`: how long opening a connection may take before `STORE_UNAVAILABLE` (mysql2's
   * `connectTimeout`, whose own default is 10 s, longer than most leases). @default '5s'
   */
  connectionTimeout?: Duration
  /** Table name (a plain identifier); `<table>_meta` holds the schema version. @default 'idemkey_records' */
  table?: string
  /** How long a record whose lease ended is kept before it may be purged. @default '24h' */
  abandonedRetention?: Duration
  /** How many times a statement is retried after a deadlock (1213) or lock wait timeout (1205). @default 5 */
  lockRetries?: number
  /**
   * The data layer whose transactions `ledger.runInTransaction` runs in (docs/orm.md): the work gets
   * the tool's own transaction object and the record completes inside it. Without it, `tx` is a mysql2
   * connection. @example new MySqlStore({ pool, transactions: drizzleTransactions(db) })
   */
  transactions?: SqlTransactions<Tx>
  /**
   * Group commit (docs/mysql.md, "Group commit"): acquires, completes, renewals, releases and reads that
   * concurrent callers issue while one of their kind is in flight go out together when it returns, as
   * one statement per kind and one commit. A caller alone pays nothing (no timer). Statements inside
   * your transaction are never batched. `false`: one statement per operation. @default true
   */
  groupCommit?: boolean
  /**
   * How long a statement the store sends on the pool may go unanswered before it fails
   * (`STORE_UNAVAILABLE`) and its connection is destroyed, so the pool opens a new one. Bounds a
   * half-open connection (a NAT or firewall that forgot it, a vanished server host), which would
   * otherwise hold its pool slot, and every statement queued behind it, for ever. Keep it above the
   * ledger's `storeTimeout`. Statements inside your transaction, and `migrate()`, are not bounded by it; `0` bounds nothing.
   * @default '10s'
   */
  queryTimeout?: Duration
}
