export type { DurabilityProblem, PostgresDurability, SynchronousCommit } from './durability.js'
export { PostgresDurabilityError } from './durability.js'
export type { LayoutConversion } from './layout-migration.js'
export type {
  IsolationLevel,
  PostgresGcOptions,
  PostgresStoreCommonOptions,
  PostgresStoreOptions,
  PostgresStorePoolOptions,
  PostgresStoreUrlOptions,
} from './options.js'
export type { PostgresLayout } from './partitions.js'
export type { PgClientLike, PgConnectionConfig, PgNotification, PgPoolLike, PgQueryable, PgQueryConfig, PgQueryResult } from './pool.js'
export { isTransientTransactionError } from './postgres-errors.js'
export { PostgresStore } from './postgres-store.js'
export type { Rotation } from './rotation.js'
export { SCHEMA_VERSION } from './schema.js'
