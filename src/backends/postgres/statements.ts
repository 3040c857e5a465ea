/** The SQL of PostgresStore, one statement per operation. Not part of the public API. */

import { statementName } from '../sql/prepared-names.js'

/**
 * The server's clock as integer epoch milliseconds. `clock_timestamp()` is the real time (not the
 * transaction's start like `now()`), so a statement inside a long transaction still sees the present.
 * It changes during a statement, so each statement reads it once, in a `now` CTE, and uses that.
 */
export const NOW_MS = 'floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint'

/**
 * The acquire statements' `now` (plain, batched and partitioned), which also bounds the statement's
 * lock waits for the rest of its transaction (`set_config(…, true)`: a local setting, gone at commit).
 * An acquire that finds no live record takes the row over, and a row another transaction holds would
 * make it wait for that transaction's end: a holder that completed the record inside its own
 * transaction (`runInTransaction`, a pg-boss batch through `pgBossTransactions()`) and has not
 * committed yet, its lease ended meanwhile. Unbounded, the wait held a pool connection up to the
 * store's timeout and then failed STORE_UNAVAILABLE. Bounded, it fails with SQLSTATE 55P03 and the
 * store answers `in_progress` (postgres-errors.ts, `rowHeld`): the record is in flight, and the ledger
 * waits for it as for any holder. The waits of normal operation (two acquires of one new key, the
 * loser waiting for the winner's commit) last a commit, far below the bound. `now` is evaluated
 * before anything of the statement that may wait (every part reads it), and costs one function call.
 */
export const ACQUIRE_NOW = `SELECT ${NOW_MS} AS ms, set_config('lock_timeout', '100ms', true) AS bounded`

/** The columns every read returns, in the order of the table. */
export const COLUMNS = `scope, "key", fingerprint, status, token, locked_until, response_status, response_headers,
  response_body, resource_id, attempts, created_at, updated_at, expires_at`

/** Every column the store needs, for the shape check of `migrate()`. */
export const ALL_COLUMNS = `${COLUMNS}, waiters, steps`

/** A statement the store sends, with a stable prepared-statement name derived from its text. */
export interface Statement {
  name: string
  text: string
}

export function statement(text: string): Statement {
  const compact = text.replace(/\s+/g, ' ').trim()
  return { name: statementName(compact), text: compact }
}

/** `"schema"."table"`: both are validated plain identifiers, quoted to keep their case. */
export function qualified(schema: string, table: string): string {
  return `"${schema}"."${table}"`
}

/**
 * Whether the row `r` is a live record for a request of `fingerprint` at `now.ms`: one that stops an
 * acquire (stored, or in progress under a lease, or ended with steps of another request).
 */
export function live(fingerprint: string): string {
  return `r.expires_at > now.ms AND (r.status <> 'in_progress' OR r.locked_until > now.ms
    OR (r.fingerprint <> ${fingerprint} AND r.steps IS NOT NULL AND r.steps <> '{}'::jsonb))`
}

/**
 * The conflict clause of acquire (single and batched): on a row of the same (scope, key), take it
 * only if it is expired, or in progress with its lease ended (by another fingerprint only when the
 * ended attempt left no steps); a stored row keeps counting its token, so a zombie stays fenced out.
 */
export const TAKEOVER = `ON CONFLICT (scope, "key") DO UPDATE SET
      fingerprint = EXCLUDED.fingerprint,
      status = 'in_progress',
      token = r.token + 1,
      locked_until = EXCLUDED.locked_until,
      response_status = NULL, response_headers = NULL, response_body = NULL, resource_id = NULL,
      attempts = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN 1 ELSE r.attempts + 1 END,
      created_at = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN EXCLUDED.created_at ELSE r.created_at END,
      updated_at = EXCLUDED.updated_at,
      expires_at = EXCLUDED.expires_at,
      waiters = EXCLUDED.waiters OR (r.waiters AND r.expires_at > EXCLUDED.created_at),
      steps = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN NULL ELSE r.steps END
    WHERE r.expires_at <= EXCLUDED.created_at OR (r.status = 'in_progress' AND r.locked_until <= EXCLUDED.created_at
      AND (r.fingerprint = EXCLUDED.fingerprint OR r.steps IS NULL OR r.steps = '{}'::jsonb))`

/**
 * Builds the statements for one table. Every value is a `$n` parameter: no input is ever part of the
 * SQL text. Parameters: $1 scope, $2 key, then per statement.
 */
