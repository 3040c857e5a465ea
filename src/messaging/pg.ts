/**
 * The subset of `pg` the outbox and inbox use, declared structurally (as Kysely does), so they take
 * the user's own `Pool` and the user's own transaction client without importing `pg` types.
 */

/** A result of `query`. */
export interface PgResult<R> {
  rows: R[]
  rowCount: number | null
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
