/**
 * `idemkey/inbox`: apply each message once, however often the broker delivers it (docs/messaging.md).
 * The broker consumer helpers live in `idemkey/publishers/<broker>`.
 *
 * @example
 * import { PgInbox } from 'idemkey/inbox'
 * const inbox = new PgInbox({ pool, consumer: 'billing' })
 */
export { InboxMismatchError } from '../message.js'
export type { PgPool, PgPoolClient, PgQueryable } from '../pg.js'
export { PgInbox, type PgInboxOptions, payloadHash } from './pg-inbox.js'
export { SqliteInbox, type SqliteInboxOptions } from './sqlite-inbox.js'
export type { Inbox, InboxBatchResult, InboxEvent, InboxMessage, InboxResult } from './types.js'