export function statements(schema: string, table: string) {
  const t = qualified(schema, table)
  // One row per changed record. With a channel ($3 not null) it also notifies, but only when a waiter
  // flagged the record: a NOTIFY serializes the commits of every notifying transaction (PostgreSQL
  // takes a database-wide lock for it), so completions nobody waits for must not send one. The column
  // is text, not pg_notify's void, which some tools' raw queries cannot read (Prisma).
  const notify = (rows: string) =>
    `SELECT (CASE WHEN $3::text IS NOT NULL AND ${rows}.waiters THEN pg_notify($3::text, ${rows}.scope || chr(10) || ${rows}."key") END)::text AS notified FROM ${rows}`
  return {
    /**
     * Acquire, one round trip. `cur` reads the live record (if any) from the statement's snapshot;
     * only when there is none does `ins` write: an INSERT that, on conflict, takes the stored row only
     * if it is expired or in progress with its lease ended (by another fingerprint only when the ended
     * attempt left no steps, which are its own request's partial effects: `cur` reads such a record as
     * live, so another fingerprint meets a mismatch), judged on the newest committed version
     * under the row lock. So a replay or a duplicate in flight is a plain read (no lock, no commit
     * to flush), and two racing acquires cannot both win. When neither answers (another caller took
     * the row between the snapshot and the insert) the caller runs the statement again.
     *
     * $3 fingerprint, $4 lease ms, $5 abandoned retention ms, $6 whether this process already
     * watches the key (then the row is flagged for a NOTIFY at once). Returns one row: `taken` (the token
     * when acquired) and, when a live record stopped it, its columns (the body only if the
     * fingerprint matches, so a mismatch never ships a body).
     */
    acquire: statement(`
      WITH now AS MATERIALIZED (${ACQUIRE_NOW}),
      cur AS MATERIALIZED (
        SELECT r.fingerprint, r.status, r.token, r.locked_until, r.response_status, r.response_headers,
          CASE WHEN r.fingerprint = $3 THEN r.response_body END AS response_body,
          r.resource_id, r.attempts, r.created_at, r.updated_at, r.expires_at
        FROM ${t} r, now
        WHERE r.scope = $1 AND r."key" = $2 AND ${live('$3')}
      ),
      ins AS (
        INSERT INTO ${t} AS r (scope, "key", fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at,
          waiters)
        SELECT $1, $2, $3, 'in_progress', 1, now.ms + $4::bigint, 1, now.ms, now.ms, now.ms + $4::bigint + $5::bigint, $6::boolean
        FROM now WHERE NOT EXISTS (SELECT 1 FROM cur)
        ${TAKEOVER}
        RETURNING r.token, r.steps
      )
      SELECT (SELECT token FROM ins) AS taken, (SELECT steps::text FROM ins) AS taken_steps, cur.*, now.ms AS now_ms
      FROM now LEFT JOIN cur ON true`),
    /**
     * One step of an in-progress record, fenced by token: $3 token, $4 name, $5 result (JSON text), or
     * NULL for a started marker, which never replaces a result. Steps live in the record's `steps` jsonb
     * object (name → {"r": result text}, or {} when started), so acquire reads them with the row.
     * Returns the changed row (a tool's raw query may count only returned rows), and spells the jsonb
     * `?` operator as `jsonb_exists` (tools that bind `?` placeholders would take it for one).
     */
    recordStep: statement(`
      UPDATE ${t} r SET steps = CASE
          WHEN $5::text IS NOT NULL THEN coalesce(r.steps, '{}'::jsonb) || jsonb_build_object($4::text, jsonb_build_object('r', $5::text))
          WHEN jsonb_exists(coalesce(r.steps, '{}'::jsonb), $4::text) THEN r.steps
          ELSE coalesce(r.steps, '{}'::jsonb) || jsonb_build_object($4::text, '{}'::jsonb) END
      WHERE r.scope = $1 AND r."key" = $2 AND r.token = $3 AND r.status = 'in_progress'
      RETURNING r.token`),
    get: statement(`
      SELECT ${COLUMNS} FROM ${t} WHERE scope = $1 AND "key" = $2 AND expires_at > ${NOW_MS}`),
    /** $3 token, $4 lease ms, $5 retention ms. */
    renew: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms)
      UPDATE ${t} r SET locked_until = now.ms + $4::bigint, updated_at = now.ms, expires_at = now.ms + $4::bigint + $5::bigint
      FROM now WHERE r.scope = $1 AND r."key" = $2 AND r.token = $3 AND r.status = 'in_progress'`),
    /**
     * $3 channel, $4 token, $5 status, $6 response status, $7 headers, $8 body, $9 resource id,
     * $10 ttl ms. Notifies waiters in the same statement; the notice is delivered at commit.
     */
    complete: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      done AS (
        UPDATE ${t} r SET status = $5::text, locked_until = NULL, response_status = $6, response_headers = $7,
          response_body = $8, resource_id = $9, updated_at = now.ms, expires_at = now.ms + $10::bigint
        FROM now WHERE r.scope = $1 AND r."key" = $2 AND r.token = $4 AND r.status = 'in_progress'
        RETURNING r.scope, r."key", r.waiters
      )
      ${notify('done')}`),
    /**
     * `complete` as one plain UPDATE, for a tool's transaction (docs/orm.md), whose statements go out
     * unprepared: the CTEs of `complete` cost more to plan than to run. The notice is sent from
     * RETURNING (so only for a changed row whose waiters asked), and the clock is read per use, the
     * reads apart by microseconds. Same parameters as `complete`.
     */
    completeFlat: statement(`
      UPDATE ${t} r SET status = $5::text, locked_until = NULL, response_status = $6, response_headers = $7,
        response_body = $8, resource_id = $9, updated_at = ${NOW_MS}, expires_at = ${NOW_MS} + $10::bigint
      WHERE r.scope = $1 AND r."key" = $2 AND r.token = $4 AND r.status = 'in_progress'
      RETURNING (CASE WHEN $3::text IS NOT NULL AND r.waiters THEN pg_notify($3::text, r.scope || chr(10) || r."key") END)::text AS notified`),
    /** $3 channel, $4 token, $5 retention ms. */
    release: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      done AS (
        UPDATE ${t} r SET locked_until = now.ms, updated_at = now.ms, expires_at = now.ms + $5::bigint
        FROM now WHERE r.scope = $1 AND r."key" = $2 AND r.token = $4 AND r.status = 'in_progress'
        RETURNING r.scope, r."key", r.waiters
      )
      ${notify('done')}`),
    /**
     * A waiter's flag: asks the holder's completion to NOTIFY. Writes only when the record is in
     * progress and not flagged yet. Answers how many in-progress records it saw (0: it changed
     * already, so the waiter should look again now).
     */
    flagWaiter: statement(`
      WITH cur AS (SELECT 1 FROM ${t} WHERE scope = $1 AND "key" = $2 AND status = 'in_progress' AND waiters),
      flagged AS (
        UPDATE ${t} SET waiters = true WHERE scope = $1 AND "key" = $2 AND status = 'in_progress' AND NOT waiters RETURNING 1
      )
      SELECT (SELECT count(*) FROM cur) + (SELECT count(*) FROM flagged) AS seen`),
    /** $3 channel. */
    evict: statement(`
      WITH done AS (DELETE FROM ${t} WHERE scope = $1 AND "key" = $2 RETURNING scope, "key", waiters)
      ${notify('done')}`),
    /**
     * Deletes up to $1 expired rows: a range scan of the expires_at index picks them (skipping rows
     * another transaction holds), and they are deleted by their physical address (`ctid`, a TID
     * scan). The expiry is checked again on delete, so a row renewed in between is kept.
     */
    purge: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms)
      DELETE FROM ${t} WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM ${t} WHERE expires_at <= (SELECT ms FROM now) ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
      )) AND expires_at <= (SELECT ms FROM now)`),
  }
}

export type Statements = ReturnType<typeof statements>

/**
 * The record columns of schema version 1, shared by the plain table's first migration and the
 * partitioned table (which adds `steps` and its own primary key). Never edit it: a change of columns is
 * a new migration (schema.ts).
 */
export const RECORD_COLUMNS_V1 = `
  scope text COLLATE "C" NOT NULL,
  "key" text COLLATE "C" NOT NULL,
  fingerprint text NOT NULL,
  status text NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
  token bigint NOT NULL,
  locked_until bigint NULL,
  response_status smallint NULL,
  response_headers text NULL,
  response_body bytea NULL,
  resource_id text NULL,
  attempts integer NOT NULL,
  created_at bigint NOT NULL,
  updated_at bigint NOT NULL,
  expires_at bigint NOT NULL,
  waiters boolean NOT NULL DEFAULT false`
