import { IdempotencyError, isIdempotencyError, storeUnavailable } from '../../errors.js'
import { causes } from '../records.js'

/** The fields of a mysql2 error the store looks at. */
interface DriverError {
  code?: string
  errno?: number
  sqlState?: string
  message?: string
}

/** Deadlock (1213) and lock wait timeout (1205): the statement was rolled back and may be retried. */
export function isRetryable(error: unknown): boolean {
  const errno = (error as DriverError | null)?.errno
  return errno === 1213 || errno === 1205
}

/**
 * A locking read with NOWAIT found its row held by another transaction: ER_LOCK_NOWAIT (3572) on
 * MySQL, ER_LOCK_WAIT_TIMEOUT (1205) on MariaDB.
 */
export function rowHeld(error: unknown): boolean {
  return causes(error).some(nowaitRefused)
}

/** One error (not its causes): a NOWAIT read refused, ER_LOCK_NOWAIT (3572) or, on MariaDB, 1205. */
export function nowaitRefused(error: unknown): boolean {
  const errno = (error as DriverError | null)?.errno
  return errno === 3572 || errno === 1205
}

/**
 * True for a deadlock (1213) or lock wait timeout (1205), whether it is mysql2's error, an idemkey
 * error caused by one, or a data-layer tool's error wrapping one (Drizzle, TypeORM, Sequelize, Prisma's
 * P2034). Inside `ledger.runInTransaction` InnoDB has rolled the whole transaction back and the record
 * is released: the request is safe to run again.
 *
 * @example
 * try { await ledger.runInTransaction(intent, work) }
 * catch (error) { if (isTransientTransactionError(error)) return retrySoon() }
 */
export function isTransientTransactionError(error: unknown): boolean {
  return causes(error).some((current) => isRetryable(current) || (current as DriverError).code === 'P2034')
}

/** ER_NO_SUCH_TABLE (1146) and ER_BAD_FIELD_ERROR (1054): the schema is missing or not ours. */
function isSchemaError(error: unknown): boolean {
  const errno = (error as DriverError | null)?.errno
  return errno === 1146 || errno === 1054
}

/**
 * ER_DBACCESS_DENIED_ERROR, ER_ACCESS_DENIED_ERROR, ER_NO_DB_ERROR (a URI without a database),
 * ER_BAD_DB_ERROR, ER_TABLEACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR (MariaDB's answer
 * to a wrong user).
 */
const SETUP_ERRNOS = new Set([1044, 1045, 1046, 1049, 1142, 1698])

/**
 * Turns a driver error into an IdempotencyError: a missing table into `STORE_SCHEMA` (saying how to
 * create it), everything else (refused connections, timeouts, access denied, lost connections) into
 * `STORE_UNAVAILABLE`, with the driver's error as `cause`.
 */
export function toStoreError(operation: string, error: unknown, table?: string): IdempotencyError {
  if (isIdempotencyError(error)) return error
  if (isSchemaError(error)) {
    const reason = (error as DriverError).message ?? String(error)
    return new IdempotencyError(
      'STORE_SCHEMA',
      `mysql: ${operation} failed: ${reason}. The table${table ? ` ${table}` : ''} is missing or has another shape: create it with \`await store.migrate()\` or \`idemkey migrate --store mysql://…\`.`,
      { cause: error },
    )
  }
  const errno = (error as DriverError | null)?.errno
  // SQLSTATE 28000: invalid authorization, whatever errno the server variant chose.
  if ((errno !== undefined && SETUP_ERRNOS.has(errno)) || (error as DriverError | null)?.sqlState === '28000') {
    const reason = (error as DriverError).message ?? String(error)
    return new IdempotencyError(
      'STORE_UNAVAILABLE',
      `mysql: ${operation} failed: ${reason}. Check the user, password and database in the connection settings, and that the user may read and write the idemkey table.`,
      { cause: error },
    )
  }
  return storeUnavailable('mysql', operation, error)
}
