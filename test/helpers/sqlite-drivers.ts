/**
 * The two SQLite drivers the embedded store runs on, for suites that run once on each: node:sqlite
 * (the default, built in) and better-sqlite3 (a database the user opens and passes).
 */
import { createRequire } from 'node:module'
import { DatabaseSync } from 'node:sqlite'
import type BetterSqlite3 from 'better-sqlite3'
import type { SqliteDatabase, SqliteDriverName } from '../../src/backends/sqlite/driver.js'
import { SqliteStore, type SqliteStoreOptions } from '../../src/backends/sqlite/sqlite-store.js'

export const SQLITE_DRIVERS: readonly SqliteDriverName[] = ['node:sqlite', 'better-sqlite3']

const require = createRequire(import.meta.url)

/** better-sqlite3's constructor, loaded only by the suites that use it. */
export function betterSqlite3(): typeof BetterSqlite3 {
  return require('better-sqlite3') as typeof BetterSqlite3
}

/** Opens `path` with `driver`, as an app would. */
export function openDatabase(driver: SqliteDriverName, path: string, options: { readOnly?: boolean } = {}): SqliteDatabase {
  if (driver === 'node:sqlite') return new DatabaseSync(path, { readOnly: options.readOnly ?? false })
  const Database = betterSqlite3()
  return new Database(path, { readonly: options.readOnly ?? false })
}

/** A store on `driver`: node:sqlite by path (the default), better-sqlite3 through `open`. */
export function storeOn(driver: SqliteDriverName, options: SqliteStoreOptions): SqliteStore {
  if (driver === 'node:sqlite') return new SqliteStore(options)
  return new SqliteStore({ ...options, open: (path) => openDatabase('better-sqlite3', path) })
}

/** The store URL that opens `path` with `driver` (for child processes and the CLI). */
export function sqliteUrl(driver: SqliteDriverName, path: string): string {
  return driver === 'node:sqlite' ? `sqlite:${path}` : `sqlite:${path}?driver=better-sqlite3`
}
