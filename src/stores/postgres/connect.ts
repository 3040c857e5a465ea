/** Opening the store's own pool, and naming its NOTIFY channel. Not part of the public API. */
import { createHash } from 'node:crypto'
import { IdempotencyError } from '../../errors.js'
import type { PgClientLike, PgPoolLike } from './pool.js'

/** The NOTIFY channel of a table: its name, or a digest when `schema.table` would pass PostgreSQL's 63-byte limit. */
export function channelName(schema: string, table: string): string {
  const name = schema === 'public' ? table : `${schema}.${table}`
  return name.length <= 63 ? name : `idemkey_${createHash('sha1').update(name).digest('hex').slice(0, 32)}`
}

export async function openPool<Client extends PgClientLike>(connectionString: string, max: number, connectionTimeoutMillis: number) {
  let pg: typeof import('pg')
  try {
    pg = (await import('pg')).default as typeof import('pg')
  } catch (error) {
    throw new IdempotencyError('INVALID_OPTION', 'PostgresStore({ connectionString }) needs the pg package: npm install pg', {
      cause: error,
    })
  }
  // Each statement is planned when it runs (plan_cache_mode, PostgreSQL 12+): a generic plan cached
  // while the table was new and nearly empty seq-scans it once it has filled, until autovacuum's
  // ANALYZE invalidates it (up to a minute or more); on the peers bench a fresh table's replays ran at
  // 0.19 x a bare app that way, 1.46 x planned each time. An `options` in the URL replaces this one.
  const pool = new pg.Pool({ connectionString, max, connectionTimeoutMillis, options: '-c plan_cache_mode=force_custom_plan' })
  // An idle connection that breaks (a server restart) is dropped by the pool; without a listener
  // its 'error' event would crash the process.
  pool.on('error', () => {})
  return pool as unknown as PgPoolLike<Client>
}
