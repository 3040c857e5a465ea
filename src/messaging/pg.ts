/**
 * The subset of `pg` the outbox and inbox use, declared structurally (as Kysely does), so they take
 * the user's own `Pool` and the user's own transaction client without importing `pg` types.
 */

import { holding } from '../stores/postgres/connect.js'

/** A result of `query`. */
export interface PgResult<R> {
  rows: R[]
  rowCount: number | null
  /**
   * The command tag (`pg` sets it): a `COMMIT` of a transaction an error had aborted answers
   * `ROLLBACK`, with no error. Optional, for pools that do not report it.
   */
  command?: string
}

/** Anything that runs SQL: a `pg.Pool`, a `pg.Client` or a `pg.PoolClient` inside a transaction. */
export interface PgQueryable {
  query<R = Record<string, unknown>>(text: string, values?: unknown[]): Promise<PgResult<R>>
}

/** A client checked out of a pool. */
export interface PgPoolClient extends PgQueryable {
  release(destroy?: boolean | Error): void
  on(event: 'notification', listener: (message: { channel: string; payload?: string }) => void): unknown
  on(event: 'error', listener: (error: Error) => void): unknown
  removeListener(event: 'notification', listener: (message: { channel: string; payload?: string }) => void): unknown
  removeListener(event: 'error', listener: (error: Error) => void): unknown
}

/** A `pg.Pool`. */
export interface PgPool extends PgQueryable {
  connect(): Promise<PgPoolClient>
}

/**
 * Checks a client out of `pool` for `work`, with an `error` listener while it is out: pg emits a
 * checked-out client's connection errors (a server restart, a cut connection) on the client itself,
 * and one nobody listens to crashes the process. The pool listens only to idle clients. A client that
 * failed so is destroyed on release, not returned to the pool.
 */
export async function withPoolClient<R>(pool: PgPool, work: (client: PgPoolClient) => Promise<R>): Promise<R> {
  const client = await pool.connect()
  return holding(client, () => work(client))
}
