/**
 * `idemkey/outbox`: write events in the same transaction as the state change, and publish them
 * with a relay (docs/messaging.md). Publishers live in `idemkey/publishers/<broker>`.
 *
 * @example
 * import { MySqlOutbox, OutboxRelay, PgOutbox } from 'idemkey/outbox'
 * const outbox = new PgOutbox({ pool }) // or new MySqlOutbox({ pool }) on a mysql2/promise pool
 */
export {
  type MessageHeaders,
  type OutboxMessage,
  PublishError,
  type Publisher,
  type PublishFailure,
  PublishMismatchError,
  type PublishResult,
} from '../message.js'
export type { MySqlConnectionLike, MySqlPoolLike } from '../mysql.js'
export type { PgClientLike, PgConnectionConfig, PgPool, PgPoolClient, PgPoolLike, PgQueryable } from '../pg.js'
export { MySqlOutbox, type MySqlOutboxOptions } from './mysql-outbox.js'
export {
  type PgCdcConnectionConfig,
  PgCdcRelay,
  type PgCdcRelayEvent,
  type PgCdcRelayHealth,
  type PgCdcRelayOptions,
  ReplicationSlotInUseError,
  ReplicationSlotLagError,
} from './pg-cdc-relay.js'
export { PgOutbox, type PgOutboxOptions } from './pg-outbox.js'
export { OutboxRelay, type OutboxRelayOptions, type RelayEvent } from './relay.js'
export { SqliteOutbox, type SqliteOutboxOptions } from './sqlite-outbox.js'
export {
  type AddResult,
  DEFAULT_MAX_PAYLOAD_BYTES,
  messageIdFor,
  type OutboxEventInput,
  type RelayStorage,
  type RowFailure,
} from './storage.js'
