/**
 * `idemkey/outbox`: write events in the same transaction as the state change, and publish them
 * with a relay (docs/messaging.md). Publishers live in `idemkey/publishers/<broker>`.
 *
 * @example
 * import { MySqlOutbox, OutboxRelay, PgOutbox } from 'idemkey/outbox'
 * const outbox = new PgOutbox({ pool }) // or new MySqlOutbox({ pool }) on a mysql2/promise pool
 */

export type { MySqlConnectionLike, MySqlPoolLike } from '../../backends/mysql/messaging.js'
export { MySqlOutbox, type MySqlOutboxOptions } from '../../backends/mysql/mysql-outbox.js'
export type { PgClientLike, PgConnectionConfig, PgPool, PgPoolClient, PgPoolLike, PgQueryable } from '../../backends/postgres/messaging.js'
export {
  type PgCdcConnectionConfig,
  PgCdcRelay,
  type PgCdcRelayEvent,
  type PgCdcRelayHealth,
  type PgCdcRelayOptions,
  ReplicationSlotInUseError,
  ReplicationSlotLagError,
} from '../../backends/postgres/postgres-cdc-relay.js'
export { PgOutbox, type PgOutboxOptions } from '../../backends/postgres/postgres-outbox.js'
export { SqliteOutbox, type SqliteOutboxOptions } from '../../backends/sqlite/sqlite-outbox.js'
export {
  type MessageHeaders,
  type OutboxMessage,
  PublishError,
  type Publisher,
  type PublishFailure,
  PublishMismatchError,
  type PublishResult,
} from '../message.js'
export { OutboxRelay, type OutboxRelayOptions, type RelayEvent } from './relay.js'
export {
  type AddResult,
  DEFAULT_MAX_PAYLOAD_BYTES,
  messageIdFor,
  type OutboxEventInput,
  type RelayStorage,
  type RowFailure,
} from './storage.js'
