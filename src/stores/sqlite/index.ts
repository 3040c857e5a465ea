export { SCHEMA_VERSION, type SqliteDatabase } from './schema.js'
export { SqliteStore, type SqliteStoreOptions } from './sqlite-store.js'
