/**
 * The store's own pool (opening it, ending it within a deadline), a checked-out client's lost connection,
 * and the NOTIFY channel's name. Not part of the public API; the messaging module shares `holding`.
 */
import { createHash } from 'node:crypto'
import { IdempotencyError } from '../../errors.js'
import { endWithin, type PoolSocket } from '../end-pool.js'
import type { PgClientLike, PgPoolLike } from './pool.js'

/** The NOTIFY channel of a table: its name, or a digest when `schema.table` would pass PostgreSQL's 63-byte limit. */
export function channelName(schema: string, table: string): string {
  const name = schema === 'public' ? table : `${schema}.${table}`
  return name.length <= 63 ? name : `idemkey_${createHash('sha1').update(name).digest('hex').slice(0, 32)}`
}

export async function openPool<Client extends PgClientLike>(
  connectionString: string,
  max: number,
  connectionTimeoutMillis: number,
  synchronousCommit?: string,
) {
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
  // ANALYZE invalidates it (up to a minute or more). An `options` in the URL replaces this one.
  // With `durability`, each session's commits wait for what it asks (checked before the first operation).
  const commit = synchronousCommit ? ` -c synchronous_commit=${synchronousCommit}` : ''
  const pool = new pg.Pool({ connectionString, max, connectionTimeoutMillis, options: `-c plan_cache_mode=force_custom_plan${commit}` })
  // An idle connection that breaks (a server restart) is dropped by the pool; without a listener
  // its 'error' event would crash the process.
  pool.on('error', () => {})
  const open = new Set<OpenClient>()
  pool.on('connect', (client) => {
    const opened = client as unknown as OpenClient
    const stream = opened.connection?.stream
    if (stream === undefined || stream.destroyed) return
    open.add(opened)
    stream.once?.('close', () => open.delete(opened))
  })
  openClients.set(pool, open)
  return pool as unknown as PgPoolLike<Client>
}

/** What the body of {@link holding} may ask about the client it holds. */
export interface Held {
  /** Whether the client's connection broke while held (node-postgres emitted 'error' on it). */
  lost(): boolean
  /** Destroys the client on release rather than pooling it (after a failed rollback its state is unknown). */
  discard(): void
}

/** What {@link holding} uses of a checked-out client: a pg `PoolClient` (the store's `PgClientLike`, messaging's `PgPoolClient`). */
interface CheckedOut {
  on?(event: 'error', listener: (error: Error) => void): unknown
  removeListener?(event: 'error', listener: (error: Error) => void): unknown
  release(destroy?: boolean | Error): void
}

/**
 * Runs `work` while `client` is checked out, then releases it: destroyed, not pooled, when its connection
 * broke or `work` discarded it. Meanwhile it listens for the 'error' node-postgres emits on a client whose
 * connection breaks (a server restart, a cut or destroyed connection): pg-pool listens only to idle
 * clients, and an 'error' nobody hears crashes the process.
 */
export async function holding<R>(client: CheckedOut, work: (held: Held) => Promise<R>): Promise<R> {
  let lost = false
  let discarded = false
  const onError = () => {
    lost = true
  }
  client.on?.('error', onError)
  try {
    return await work({
      lost: () => lost,
      discard: () => {
        discarded = true
      },
    })
  } finally {
    client.removeListener?.('error', onError)
    client.release(discarded || lost)
  }
}

/**
 * Runs `fn` in a transaction on one client of `pool`, opened with `begin`: commits when it resolves,
 * rolls back when it throws. A failing connect, BEGIN or COMMIT, and a connection lost under `fn`,
 * become `storeError(operation, error)`; other errors of `fn` come through unchanged.
 */
export async function clientTransaction<Client extends PgClientLike, R>(
  pool: PgPoolLike<Client>,
  begin: string,
  fn: (tx: Client) => Promise<R>,
  storeError: (operation: string, error: unknown) => Error,
): Promise<R> {
  let client: Client
  try {
    client = await pool.connect()
  } catch (error) {
    throw storeError('transaction', error)
  }
  // A connection that breaks between queries (a server restart while `fn` awaits something else)
  // emits 'error' on the client: holding() hears it (unheard, it would crash the process), and destroys
  // a lost client, or one whose rollback failed (its state unknown), rather than pool it.
  return holding(client, async (held) => {
    try {
      await client.query(begin).catch((error: unknown) => {
        throw storeError('BEGIN', error)
      })
      const result = await fn(client)
      await client.query('COMMIT').catch((error: unknown) => {
        throw storeError('COMMIT', error)
      })
      return result
    } catch (error) {
      // The connection broke under the work (a server restart): its writes are gone with it. Say so
      // with STORE_UNAVAILABLE (retry later), not as if the work itself had failed.
      const lost = held.lost()
      await client.query('ROLLBACK').catch(held.discard)
      throw lost ? storeError('transaction', error) : error
    }
  })
}

/** A node-postgres client as far as closing it goes: its socket, under `connection`. */
interface OpenClient {
  on(event: 'error', listener: (error: Error) => void): unknown
  connection?: { stream?: PoolSocket }
}

/** The clients of each pool {@link openPool} made whose sockets are still open. */
const openClients = new WeakMap<object, Set<OpenClient>>()

/**
 * Ends a pool {@link openPool} made, and closes its connections within `timeoutMs` (src/backends/end-pool.ts):
 * node-postgres ends the pool only once every client is back, and a transaction waiting on a half-open
 * connection never gives its client back. Past the deadline, a statement still waiting fails.
 */
export async function endPool(pool: PgPoolLike, timeoutMs: number): Promise<void> {
  const ended = pool.end?.() ?? Promise.resolve()
  const clients = [...(openClients.get(pool) ?? [])]
  // Each is being thrown away: should its socket be destroyed, that 'error' must not crash the process.
  for (const client of clients) client.on('error', () => {})
  const sockets = clients.flatMap((client) => (client.connection?.stream ? [client.connection.stream] : []))
  await endWithin(ended, sockets, timeoutMs, () => closedUnanswered(timeoutMs))
}

/** What a statement still waiting on a connection at close fails with. */
function closedUnanswered(timeoutMs: number): Error {
  return Object.assign(
    new Error(
      `the store was closed and this connection had no answer from the server within queryTimeout (${timeoutMs} ms); it was dropped (half-open, or the server is stalled)`,
    ),
    { code: 'IDEMKEY_CLOSED_UNANSWERED' },
  )
}
