import type { PgClientLike, PgPoolLike, PgQueryConfig, PgQueryResult } from '../../src/backends/postgres/pool.js'

/** Where a statement was sent: on the pool, or on a client checked out of it. */
export type SentOn = 'pool' | 'client'

export interface PoolTap {
  /**
   * Every statement the store sends, as a config (a plain string becomes `{ text, values }`); `plain`
   * says it came as a string. Runs it with `run`, or answers or fails it instead.
   */
  through(config: PgQueryConfig, on: SentOn, run: (config: PgQueryConfig) => Promise<PgQueryResult>, plain: boolean): Promise<PgQueryResult>
  /** A client given back (`destroy` as the store passed it). */
  released?(destroy: boolean | Error | undefined): void
}

/**
 * A pg pool seen through `tap`: the pool's statements and those of the clients it hands out go through
 * `tap.through`, client releases to `tap.released`; the clients' `'error'` listeners reach the real client.
 */
export function tapPool(pool: PgPoolLike, tap: PoolTap): PgPoolLike {
  const query = (on: SentOn, run: (config: PgQueryConfig) => Promise<PgQueryResult>) =>
    (async (text: string | PgQueryConfig, values?: unknown[]): Promise<PgQueryResult> =>
      typeof text === 'string' ? tap.through({ text, values }, on, run, true) : tap.through(text, on, run, false)) as PgPoolLike['query']
  return {
    query: query('pool', (config) => pool.query(config)),
    connect: async () => {
      const client = await pool.connect()
      return {
        query: query('client', (config) => client.query(config)) as PgClientLike['query'],
        release: (destroy?: boolean | Error) => {
          tap.released?.(destroy)
          client.release(destroy)
        },
        on: ((event: 'error', listener: (error: Error) => void) => client.on?.(event, listener)) as PgClientLike['on'],
        removeListener: ((event: 'error', listener: (error: Error) => void) =>
          client.removeListener?.(event, listener)) as PgClientLike['removeListener'],
      }
    },
  }
}
