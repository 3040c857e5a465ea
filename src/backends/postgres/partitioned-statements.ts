/**
 * The statements the partitioned layout needs in place of the plain ones (partitions.ts). The others
 * (get, renew, complete, release, steps, evict) find a record by (scope, key) in any partition and run
 * unchanged. Not part of the public API.
 *
 * One record per (scope, key) across partitions: the table's primary key is (scope, key, created_at),
 * so no constraint stops a second row of a key in another partition. Instead every acquire that may
 * write runs in a READ COMMITTED transaction that first takes a transaction-level advisory lock on
 * each of its keys' hashes (`lock`), and only then, with a snapshot taken after the lock, reads and
 * writes the key (`acquire`): two acquires of one key take turns, and the second sees what the first
 * committed, whichever partition it went to. The other writers never create rows, so they need no lock.
 */
import { ACQUIRE_NOW, COLUMNS, live, NOW_MS, qualified, statement } from './statements.js'

export function partitionedStatements(schema: string, table: string) {
  const t = qualified(schema, table)
  return {
    /**
     * $1 scopes, $2 keys. Locks each distinct (scope, key) of the batch until the transaction ends,
     * in the order of their hashes (so two batches cannot wait for each other in a cycle; if they
     * ever did, the deadlock is rolled back and the callers run alone). The table's name is hashed
     * with the key, so stores on two tables never wait for each other.
     */
    lock: statement(`
      SELECT count(pg_advisory_xact_lock(h)) AS locked FROM (
        SELECT DISTINCT hashtextextended($3::text || chr(10) || u.scope || chr(10) || u."key", 0) AS h
        FROM unnest($1::text[], $2::text[]) AS u(scope, "key") ORDER BY h
      ) AS hashes`),
    /**
     * The batch acquire of batch-statements.ts (same parameters, same rows), for a table whose
     * primary key cannot serve ON CONFLICT. Under the lock, with no live record, a first caller:
     * - with no row, inserts one (token 1) in the partition of now;
     * - with an expired row, deletes it and inserts the next lifecycle (the row's token + 1, so a
     *   zombie of the old one stays fenced out) in the partition of now: a key used again does not
     *   keep an old partition from being dropped;
     * - with an in-progress row whose lease ended (TAKEOVER's conditions), takes it in place.
     * The DELETE and UPDATE re-check their conditions on the newest version of the row (READ
     * COMMITTED), so a renewal or completion that landed in between wins, and the caller runs again.
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
      old AS MATERIALIZED (
        SELECT i.n, r.scope, r."key", r.created_at, r.token, r.expires_at <= now.ms AS expired
        FROM i JOIN ${t} r ON r.scope = i.scope AND r."key" = i."key" CROSS JOIN now
        WHERE i.first AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.n = i.n)
      ),
      gone AS (
        DELETE FROM ${t} r USING old, now
        WHERE old.expired AND r.scope = old.scope AND r."key" = old."key" AND r.created_at = old.created_at
          AND r.token = old.token AND r.expires_at <= now.ms
        RETURNING old.n, r.token
      ),
      taken AS (
        UPDATE ${t} r SET fingerprint = i.fingerprint, status = 'in_progress', token = r.token + 1,
          locked_until = now.ms + i.lease_ms, response_status = NULL, response_headers = NULL, response_body = NULL,
          resource_id = NULL, attempts = r.attempts + 1, updated_at = now.ms, expires_at = now.ms + i.lease_ms + $7::bigint,
          waiters = i.watched OR r.waiters
        FROM old JOIN i ON i.n = old.n, now
        WHERE NOT old.expired AND r.scope = old.scope AND r."key" = old."key" AND r.created_at = old.created_at
          AND r.expires_at > now.ms AND r.status = 'in_progress' AND r.locked_until <= now.ms
          AND (r.fingerprint = i.fingerprint OR r.steps IS NULL OR r.steps = '{}'::jsonb)
        RETURNING old.n, r.token, r.steps
      ),
      ins AS (
        INSERT INTO ${t} (scope, "key", fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at, waiters)
        SELECT i.scope, i."key", i.fingerprint, 'in_progress', coalesce(gone.token + 1, 1), now.ms + i.lease_ms, 1, now.ms, now.ms,
          now.ms + i.lease_ms + $7::bigint, i.watched
        FROM i CROSS JOIN now LEFT JOIN gone ON gone.n = i.n
        WHERE i.first AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.n = i.n)
          AND (gone.n IS NOT NULL OR NOT EXISTS (SELECT 1 FROM old WHERE old.n = i.n))
        ORDER BY i.n
        RETURNING scope, "key", token
      )
      SELECT i.n, coalesce(ins.token, taken.token) AS taken, taken.steps::text AS taken_steps, cur.fingerprint, cur.status,
        cur.token, cur.locked_until, cur.response_status, cur.response_headers, cur.response_body, cur.resource_id,
        cur.attempts, cur.created_at, cur.updated_at, cur.expires_at
      FROM i LEFT JOIN cur ON cur.n = i.n LEFT JOIN taken ON taken.n = i.n
        LEFT JOIN ins ON i.first AND ins.scope = i.scope AND ins."key" = i."key"`),
    /**
     * The acquire's read alone, with no lock and no transaction: $1 scopes, $2 keys, $3 fingerprints.
     * One row per caller whose key has a live record, shaped as `acquire` answers it. A replay or a
     * duplicate in flight is answered by it in one round trip; only the callers it leaves unanswered
     * (no live record: the acquire may write) take the key lock. Answering from a snapshot is what the
     * plain layout's acquire does too when its read finds a live record.
     */
    peek: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      i AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS i(scope, "key", fingerprint, n))
      SELECT i.n, NULL::bigint AS taken, NULL::text AS taken_steps, r.fingerprint, r.status, r.token, r.locked_until,
        r.response_status, r.response_headers, CASE WHEN r.fingerprint = i.fingerprint THEN r.response_body END AS response_body,
        r.resource_id, r.attempts, r.created_at, r.updated_at, r.expires_at
      FROM i JOIN ${t} r ON r.scope = i.scope AND r."key" = i."key" CROSS JOIN now
      WHERE ${live('i.fingerprint')}`),
    /**
     * `purgeExpired` on the partitioned table: the plain statement's `ctid` names a row only within
     * one partition, so rows are picked and deleted by primary key. The store's own task and
     * `idemkey gc` drop whole partitions instead (rotation.ts); this is the contract's row-by-row purge.
     */
    purge: statement(`
      WITH now AS MATERIALIZED (SELECT ${NOW_MS} AS ms),
      picked AS (
        SELECT scope, "key", created_at FROM ${t} WHERE expires_at <= (SELECT ms FROM now)
        ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
      )
      DELETE FROM ${t} r USING picked, now
      WHERE r.scope = picked.scope AND r."key" = picked."key" AND r.created_at = picked.created_at AND r.expires_at <= now.ms`),
  }
}

export type PartitionedStatements = ReturnType<typeof partitionedStatements>

/** The columns of a record, for copying rows between layouts. */
export const RECORD_COLUMNS = `${COLUMNS}, waiters, steps`
