/**
 * What the MySQL/MariaDB outbox and inbox share: table names, the server clock, error mapping, a
 * versioned migration under a named lock, and running one statement in the caller's transaction
 * (a mysql2 connection, or a data-layer tool's transaction through `SqlTransactions`). Imports no driver.
 */
import type { SqlTransactions, SqlValue } from '../../core/sql-transactions.js'
import { IdempotencyError, isIdempotencyError, storeUnavailable } from '../../errors.js'
import { besideParts } from '../../messaging/message.js'
import type { MySqlConnectionLike, MySqlPoolLike, MySqlValue, WriteResult } from './pool.js'
import { NOW_MS } from './statements.js'

export type { MySqlConnectionLike, MySqlPoolLike, MySqlValue } from './pool.js'
/** The server's clock as integer epoch milliseconds, once per statement (as MySqlStore reads it). */
export { NOW_MS }

/** A MySQL table name for the outbox or inbox: `table` or `database.table`, checked and backquoted. */
export interface MySqlTableName {
  /** As given, for messages. */
  name: string
  /** Backquoted, for SQL. */
  sql: string
  /** The schema-version table beside it, backquoted: `<table>_meta`. */
  meta: string
}

/**
 * Checks and quotes a table name. Each part is a plain identifier; the table part leaves room for
 * the `_meta` suffix within MySQL's 64 characters.
 */
export function mysqlTableName(name: string, what: string): MySqlTableName {
  const parts = name.split('.')
  const table = parts[parts.length - 1] as string
  const valid =
    parts.length <= 2 && parts.every((part) => /^[A-Za-z_][A-Za-z0-9_]{0,63}$/.test(part)) && /^[A-Za-z_][A-Za-z0-9_]{0,58}$/.test(table)
  if (!valid) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${what} "${name}" must be a plain SQL identifier of at most 59 characters (letters, digits, underscore), optionally "database.table".`,
    )
  }
  const quote = (parts: string[]) => parts.map((part) => `\`${part}\``).join('.')
  return { name, sql: quote(parts), meta: quote([...parts.slice(0, -1), `${table}_meta`]) }
}

/** A table that belongs beside `table`, `<table>_<suffix>` in its database ({@link besideParts}), quoted. */
export function mysqlBesideTable(table: MySqlTableName, suffix: string): string {
  return besideParts(table.name, suffix)
    .map((part) => `\`${part}\``)
    .join('.')
}

/** mysql2's error fields the mapping reads. */
interface DriverError {
  errno?: number
  message?: string
}

/**
 * A driver error as an IdempotencyError: a missing table or column (1146, 1054) is `STORE_SCHEMA`
 * naming `migrate()`, anything else `STORE_UNAVAILABLE` with the driver's error as `cause`.
 */
export function mysqlMessagingError(component: string, operation: string, error: unknown, table: MySqlTableName): IdempotencyError {
  if (isIdempotencyError(error)) return error
  const errno = (error as DriverError | null)?.errno
  if (errno === 1146 || errno === 1054) {
    const reason = (error as DriverError).message ?? String(error)
    return new IdempotencyError(
      'STORE_SCHEMA',
      `${component}: ${operation} on ${table.name} failed: ${reason}. The table is missing or has another shape: create it with \`await ${/Inbox/.test(component) ? 'inbox' : 'outbox'}.migrate()\`.`,
      { cause: error },
    )
  }
  return storeUnavailable(component, `${operation} on ${table.name}`, error)
}

/**
 * One statement in the caller's transaction: on a mysql2 connection (its `execute`), or through the
 * data-layer tool. Answers the rows it changed (`affectedRows`), all a tool reports for MySQL.
 */
export async function executeIn<Tx>(
  tool: SqlTransactions<Tx> | undefined,
  tx: Tx,
  sql: string,
  values: readonly MySqlValue[],
): Promise<number> {
  if (tool) return (await tool.execute(tx, sql, values as SqlValue[])).count
  const connection = tx as unknown as MySqlConnectionLike
  if (typeof connection?.execute !== 'function') {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      'Pass the mysql2 connection your transaction runs on (after START TRANSACTION), or give the `transactions` option for your data layer.',
    )
  }
  const [result] = await connection.execute(sql, [...values])
  return (result as WriteResult).affectedRows
}

