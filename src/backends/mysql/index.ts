export { isTransientTransactionError } from './mysql-errors.js'
export { MySqlStore, type MySqlStoreOptions } from './mysql-store.js'
export type { MySqlConnectionLike, MySqlPoolLike, MySqlTransaction, MySqlValue } from './pool.js'
export { SCHEMA_VERSION } from './schema.js'
