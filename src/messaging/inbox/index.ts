/**
 * `idemkey/inbox`: apply each message once, however often the broker delivers it (docs/messaging.md).
 * The broker consumer helpers live in `idemkey/publishers/<broker>`.
 *
 * @example
 * import { MySqlInbox, PgInbox } from 'idemkey/inbox'
 * const inbox = new PgInbox({ pool, consumer: 'billing' }) // or new MySqlInbox({ pool, consumer }) on mysql2
 */
export { InboxMismatchError } from '../message.js'
export type { MySqlConnectionLike, MySqlPoolLike } from '../mysql.js'
export type { PgClientLike, PgPool, PgPoolClient, PgPoolLike, PgQueryable } from '../pg.js'
export { MySqlInbox, type MySqlInboxOptions } from './mysql-inbox.js'
export { PgInbox, type PgInboxOptions, payloadHash } from './pg-inbox.js'
export { SqliteInbox, type SqliteInboxOptions } from './sqlite-inbox.js'
export type { Inbox, InboxBatchResult, InboxEvent, InboxFailure, InboxMessage, InboxOldestRecord, InboxResult } from './types.js'
