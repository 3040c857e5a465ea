/** The SQLite outbox and inbox take the app's own database, from either driver (see backends/sqlite/driver.ts). */
export type { SqliteDatabase as SqliteDb } from './driver.js'
