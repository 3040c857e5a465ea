/**
 * The subset of mysql2's promise API the store uses, declared here so that any compatible pool fits
 * (a mysql2 `Pool` from `mysql2/promise`, of any 3.x version) without importing mysql2's types.
 */

/** A value the store binds to a placeholder. */
export type MySqlValue = string | number | boolean | null | Buffer

/**
 * One connection taken from a pool: `migrate()` uses one for its named lock, and a
 * {@link MySqlTransaction} is one.
 */
export interface MySqlConnectionLike {
  query(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]>
  execute(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]>
  release(): void
}

/**
 * An open transaction of `MySqlStore.transaction`: the pool connection it runs on. Do the business
 * writes on it (`tx.execute(...)`); the store commits or rolls it back, and releases it.
 *
 * @example
 * await store.transaction(async (tx) => { await tx.execute('INSERT INTO orders (id) VALUES (?)', [id]) })
 */
export type MySqlTransaction = MySqlConnectionLike

/**
 * A mysql2 promise pool, typed structurally.
 *
 * @example
 * import mysql from 'mysql2/promise'
 * const pool: MySqlPoolLike = mysql.createPool({ host: '127.0.0.1', user: 'app', database: 'app' })
 */
export interface MySqlPoolLike {
  /** A text-protocol query (values are escaped client side). */
  query(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]>
  /** A prepared statement, cached per connection by mysql2. */
  execute(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]>
  getConnection(): Promise<MySqlConnectionLike>
  /** Present on pools the store creates itself; the store never ends a pool it was given. */
  end?(): Promise<void>
}

/** Where a connection is taken from: what your transactions and `migrate()` need of a pool. */
export type ConnectionSource = Pick<MySqlPoolLike, 'getConnection'>

/** What mysql2 answers for INSERT, UPDATE and DELETE. */
export interface WriteResult {
  affectedRows: number
}
