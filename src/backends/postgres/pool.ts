/**
 * The subset of node-postgres (`pg`) idemkey uses on PostgreSQL, declared here so that any compatible
 * pool fits (a `pg.Pool` of any 8.x version, or a wrapper with the same methods) without importing pg's
 * types. One set for the store, the outbox, the inbox and the CDC relay. Optional fields say
 * `| undefined`, as @types/pg does, so a real `pg.Pool` fits under `exactOptionalPropertyTypes`.
 */

/**
 * What a query answers; `rows` are plain objects keyed by column name.
 *
 * @example const { rows } = (await tx.query('SELECT 1 AS one')) as PgQueryResult
 */
export interface PgQueryResult<R = unknown> {
  rows: R[]
  rowCount: number | null
  /** The command tag (`COMMIT` of an aborted transaction answers `ROLLBACK`), where the driver reports it. */
  command?: string | undefined
}

/**
 * A query as a config object; with `name`, node-postgres prepares it once per connection.
 *
 * @example const config: PgQueryConfig = { name: 'one', text: 'SELECT $1::int AS n', values: [1] }
 */
export interface PgQueryConfig {
  text: string
  values?: unknown[] | undefined
  name?: string | undefined
  /** node-postgres: fail the query after this many ms without an answer; a pool then drops its connection. */
  query_timeout?: number | undefined
}

/**
 * Anything that runs a query: a `pg.Pool`, a `pg.Client`, or a `pg.PoolClient` inside a transaction.
 *
 * @example const db: PgQueryable = pool
 */
export interface PgQueryable {
  query(text: string, values?: unknown[]): Promise<PgQueryResult>
  query(config: PgQueryConfig): Promise<PgQueryResult>
}

/**
 * A notification delivered to a LISTENing connection.
 *
 * @example client.on('notification', (message: PgNotification) => console.log(message.payload))
 */
export interface PgNotification {
  channel: string
  payload?: string | undefined
}

/**
 * One connection checked out of a pool: what `store.transaction(fn)` hands to `fn` as `tx`.
 * `release(true)` destroys it instead of returning it to the pool.
 *
 * @example await store.transaction(async (tx: PgClientLike) => tx.query('INSERT INTO orders (id) VALUES ($1)', [id]))
 */
export interface PgClientLike extends PgQueryable {
  release(destroy?: boolean | Error): void
  /** Present on pg clients; the store's LISTEN connection needs it for notifications and errors. */
  on?(event: 'notification', listener: (message: PgNotification) => void): unknown
  on?(event: 'error', listener: (error: Error) => void): unknown
  on?(event: 'end', listener: () => void): unknown
  removeListener?(event: 'notification', listener: (message: PgNotification) => void): unknown
  removeListener?(event: 'end', listener: () => void): unknown
  removeListener?(event: 'error', listener: (error: Error) => void): unknown
}

/**
 * A node-postgres pool, typed structurally. Name your pool's client type on the store
 * (`new PostgresStore<pg.PoolClient>({ pool })`) and the `tx` of `ledger.runInTransaction` has it.
 *
 * @example
 * import pg from 'pg'
 * const pool: PgPoolLike<pg.PoolClient> = new pg.Pool({ connectionString: process.env.DATABASE_URL })
 */
export interface PgPoolLike<Client extends PgClientLike = PgClientLike> extends PgQueryable {
  connect(): Promise<Client>
  /** Present on pools the store creates itself; the store never ends a pool it was given. */
  end?(): Promise<void>
}

/**
 * A `pg` client config: whatever `new pg.Client(config)` takes (declared here so the types do not need
 * `pg` installed). The CDC relay opens its own connections with it.
 *
 * @example const connection: PgConnectionConfig = { host: '127.0.0.1', database: 'app', user: 'app' }
 */
export interface PgConnectionConfig {
  connectionString?: string | undefined
  host?: string | undefined
  port?: number | undefined
  user?: string | undefined
  password?: string | undefined
  database?: string | undefined
  ssl?: unknown
  [option: string]: unknown
}
