import { IdempotencyError } from '../../errors.js'
import type { SqliteConnection } from './driver.js'

/** The schema version this release writes. Bump it and append to MIGRATIONS to change the schema. */
export const SCHEMA_VERSION = 2

/** Each entry upgrades the schema by one version; index 0 creates version 1. */
const MIGRATIONS: Array<(table: string) => string> = [
  (table) => `
    CREATE TABLE IF NOT EXISTS ${table} (
      scope TEXT NOT NULL,
      key TEXT NOT NULL,
      fingerprint TEXT NOT NULL,
      status TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
      token INTEGER NOT NULL,
      locked_until INTEGER,
      response_status INTEGER,
      response_headers TEXT,
      response_body BLOB,
      resource_id TEXT,
      attempts INTEGER NOT NULL,
      created_at INTEGER NOT NULL,
      updated_at INTEGER NOT NULL,
      expires_at INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX IF NOT EXISTS ${table}_identity ON ${table} (scope, key);
    CREATE INDEX IF NOT EXISTS ${table}_expires_at ON ${table} (expires_at);
    CREATE INDEX IF NOT EXISTS ${table}_created_at ON ${table} (created_at);`,
  // Version 2: durable steps (docs/steps.md), one JSON object per record; existing rows get none.
  (table) => `ALTER TABLE ${table} ADD COLUMN steps TEXT;`,
]

/**
 * Creates or upgrades the schema, once, under the write lock, so processes that open the same file
 * at the same time do not race. The version lives in `<table>_meta`.
 */
export function migrate(db: SqliteConnection, table: string): void {
  const meta = `${table}_meta`
  db.immediate(() => {
    db.exec(`CREATE TABLE IF NOT EXISTS ${meta} (name TEXT PRIMARY KEY, value TEXT NOT NULL)`)
    const row = db.prepare(`SELECT value FROM ${meta} WHERE name = 'schema_version'`).get() as { value: string } | undefined
    const current = row ? Number(row.value) : 0
    if (current > SCHEMA_VERSION) {
      throw new IdempotencyError(
        'STORE_SCHEMA',
        `sqlite: table ${table} has schema version ${current}, newer than this idemkey understands (${SCHEMA_VERSION}). Upgrade idemkey, or point it at another table.`,
      )
    }
    for (let version = current; version < SCHEMA_VERSION; version++) {
      db.exec((MIGRATIONS[version] as (table: string) => string)(table))
    }
    db.prepare(
      `INSERT INTO ${meta} (name, value) VALUES ('schema_version', ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value`,
    ).run(String(SCHEMA_VERSION))
  })
}
