/**
 * The outbox's and inbox's view of `pg`: the store's driver types (src/backends/postgres/pool.ts), one
 * set for everything idemkey does on PostgreSQL, so the user's own `Pool` and transaction client fit
 * every one of them. The older names stay as aliases.
 */

import { holding } from './connect.js'
import type { PgClientLike, PgPoolLike, PgQueryResult } from './pool.js'

export type { PgClientLike, PgConnectionConfig, PgPoolLike, PgQueryable } from './pool.js'

/**
 * A result of `query`.
 * @deprecated The same as `PgQueryResult` of `idemkey/postgres`.
 */
export type PgResult<R> = PgQueryResult<R>

/**
 * A client checked out of a pool.
 * @deprecated The same as `PgClientLike` (`idemkey/postgres`, `idemkey/outbox`, `idemkey/inbox`).
 */
export type PgPoolClient = PgClientLike

/**
 * A `pg.Pool`.
 * @deprecated The same as `PgPoolLike` (`idemkey/postgres`, `idemkey/outbox`, `idemkey/inbox`).
 */
export type PgPool = PgPoolLike

/**
 * Checks a client out of `pool` for `work`, with an `error` listener while it is out: pg emits a
 * checked-out client's connection errors (a server restart, a cut connection) on the client itself,
 * and one nobody listens to crashes the process. The pool listens only to idle clients. A client that
 * failed so is destroyed on release, not returned to the pool.
 */
export async function withPoolClient<R>(pool: PgPoolLike, work: (client: PgClientLike) => Promise<R>): Promise<R> {
  const client = await pool.connect()
  return holding(client, () => work(client))
}

/** The rows of a result, as the statement's columns say they are. */
export function rowsOf<R>(result: PgQueryResult): R[] {
  return result.rows as R[]
}
