/**
 * An inbox refuses a retention of 0 when made: it forgot each processed ID at the next purge, so a
 * copy the broker redelivered later was applied a second time. And an `onEvent` (or SQLite's `now`)
 * that is no function, which failed the first message instead.
 */
import Database from 'better-sqlite3'
import { describe, expect, it } from 'vitest'
import { MySqlInbox } from '../src/backends/mysql/mysql-inbox.js'
import { PgInbox } from '../src/backends/postgres/postgres-inbox.js'
import { SqliteInbox } from '../src/backends/sqlite/sqlite-inbox.js'

const invalid = (message: string) => expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(message) })
/** Never used: every case is refused, or made and dropped, before a query. */
const pool = { connect: async () => ({}), query: async () => [], execute: async () => [], getConnection: async () => ({}) } as never

describe('inbox options', () => {
  it('PgInbox, MySqlInbox and SqliteInbox refuse a retention of 0 and an onEvent that is no function', () => {
    const makers: Array<[string, (options: Record<string, unknown>) => unknown]> = [
      ['PgInbox', (options) => new PgInbox({ pool, consumer: 'billing', ...options })],
      ['MySqlInbox', (options) => new MySqlInbox({ pool, consumer: 'billing', ...options })],
      ['SqliteInbox', (options) => new SqliteInbox({ database: new Database(':memory:'), consumer: 'billing', ...options })],
    ]
    for (const [name, make] of makers) {
      expect(() => make({}), name).not.toThrow()
      expect(() => make({ retention: 0 }), name).toThrow(invalid('retention must be longer than 0, got 0ms.'))
      expect(() => make({ retention: '0s' }), name).toThrow(invalid('retention must be longer than 0'))
      expect(() => make({ onEvent: 'log' }), name).toThrow(invalid(`${name}: onEvent must be a function`))
    }
    // A table that is no string (a number from a config file) crashed with a TypeError in the name check.
    expect(() => new PgInbox({ pool, consumer: 'c', table: 5 as never })).toThrow(
      invalid('PgInbox table "5" must be a plain SQL identifier'),
    )
    expect(() => new SqliteInbox({ database: new Database(':memory:'), consumer: 'c', now: 5 as never })).toThrow(
      invalid('SqliteInbox: now must be a function'),
    )
  })
})
