/**
 * The SQL of MySqlStore's group commit: each statement does for `n` callers what one statement of
 * statements.ts does for one. MySQL 8 has no arrays to unnest and no RETURNING (MariaDB has
 * `INSERT … RETURNING` but no `UPDATE … RETURNING`), so callers are rows of a multi-row VALUES list
 * or of a derived table (`SELECT ? … UNION ALL SELECT ? …`), and what each caller got is read back
 * by primary key: through its own random `claim` for acquire, under the batch's row locks for the
 * fenced writes. Sent on the text protocol (`query`): one prepared statement per batch size and
 * connection would fill the server's `max_prepared_stmt_count`. Not part of the public API.
 */
import { COLUMNS, NOW_MS, takeOver } from './statements.js'

const times = (n: number, text: string, separator: string) => Array.from({ length: n }, () => text).join(separator)

/** `n` (scope, key) pairs by primary key: a range scan of n points. */
export const byKeys = (n: number) => `(${times(n, '(scope = ? AND `key` = ?)', ' OR ')})`

/**
 * A derived table of `n` rows: the first names the columns (`? AS name`, `CAST(? AS SIGNED) AS name`
 * for integers), the others are plain placeholders.
 */
function rows(n: number, columns: Array<[name: string, integer?: boolean]>): string {
  const first = columns.map(([name, integer]) => (integer ? `CAST(? AS SIGNED) AS ${name}` : `? AS ${name}`)).join(', ')
  const rest = columns.map(() => '?').join(', ')
  return `(SELECT ${first}${n > 1 ? ` UNION ALL ${times(n - 1, `SELECT ${rest}`, ' UNION ALL ')}` : ''})`
}

export function batchStatements(table: string, retentionMs: number) {
  const t = `\`${table}\``
  const squash = (sql: string) => sql.replace(/\s+/g, ' ').trim()
  /**
   * A fenced write of `n` callers, whose rows the batch's transaction has locked and found current:
   * one multi-table UPDATE joined to their (scope, key, token, …) rows, fenced by token as the single one.
   */
  const fenced = (n: number, columns: Array<[string, boolean?]>, set: string) =>
    squash(`UPDATE ${t} r JOIN ${rows(n, [['scope'], ['k'], ['token', true], ...columns])} i
      ON r.scope = i.scope AND r.\`key\` = i.k AND r.token = i.token
      SET ${set}, r.revision = r.revision + 1
      WHERE r.status = 'in_progress'`)
  return {
    /** The records of `n` distinct (scope, key) pairs before acquire writes, as the single `peek` reads one. Values: scope, key per caller. */
    peek: (n: number) =>
      squash(`SELECT ${COLUMNS}, (steps IS NOT NULL AND steps <> '{}') AS has_steps, ${NOW_MS} AS now_ms FROM ${t} WHERE ${byKeys(n)}`),
    /** The single `held` for `n` distinct (scope, key) pairs: fails at once when another transaction holds any of their rows. */
    held: (n: number) => squash(`SELECT 1 FROM ${t} WHERE ${byKeys(n)} FOR UPDATE NOWAIT`),
    /**
     * The single acquire's upsert for `n` rows of distinct (scope, key), in the order given (sorted, so
     * every batch locks rows in one order). Each row offers its own fingerprint, lease and claim; the
     * takeover conditions read them back as `VALUES(column)`, so each row is decided as its single
     * statement would decide it. Values per caller: scope, key, fingerprint, lease ms, lease ms, claim.
     */
    acquire: (n: number) =>
      squash(`INSERT INTO ${t} (scope, \`key\`, fingerprint, status, token, locked_until, attempts, created_at, updated_at,
        expires_at, claim, revision) VALUES ${times(
          n,
          `(?, ?, ?, 'in_progress', 1, ${NOW_MS} + CAST(? AS SIGNED), 1, ${NOW_MS}, ${NOW_MS}, ${NOW_MS} + CAST(? AS SIGNED) + ${retentionMs}, ?, 1)`,
          ', ',
        )}
        ${takeOver({
          fingerprint: 'VALUES(fingerprint)',
          claim: 'VALUES(claim)',
          lockedUntil: 'VALUES(locked_until)',
          expiresAt: 'VALUES(expires_at)',
        })}`),
    /** The rows after the upsert; a caller holds its row when the row's `claim` is the one it offered. Values: scope, key per caller. */
    acquired: (n: number) => squash(`SELECT ${COLUMNS}, steps, claim, ${NOW_MS} AS now_ms FROM ${t} WHERE ${byKeys(n)}`),
    /** The live records of `n` (scope, key) pairs. */
    get: (n: number) => squash(`SELECT ${COLUMNS} FROM ${t} WHERE ${byKeys(n)} AND expires_at > ${NOW_MS}`),
    /** Locks the rows of a fenced batch in primary-key order, and tells which tokens are current. */
    lock: (n: number) => squash(`SELECT scope, \`key\`, token, status FROM ${t} WHERE ${byKeys(n)} ORDER BY scope, \`key\` FOR UPDATE`),
    /** Values per caller: scope, key, token, lease ms. */
    renew: (n: number) =>
      fenced(
        n,
        [['lease', true]],
        `r.locked_until = ${NOW_MS} + i.lease, r.updated_at = ${NOW_MS}, r.expires_at = ${NOW_MS} + i.lease + ${retentionMs}`,
      ),
    /** Values per caller: scope, key, token, status, response status, headers, body, resource id, ttl ms. */
    complete: (n: number) =>
      fenced(
        n,
        [['status'], ['response_status', true], ['response_headers'], ['response_body'], ['resource_id'], ['ttl', true]],
        `r.status = i.status, r.locked_until = NULL, r.response_status = i.response_status, r.response_headers = i.response_headers,
        r.response_body = i.response_body, r.resource_id = i.resource_id, r.updated_at = ${NOW_MS}, r.expires_at = ${NOW_MS} + i.ttl`,
      ),
    /** Values per caller: scope, key, token. */
    release: (n: number) =>
      fenced(n, [], `r.locked_until = ${NOW_MS}, r.updated_at = ${NOW_MS}, r.expires_at = ${NOW_MS} + ${retentionMs}`),
  }
}

export type BatchStatements = ReturnType<typeof batchStatements>
