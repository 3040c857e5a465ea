import { IdempotencyError, isIdempotencyError, storeUnavailable } from '../../errors.js'
import { causes } from '../records.js'

/** The fields of a node-postgres error the store looks at. */
interface DriverError {
  /** SQLSTATE for server errors (`42P01`), or a Node error code (`ECONNREFUSED`). */
  code?: string
  message?: string
}

/**
 * SQLSTATEs that mean the table is missing or is not ours: undefined table, column, schema, function,
 * wrong type; and no unique constraint for ON CONFLICT (a partitioned table behind a store of the plain layout).
 */
const SCHEMA_STATES = new Set(['42P01', '42703', '3F000', '42883', '42804'])

/** Serialization failure and deadlock: the server rolled the transaction back; running it again may succeed. */
const TRANSIENT_STATES = new Set(['40001', '40P01'])

function sqlState(error: unknown): string | undefined {
  const code = (error as DriverError | null)?.code
  return typeof code === 'string' ? code : undefined
}

/**
 * Whether an acquire failed because another transaction holds the row it would take over (SQLSTATE
 * 55P03: its lock wait reached the bound the statement sets, statements.ts `ACQUIRE_NOW`): a holder that
 * completed the record inside its own transaction, not committed yet. Nothing was written; the record
 * is in flight.
 */
export function rowHeld(error: unknown): boolean {
  return causes(error).some(lockNotGranted)
}

/** SQLSTATE 55P03: a lock was not granted within `lock_timeout` (the acquire's bound, or the partition work's in rotation.ts). */
export function lockNotGranted(error: unknown): boolean {
  return sqlState(error) === '55P03'
}

/**
 * Whether the server answered with an error (a SQLSTATE: five digits or capitals), so the connection is
 * still in step with it; a Node error code (`ECONNRESET`) or none means the connection failed instead.
 */
export function isServerError(error: unknown): boolean {
  const code = sqlState(error)
  return code !== undefined && /^[0-9A-Z]{5}$/.test(code)
}

/**
 * True for a PostgreSQL serialization failure (`40001`) or deadlock (`40P01`), whether it is the
 * driver's error, an idemkey error caused by one, or a data-layer tool's error wrapping one (Drizzle,
 * TypeORM, Sequelize, Prisma's P2034). Inside `ledger.runInTransaction` such a failure
 * rolls the transaction back and releases the record; the request is safe to run again.
 *
 * @example
 * try { await ledger.runInTransaction(intent, work) }
 * catch (error) { if (isTransientTransactionError(error)) return retrySoon() }
 */
export function isTransientTransactionError(error: unknown): boolean {
  return causes(error).some((current) => {
    const state = sqlState(current)
    // Prisma reports a write conflict or deadlock as P2034 (the driver's error is not its cause).
    return (state !== undefined && TRANSIENT_STATES.has(state)) || state === 'P2034'
  })
}

/**
 * Turns a driver error into an IdempotencyError with the driver's error as `cause`:
 * - a missing table or one of another shape: `STORE_SCHEMA`, naming `store.migrate()` / `idemkey migrate`;
 * - wrong password, unknown database, missing privileges: `STORE_UNAVAILABLE`, saying what to check;
 * - serialization failures and deadlocks: `STORE_UNAVAILABLE`, saying it was rolled back and may be retried;
 * - everything else (refused, reset, timed out, server shutting down): `STORE_UNAVAILABLE`.
 */
export function toStoreError(operation: string, error: unknown, schema?: string, table?: string): IdempotencyError {
  if (isIdempotencyError(error)) return error
  const state = sqlState(error)
  const reason = (error as DriverError | null)?.message ?? String(error)
  const where = table ? `"${schema ?? 'public'}"."${table}"` : 'the idemkey table'
  const fail = (code: 'STORE_SCHEMA' | 'STORE_UNAVAILABLE', advice: string) =>
    new IdempotencyError(code, `postgres: ${operation} failed: ${reason}. ${advice}`, { cause: error })
  if (state === '42P10') {
    // The plain layout's ON CONFLICT (scope, key) finds no unique index of its own on a partitioned
    // table (its key holds the partition column too): the usual cause is a store given the wrong layout.
    return fail(
      'STORE_SCHEMA',
      `The table ${where} has no unique index on (scope, key) alone: it is likely in time partitions, and this store was made for the plain layout. Give the store layout: 'partitioned' (?layout=partitioned in a store URL), or convert the table with \`idemkey migrate --store … --layout plain\`.`,
    )
  }
  if (state && SCHEMA_STATES.has(state)) {
    return fail(
      'STORE_SCHEMA',
      `The table ${where} is missing or has another shape: create it with \`await store.migrate()\` or \`idemkey migrate --store postgres://…\` (or choose another table with the \`table\` option).`,
    )
  }
  if (state === '42501') {
    return fail(
      'STORE_UNAVAILABLE',
      `The database user lacks a privilege: GRANT SELECT, INSERT, UPDATE, DELETE ON ${where} TO <app user> (and USAGE on its schema); migrate() also needs CREATE.`,
    )
  }
  if (state === '28P01' || state === '28000') {
    return fail('STORE_UNAVAILABLE', 'Check the user and password in the connection string, and pg_hba.conf on the server.')
  }
  if (state === '3D000') {
    return fail('STORE_UNAVAILABLE', 'The database does not exist: check the database name in the connection string, or create it.')
  }
  if (state && TRANSIENT_STATES.has(state)) {
    return fail(
      'STORE_UNAVAILABLE',
      'The transaction was rolled back (a serialization failure or deadlock) and nothing of it was stored; it is safe to run it again.',
    )
  }
  return storeUnavailable('postgres', operation, error)
}
