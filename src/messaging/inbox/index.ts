/**
 * `idemkey/inbox`: apply each message once, however often the broker delivers it (docs/messaging.md).
 * The broker consumer helpers live in `idemkey/publishers/<broker>`.
 *
 * @example
 * import { MySqlInbox, PgInbox } from 'idemkey/inbox'
 * const inbox = new PgInbox({ pool, consumer: 'billing' }) // or new MySqlInbox({ pool, consumer }) on mysql2
 */

export type { MySqlConnectionLike, MySqlPoolLike } from '../../backends/mysql/messaging.js'
export { MySqlInbox, type MySqlInboxOptions } from '../../backends/mysql/mysql-inbox.js'
export type { PgClientLike, PgPool, PgPoolClient, PgPoolLike, PgQueryable } from '../../backends/postgres/messaging.js'
export { PgInbox, type PgInboxOptions, payloadHash } from '../../backends/postgres/postgres-inbox.js'
export { SqliteInbox, type SqliteInboxOptions } from '../../backends/sqlite/sqlite-inbox.js'
export { InboxMismatchError } from '../message.js'
export type { Inbox, InboxBatchResult, InboxEvent, InboxFailure, InboxMessage, InboxOldestRecord, InboxResult } from './types.js'
