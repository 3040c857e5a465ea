/**
 * The SQL of PostgresStore's group commit: each statement does for many callers what one statement
 * of statements.ts does for one, in one statement and so one commit. Callers come as parallel arrays
 * (`unnest … WITH ORDINALITY`, so each output row names its caller by `n`, 1-based), with distinct
 * (scope, key) and sorted by them, so row locks are taken in one order by every batch. Each row is
 * decided by the same conditions as the single statement (`live`, `TAKEOVER`, the token fence).
 * Not part of the public API.
 */
import { ACQUIRE_NOW, COLUMNS, live, NOW_MS, qualified, statement, TAKEOVER } from './statements.js'

/** `r.`-qualified COLUMNS, for reads that join the callers' rows. */
const R_COLUMNS = COLUMNS.split(',')
  .map((column) => `r.${column.trim()}`)
  .join(', ')

export function batchStatements(schema: string, table: string) {
  const t = qualified(schema, table)
  const notify = (rows: string, channel: string) =>
    `SELECT ${rows}.n, (CASE WHEN ${channel}::text IS NOT NULL AND ${rows}.waiters THEN pg_notify(${channel}::text, ${rows}.scope || chr(10) || ${rows}."key") END)::text AS notified FROM ${rows}`
  return {
    /**
     * $1 scopes, $2 keys, $3 fingerprints, $4 lease ms, $5 watched flags, $6 first flags (the first
     * caller of its (scope, key) in the batch); $7 abandoned retention ms. Flags come as text ('t',
     * 'f'), and bodies as hex text: every array is text or numbers, which each driver sends as the
     * server asks (postgres.js would type an array of booleans or of Buffers as one value).
     * One row per caller: `taken` (its token when it acquired) or the live record that stopped it,
     * as the single acquire answers; neither: run it again, in the next batch. Only the first caller
     * of a row may insert (an INSERT … ON CONFLICT cannot change one row twice): the others of that
     * row, when there is no live record, run again and then meet the first one's record, as they
     * would have on the single path. The INSERT takes the rows in the callers' order (`ORDER BY n`).
     */
    acquire: statement(`
      WITH now AS MATERIALIZED (${ACQUIRE_NOW}),
      i AS MATERIALIZED (
        SELECT u.scope, u."key", u.fingerprint, u.lease_ms, u.watched::boolean AS watched, u.first::boolean AS first, u.n
        FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[])
          WITH ORDINALITY AS u(scope, "key", fingerprint, lease_ms, watched, first, n)
      ),
      cur AS MATERIALIZED (
        SELECT i.n, r.fingerprint, r.status, r.token, r.locked_until, r.response_status, r.response_headers,
          CASE WHEN r.fingerprint = i.fingerprint THEN r.response_body END AS response_body,
          r.resource_id, r.attempts, r.created_at, r.updated_at, r.expires_at
        FROM i JOIN ${t} r ON r.scope = i.scope AND r."key" = i."key" CROSS JOIN now
        WHERE ${live('i.fingerprint')}
      ),
      ins AS (
        INSERT INTO ${t} AS r (scope, "key", fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at,
          waiters)
        SELECT i.scope, i."key", i.fingerprint, 'in_progress', 1, now.ms + i.lease_ms, 1, now.ms, now.ms,
          now.ms + i.lease_ms + $7::bigint, i.watched
        FROM i CROSS JOIN now WHERE i.first AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.n = i.n)
        ORDER BY i.n
        ${TAKEOVER}
        RETURNING r.scope, r."key", r.token, r.steps
      )
      SELECT i.n, ins.token AS taken, ins.steps::text AS taken_steps, cur.fingerprint, cur.status, cur.token, cur.locked_until,
        cur.response_status, cur.response_headers, cur.response_body, cur.resource_id, cur.attempts, cur.created_at,
        cur.updated_at, cur.expires_at
      FROM i LEFT JOIN cur ON cur.n = i.n LEFT JOIN ins ON i.first AND ins.scope = i.scope AND ins."key" = i."key"`),
    /** $1 scopes, $2 keys. One row per caller whose record is live. */
    get: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      i AS (SELECT * FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS i(scope, "key", n))
      SELECT i.n, ${R_COLUMNS} FROM i JOIN ${t} r ON r.scope = i.scope AND r."key" = i."key" CROSS JOIN now
      WHERE r.expires_at > now.ms`),
    /** $1 scopes, $2 keys, $3 tokens, $4 lease ms; $5 retention ms. One row per renewed caller. */
    renew: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      i AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS i(scope, "key", token, lease_ms, n))
      UPDATE ${t} r SET locked_until = now.ms + i.lease_ms, updated_at = now.ms, expires_at = now.ms + i.lease_ms + $5::bigint
      FROM i, now WHERE r.scope = i.scope AND r."key" = i."key" AND r.token = i.token AND r.status = 'in_progress'
      RETURNING i.n`),
    /**
     * $1 scopes, $2 keys, $3 tokens, $4 statuses, $5 response statuses, $6 headers, $7 bodies (hex),
     * $8 resource ids, $9 ttl ms; $10 channel. One row per completed caller, notifying as `complete` does.
     */
    complete: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      i AS (
        SELECT u.scope, u."key", u.token, u.status, u.response_status, u.response_headers,
          decode(u.response_body, 'hex') AS response_body, u.resource_id, u.ttl_ms, u.n
        FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::smallint[], $6::text[], $7::text[], $8::text[], $9::bigint[])
          WITH ORDINALITY AS u(scope, "key", token, status, response_status, response_headers, response_body, resource_id, ttl_ms, n)
      ),
      done AS (
        UPDATE ${t} r SET status = i.status, locked_until = NULL, response_status = i.response_status,
          response_headers = i.response_headers, response_body = i.response_body, resource_id = i.resource_id,
          updated_at = now.ms, expires_at = now.ms + i.ttl_ms
        FROM i, now WHERE r.scope = i.scope AND r."key" = i."key" AND r.token = i.token AND r.status = 'in_progress'
        RETURNING i.n, r.scope, r."key", r.waiters
      )
      ${notify('done', '$10')}`),
    /** $1 scopes, $2 keys, $3 tokens; $4 retention ms, $5 channel. One row per released caller. */
    release: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      i AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS i(scope, "key", token, n)),
      done AS (
        UPDATE ${t} r SET locked_until = now.ms, updated_at = now.ms, expires_at = now.ms + $4::bigint
        FROM i, now WHERE r.scope = i.scope AND r."key" = i."key" AND r.token = i.token AND r.status = 'in_progress'
        RETURNING i.n, r.scope, r."key", r.waiters
      )
      ${notify('done', '$5')}`),
  }
}

export type BatchStatements = ReturnType<typeof batchStatements>
