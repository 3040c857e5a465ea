/** The SQLite store's prepared statements, and the row they read as a record. */
import type { RecordStatus, StoredRecord } from '../../core/store.js'
import { decodeHeaders } from '../records.js'
import type { SqliteConnection } from './driver.js'

/** A row of the records table, as `get` and `list` read it. */
export interface Row {
  scope: string
  key: string
  fingerprint: string
  status: RecordStatus
  token: number
  locked_until: number | null
  response_status: number | null
  response_headers: string | null
  response_body: Uint8Array | null
  resource_id: string | null
  attempts: number
  created_at: number
  updated_at: number
  expires_at: number
  /** 1 when the record holds steps (results or started markers). */
  has_steps: number
}

/** The store's statements on `table`, prepared once. */
export function prepareStatements(db: SqliteConnection, table: string) {
  const columns = `scope, key, fingerprint, status, token, locked_until, response_status, response_headers,
    response_body, resource_id, attempts, created_at, updated_at, expires_at`
  return {
    // Takes the row when it is absent, expired, or in progress with its lease ended (by another
    // request only if the ended attempt left no steps: those are its own request's partial effects);
    // a stored row keeps counting its token so that a zombie holder stays fenced out. The hot statements bind
    // with plain `?` (better-sqlite3 binds `?NNN` and `@name` from an object, at a property lookup per
    // parameter); `excluded.updated_at` is "now". Parameters: scope, key, fingerprint, locked_until,
    // now (created_at), now (updated_at), expires_at.
    acquire: db.prepare(`
      INSERT INTO ${table} (scope, key, fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at)
      VALUES (?, ?, ?, 'in_progress', 1, ?, 1, ?, ?, ?)
      ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = excluded.fingerprint,
        status = 'in_progress',
        token = ${table}.token + 1,
        locked_until = excluded.locked_until,
        response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = NULL,
        attempts = CASE WHEN ${table}.expires_at <= excluded.updated_at THEN 1 ELSE ${table}.attempts + 1 END,
        created_at = CASE WHEN ${table}.expires_at <= excluded.updated_at THEN excluded.updated_at ELSE ${table}.created_at END,
        updated_at = excluded.updated_at,
        expires_at = excluded.expires_at,
        steps = CASE WHEN ${table}.expires_at <= excluded.updated_at THEN NULL ELSE ${table}.steps END
      WHERE ${table}.expires_at <= excluded.updated_at
        OR (${table}.status = 'in_progress' AND ${table}.locked_until <= excluded.updated_at
          AND (${table}.fingerprint = excluded.fingerprint OR ${table}.steps IS NULL OR ${table}.steps = '{}'))
      RETURNING token, steps`),
    // Parameters: JSON path of the step, [result,] now, scope, key, token.
    stepResult: db.prepare(`
      UPDATE ${table} SET steps = json_set(coalesce(steps, '{}'), ?, json_object('r', ?)), updated_at = ?
      WHERE scope = ? AND key = ? AND token = ? AND status = 'in_progress'`),
    stepStarted: db.prepare(`
      UPDATE ${table} SET steps = json_insert(coalesce(steps, '{}'), ?, json_object()), updated_at = ?
      WHERE scope = ? AND key = ? AND token = ? AND status = 'in_progress'`),
    get: db.prepare(`SELECT ${columns}, (steps IS NOT NULL AND steps <> '{}') AS has_steps FROM ${table} WHERE scope = ? AND key = ?`),
    renew: db.prepare(`
      UPDATE ${table} SET locked_until = @locked_until, updated_at = @now, expires_at = @expires_at
      WHERE scope = @scope AND key = @key AND token = @token AND status = 'in_progress'`),
    // Parameters: status, response_status, response_headers, response_body, resource_id, now,
    // expires_at, scope, key, token.
    complete: db.prepare(`
      UPDATE ${table} SET status = ?, locked_until = NULL, response_status = ?, response_headers = ?,
        response_body = ?, resource_id = ?, updated_at = ?, expires_at = ?
      WHERE scope = ? AND key = ? AND token = ? AND status = 'in_progress'`),
    release: db.prepare(`
      UPDATE ${table} SET locked_until = @now, updated_at = @now, expires_at = @expires_at
      WHERE scope = @scope AND key = @key AND token = @token AND status = 'in_progress'`),
    list: db.prepare(`
      SELECT ${columns} FROM ${table}
      WHERE expires_at > @now
        AND (@scope IS NULL OR scope = @scope)
        AND (@status IS NULL OR status = @status)
        AND (@created_before IS NULL OR created_at <= @created_before)
      ORDER BY created_at, rowid LIMIT @limit`),
    // A bounded batch by rowid: each call holds the write lock only briefly.
    purge: db.prepare(`
      DELETE FROM ${table} WHERE rowid IN (SELECT rowid FROM ${table} WHERE expires_at <= @now LIMIT @limit)`),
    evict: db.prepare(`DELETE FROM ${table} WHERE scope = ? AND key = ?`),
  }
}

/** A row as the store's record. */
export function toRecord(row: Row): StoredRecord {
  const stored = row.status !== 'in_progress'
  const body = row.response_body
  return {
    scope: row.scope,
    key: row.key,
    fingerprint: row.fingerprint,
    status: row.status,
    token: row.token,
    lockedUntilMs: stored ? null : row.locked_until,
    response: stored
      ? {
          status: row.response_status as number,
          headers: decodeHeaders(row.response_headers),
          // better-sqlite3 hands back a Buffer, node:sqlite a Uint8Array; callers get a plain Uint8Array view.
          body: body ? new Uint8Array(body.buffer, body.byteOffset, body.byteLength) : new Uint8Array(0),
        }
      : null,
    resourceId: row.resource_id,
    attempts: row.attempts,
    createdAtMs: row.created_at,
    updatedAtMs: row.updated_at,
    expiresAtMs: row.expires_at,
  }
}

export type SqliteStatements = ReturnType<typeof prepareStatements>
