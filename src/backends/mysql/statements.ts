/** The SQL of MySqlStore, one statement per operation. Not part of the public API. */
import type { MySqlValue } from './pool.js'

/**
 * The server's clock as integer epoch milliseconds. `UTC_TIMESTAMP(6)` does not depend on the session
 * time zone (unlike `UNIX_TIMESTAMP(NOW(3))`, which is off by an hour in the repeated hour of a DST
 * change), and MySQL evaluates it once per statement, so every use in one statement sees one instant.
 */
export const NOW_MS = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"

/** A statement with `:name` placeholders compiled to positional `?` and the order to bind them in. */
export interface Statement {
  sql: string
  names: string[]
}

/** Compiles `:name` placeholders (mysql2 pools need not have `namedPlaceholders` on). */
export function compile(sql: string): Statement {
  const names: string[] = []
  const text = sql.replace(/:([a-z_]+)\b/g, (_, name: string) => {
    names.push(name)
    return '?'
  })
  return { sql: text.replace(/\s+/g, ' ').trim(), names }
}

/** The values of a statement's placeholders, in order. */
export function bind(statement: Statement, values: Record<string, MySqlValue>): MySqlValue[] {
  return statement.names.map((name) => {
    if (!(name in values)) throw new Error(`idemkey mysql: no value for :${name}`)
    return values[name] as MySqlValue
  })
}

/** The columns every read returns, in the order of the table. */
export const COLUMNS = `scope, \`key\`, fingerprint, status, token, locked_until, response_status, response_headers,
  response_body, resource_id, attempts, created_at, updated_at, expires_at`

/** The values an acquire offers for the row: SQL expressions, placeholders or `VALUES(column)` of a multi-row INSERT. */
export interface Offer {
  fingerprint: string
  claim: string
  lockedUntil: string
  expiresAt: string
}

/**
 * The `ON DUPLICATE KEY UPDATE` of acquire: takes the row only when no live record holds it.
 * The row is takeable when it is expired, or in progress with its lease ended: by another
 * fingerprint only if the ended attempt left no steps (they are its own request's partial effects).
 * MySQL assigns ON DUPLICATE KEY UPDATE columns left to right and later assignments see earlier
 * ones. So the decision is made once, on the untouched row, into `claim`; every later assignment
 * asks `claim = <offered claim>` (a random value unique to this call), and `expires_at`, which the
 * attempts/created_at assignments read, is assigned last. Shared by the single acquire and the batch.
 */
export function takeOver(offer: Offer): string {
  const takeable = `expires_at <= ${NOW_MS} OR (status = 'in_progress' AND locked_until <= ${NOW_MS}
    AND (fingerprint = ${offer.fingerprint} OR steps IS NULL OR steps = '{}'))`
  const mine = `claim = ${offer.claim}`
  return `ON DUPLICATE KEY UPDATE
        claim = IF(${takeable}, ${offer.claim}, claim),
        fingerprint = IF(${mine}, ${offer.fingerprint}, fingerprint),
        token = IF(${mine}, token + 1, token),
        attempts = IF(${mine}, IF(expires_at <= ${NOW_MS}, 1, attempts + 1), attempts),
        created_at = IF(${mine}, IF(expires_at <= ${NOW_MS}, ${NOW_MS}, created_at), created_at),
        steps = IF(${mine}, IF(expires_at <= ${NOW_MS}, NULL, steps), steps),
        status = IF(${mine}, 'in_progress', status),
        locked_until = IF(${mine}, ${offer.lockedUntil}, locked_until),
        response_status = IF(${mine}, NULL, response_status),
        response_headers = IF(${mine}, NULL, response_headers),
        response_body = IF(${mine}, NULL, response_body),
        resource_id = IF(${mine}, NULL, resource_id),
        updated_at = IF(${mine}, ${NOW_MS}, updated_at),
        revision = IF(${mine}, revision + 1, revision),
        expires_at = IF(${mine}, ${offer.expiresAt}, expires_at)`
}

/**
 * The condition a write inside the user's tool's transaction adds (`completeInToolTransaction`,
 * `recordStepInToolTransaction`): on MariaDB, that the transaction is still open (`@@in_transaction`).
 * After a deadlock InnoDB has rolled the whole transaction back and the connection goes on in autocommit,
 * where work that caught the error and carried on writes each statement for good; the record's
 * completion would commit at once too, keeping the writes after the deadlock and losing those before it.
 * With the condition it changes nothing there (the store then says why: MySqlStore's #writeIn). `/*M!`
 * is MariaDB's executable comment: MySQL, which has no such variable, reads a comment and writes as before
 * (its tool's own handling of a deadlock applies, docs/mysql.md).
 */
const WHILE_OPEN = ' /*M!100000 AND @@in_transaction = 1 */'

