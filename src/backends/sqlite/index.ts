export {
  type BetterSqlite3Database,
  type NodeSqliteDatabase,
  type SqliteDatabase,
  type SqliteDriverName,
  sqliteTransaction,
} from './driver.js'
export { SCHEMA_VERSION } from './schema.js'
export { SqliteStore, type SqliteStoreOptions } from './sqlite-store.js'