/**
 * Creates or upgrades a table's schema, idempotently: `migrations[v]` takes version v to v + 1. A
 * named lock (`GET_LOCK`) makes processes that migrate at once take turns; DDL commits implicitly in
 * MySQL, so each version is recorded in `<table>_meta` as soon as it is done.
 */
export async function migrateMySql(
  pool: MySqlPoolLike,
  component: string,
  table: MySqlTableName,
  migrations: ReadonlyArray<readonly string[]>,
): Promise<void> {
  const fail = (error: unknown): IdempotencyError =>
    isIdempotencyError(error)
      ? error
      : new IdempotencyError('STORE_SCHEMA', `${component}.migrate on ${table.name} failed: ${(error as Error).message}.`, { cause: error })
  let connection: MySqlConnectionLike
  try {
    connection = await pool.getConnection()
  } catch (error) {
    throw storeUnavailable(component, `migrate on ${table.name}`, error)
  }
  const lockName = `idemkey:migrate:${table.name}`.slice(0, 64)
  try {
    const [locked] = await connection.query('SELECT GET_LOCK(?, 30) AS got', [lockName])
    if (Number((locked as Array<{ got: unknown }>)[0]?.got) !== 1) {
      throw new IdempotencyError(
        'STORE_UNAVAILABLE',
        `${component}: another process has been migrating ${table.name} for 30 s. Wait for it to finish, then run migrate() again.`,
      )
    }
    try {
      await connection.query(
        `CREATE TABLE IF NOT EXISTS ${table.meta} (name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY, value VARCHAR(255) NOT NULL) ENGINE = InnoDB`,
      )
      const [rows] = await connection.query(`SELECT value FROM ${table.meta} WHERE name = 'schema_version'`)
      const current = Number((rows as Array<{ value: string }>)[0]?.value ?? 0)
      if (current > migrations.length) {
        throw new IdempotencyError(
          'STORE_SCHEMA',
          `${component}: ${table.name} has schema version ${current}, newer than this idemkey understands (${migrations.length}). Upgrade idemkey, or point it at another table.`,
        )
      }
      for (let version = current; version < migrations.length; version++) {
        for (const statement of migrations[version] as readonly string[]) await connection.query(statement)
        await connection.query(`INSERT INTO ${table.meta} (name, value) VALUES ('schema_version', ?) ON DUPLICATE KEY UPDATE value = ?`, [
          String(version + 1),
          String(version + 1),
        ])
      }
    } finally {
      await connection.query('SELECT RELEASE_LOCK(?)', [lockName])
    }
  } catch (error) {
    throw fail(error)
  } finally {
    connection.release()
  }
}

/**
 * Whether a server version (`SELECT VERSION()`) has `FOR UPDATE SKIP LOCKED`, which the relay's claims
 * use: MySQL 8.0.1+ and MariaDB 10.6+.
 *
 * @example supportsSkipLocked('10.11.19-MariaDB-0+deb12u1') // true
 */
export function supportsSkipLocked(version: string): boolean {
  const match = /^(\d+)\.(\d+)\.(\d+)/.exec(version)
  if (!match) return true // an unknown format: let the server answer for itself
  const [major, minor, patch] = match.slice(1).map(Number) as [number, number, number]
  const at = (a: number, b: number, c: number) => major > a || (major === a && (minor > b || (minor === b && patch >= c)))
  return /mariadb/i.test(version) ? at(10, 6, 0) : at(8, 0, 1)
}

/** Refuses, with what to do, a server whose claims could not skip locked rows. */
export async function assertSkipLocked(pool: MySqlPoolLike, component: string): Promise<void> {
  let version: string
  try {
    const [rows] = await pool.query('SELECT VERSION() AS version')
    version = String((rows as Array<{ version: unknown }>)[0]?.version ?? '')
  } catch (error) {
    throw storeUnavailable(component, 'migrate (reading the server version)', error)
  }
  if (!supportsSkipLocked(version)) {
    throw new IdempotencyError(
      'STORE_SCHEMA',
      `${component} needs MySQL 8.0.1+ or MariaDB 10.6+ (the relay claims rows with FOR UPDATE SKIP LOCKED), but the server is ${version}. Upgrade the server, or keep the outbox on PostgreSQL.`,
    )
  }
}

/** `values.length` placeholders, for an `IN (…)` list. */
export function placeholders(count: number): string {
  return Array.from({ length: count }, () => '?').join(', ')
}