/** Builds the statements for one table; `retentionMs` is a validated integer, inlined. */
export function statements(table: string, retentionMs: number) {
  const t = `\`${table}\``
  const lease = 'CAST(:lease AS SIGNED)'
  const values = `VALUES (:scope, :key, :fingerprint, 'in_progress', 1, ${NOW_MS} + ${lease}, 1, ${NOW_MS}, ${NOW_MS},
        ${NOW_MS} + ${lease} + ${retentionMs}, :claim, 1)`
  const complete = `
      UPDATE ${t} SET status = :status, locked_until = NULL, response_status = :response_status,
        response_headers = :response_headers, response_body = :response_body, resource_id = :resource_id,
        updated_at = ${NOW_MS}, expires_at = ${NOW_MS} + CAST(:ttl AS SIGNED), revision = revision + 1
      WHERE scope = :scope AND \`key\` = :key AND token = :token AND status = 'in_progress'`
  const recordStep = `
      UPDATE ${t} SET steps = IF(:result IS NULL,
          JSON_INSERT(COALESCE(steps, '{}'), CONCAT('$."', :name, '"'), JSON_OBJECT()),
          JSON_SET(COALESCE(steps, '{}'), CONCAT('$."', :name, '"'), JSON_OBJECT('r', :result))),
        updated_at = ${NOW_MS}, revision = revision + 1
      WHERE scope = :scope AND \`key\` = :key AND token = :token AND status = 'in_progress'`
  const insert = `INSERT INTO ${t} (scope, \`key\`, fingerprint, status, token, locked_until, attempts, created_at, updated_at,
      expires_at, claim, revision) ${values}`
  return {
    /** Reads the record before acquire writes anything, with the server's time. */
    peek: compile(
      `SELECT ${COLUMNS}, (steps IS NOT NULL AND steps <> '{}') AS has_steps, ${NOW_MS} AS now_ms FROM ${t} WHERE scope = :scope AND \`key\` = :key`,
    ),
    /**
     * Whether another transaction holds the record's row, asked before a takeover: a locking read that
     * does not wait (`NOWAIT`: ER_LOCK_NOWAIT, 3572, on MySQL; 1205 on MariaDB) and, in autocommit,
     * lets go at once. A holder that completed the record inside its own transaction, not committed
     * yet, holds it; the upsert would wait for that transaction's end (up to `innodb_lock_wait_timeout`).
     */
    held: compile(`SELECT 1 FROM ${t} WHERE scope = :scope AND \`key\` = :key FOR UPDATE NOWAIT`),
    /** Takes a key no record holds; fails with ER_DUP_ENTRY when one exists. */
    insert: compile(insert),
    acquire: compile(`
      ${insert}
      ${takeOver({
        fingerprint: ':fingerprint',
        claim: ':claim',
        lockedUntil: `${NOW_MS} + ${lease}`,
        expiresAt: `${NOW_MS} + ${lease} + ${retentionMs}`,
      })}`),
    /** Reads the row back after `acquire`: `mine` says whether this call's claim holds it. */
    acquired: compile(
      `SELECT ${COLUMNS}, steps, claim = :claim AS mine, ${NOW_MS} AS now_ms FROM ${t} WHERE scope = :scope AND \`key\` = :key`,
    ),
    /**
     * One step of an in-progress record, fenced by token: JSON_SET for a result (`:result`, JSON text kept
     * as a JSON string), JSON_INSERT for a started marker (`:result` NULL), which never replaces a result.
     */
    recordStep: compile(recordStep),
    recordStepInToolTransaction: compile(recordStep + WHILE_OPEN),
    get: compile(`SELECT ${COLUMNS} FROM ${t} WHERE scope = :scope AND \`key\` = :key AND expires_at > ${NOW_MS}`),
    renew: compile(`
      UPDATE ${t} SET locked_until = ${NOW_MS} + ${lease}, updated_at = ${NOW_MS},
        expires_at = ${NOW_MS} + ${lease} + ${retentionMs}, revision = revision + 1
      WHERE scope = :scope AND \`key\` = :key AND token = :token AND status = 'in_progress'`),
    complete: compile(complete),
    completeInToolTransaction: compile(complete + WHILE_OPEN),
    release: compile(`
      UPDATE ${t} SET locked_until = ${NOW_MS}, updated_at = ${NOW_MS}, expires_at = ${NOW_MS} + ${retentionMs},
        revision = revision + 1
      WHERE scope = :scope AND \`key\` = :key AND token = :token AND status = 'in_progress'`),
    evict: compile(`DELETE FROM ${t} WHERE scope = :scope AND \`key\` = :key`),
    /** `limit` is a validated integer, inlined: MySQL 8 refuses a DOUBLE parameter in LIMIT. */
    purge: (limit: number) => compile(`DELETE FROM ${t} WHERE expires_at <= ${NOW_MS} ORDER BY expires_at LIMIT ${limit}`),
  }
}

export type Statements = ReturnType<typeof statements>
