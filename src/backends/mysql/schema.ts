import { IdempotencyError } from '../../errors.js'
import { toStoreError } from './mysql-errors.js'
import type { ConnectionSource, MySqlConnectionLike } from './pool.js'

/** The schema version this release writes. Bump it and append to MIGRATIONS to change the schema. */
export const SCHEMA_VERSION = 2

/**
 * Each entry upgrades the schema by one version; index 0 creates version 1.
 *
 * Identity columns are VARBINARY, not text: every text collation of MySQL 8 and MariaDB either folds
 * case or ignores trailing spaces (PAD SPACE), and keys `k` and `k ` are two intents. Scopes are
 * stored as their UTF-8 bytes. Times are integer epoch milliseconds of the server's clock, like every
 * other store, so there is no DATETIME and no session time zone to get wrong. `claim` is a random
 * value written by the acquire that took the row (how acquire knows it won without a transaction);
 * `revision` is bumped by every write, so a write that matches a row always changes it and
 * `affectedRows` means the same with or without the CLIENT_FOUND_ROWS flag.
 */
const MIGRATIONS: Array<(table: string) => string[]> = [
  (table) => [
    `CREATE TABLE IF NOT EXISTS \`${table}\` (
      scope VARBINARY(1020) NOT NULL,
      \`key\` VARBINARY(255) NOT NULL,
      fingerprint CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
      status ENUM('in_progress', 'completed', 'failed') NOT NULL,
      token BIGINT NOT NULL,
      locked_until BIGINT NULL,
      response_status SMALLINT NULL,
      response_headers MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
      response_body LONGBLOB NULL,
      resource_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
      attempts INT NOT NULL,
      created_at BIGINT NOT NULL,
      updated_at BIGINT NOT NULL,
      expires_at BIGINT NOT NULL,
      claim BINARY(16) NOT NULL,
      revision BIGINT NOT NULL DEFAULT 0,
      PRIMARY KEY (scope, \`key\`),
      KEY \`${table}_expires_at\` (expires_at),
      KEY \`${table}_created_at\` (created_at)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`,
  ],
  // Version 2: durable steps (docs/steps.md), one JSON object per record, kept as text so MySQL 8
  // and MariaDB store it alike. A nullable column: existing rows keep working as they are.
  (table) => [`ALTER TABLE \`${table}\` ADD COLUMN steps LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL`],
]

/**
 * Creates or upgrades the schema, idempotently. A named lock (`GET_LOCK`) on one connection makes
 * processes that migrate at the same time take turns. The version lives in `<table>_meta`.
 */
export async function migrate(pool: ConnectionSource, table: string): Promise<void> {
  let connection: MySqlConnectionLike
  try {
    connection = await pool.getConnection()
  } catch (error) {
    throw toStoreError('migrate', error)
  }
  const lockName = `idemkey:migrate:${table}`
  try {
    const [locked] = await connection.query('SELECT GET_LOCK(?, 30) AS got', [lockName])
    if (Number((locked as Array<{ got: unknown }>)[0]?.got) !== 1) {
      throw new IdempotencyError(
        'STORE_UNAVAILABLE',
        `mysql: another process has been migrating table ${table} for 30 s. Wait for it to finish, then run store.migrate() again.`,
      )
    }
    try {
      const meta = `${table}_meta`
      await connection.query(
        `CREATE TABLE IF NOT EXISTS \`${meta}\` (name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY, value VARCHAR(255) NOT NULL) ENGINE = InnoDB`,
      )
      const [rows] = await connection.query(`SELECT value FROM \`${meta}\` WHERE name = 'schema_version'`)
      const current = Number((rows as Array<{ value: string }>)[0]?.value ?? 0)
      if (current > SCHEMA_VERSION) {
        throw new IdempotencyError(
          'STORE_SCHEMA',
          `mysql: table ${table} has schema version ${current}, newer than this idemkey understands (${SCHEMA_VERSION}). Upgrade idemkey, or point it at another table.`,
        )
      }
      // DDL commits implicitly in MySQL, so each step is recorded as soon as it is done.
      for (let version = current; version < SCHEMA_VERSION; version++) {
        for (const statement of (MIGRATIONS[version] as (table: string) => string[])(table)) await connection.query(statement)
        await connection.query(`INSERT INTO \`${meta}\` (name, value) VALUES ('schema_version', ?) ON DUPLICATE KEY UPDATE value = ?`, [
          String(version + 1),
          String(version + 1),
        ])
      }
    } finally {
      await connection.query('SELECT RELEASE_LOCK(?)', [lockName])
    }
  } catch (error) {
    throw toStoreError('migrate', error)
  } finally {
    connection.release()
  }
}
