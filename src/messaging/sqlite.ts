/** The SQLite outbox and inbox take the app's own database, from either driver (see stores/sqlite/driver.ts). */
export type { SqliteDatabase as SqliteDb } from '../stores/sqlite/driver.js'
