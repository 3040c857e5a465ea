/**
 * Store options of the wrong shape are refused when the store is made (`INVALID_OPTION`), before it
 * connects: a pool of 0 or "x" connections, a table name that is no string (it passed the identifier
 * check as "NaN" and crashed later), a clock without `sleep()` and `timer()`.
 */
import { describe, expect, it } from 'vitest'
import { MemoryStore } from '../src/backends/memory/index.js'
import { MySqlStore } from '../src/backends/mysql/index.js'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { SqliteStore } from '../src/backends/sqlite/index.js'

const invalid = (message: string) => expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(message) })

describe('store options', () => {
  it('PostgresStore refuses a pool size that is no positive integer and a table or schema that is no string', () => {
    const connectionString = 'postgres://app@127.0.0.1:1/app'
    for (const max of [0, -1, 1.5, '10', Number.NaN]) {
      expect(() => new PostgresStore({ connectionString, max: max as number }), String(max)).toThrow(
        invalid('PostgresStore max (connections) must be a positive integer'),
      )
    }
    expect(() => new PostgresStore({ connectionString, table: Number.NaN as never })).toThrow(invalid('must be a plain SQL identifier'))
    expect(() => new PostgresStore({ connectionString, schema: 7 as never })).toThrow(invalid('must be a plain SQL identifier'))
  })

  it('MySqlStore refuses a connectionLimit that is no positive integer and a table that is no string', () => {
    const uri = 'mysql://root@127.0.0.1:1/app'
    expect(() => new MySqlStore({ uri, connectionLimit: 0 })).toThrow(
      invalid('MySqlStore connectionLimit must be a positive integer, got 0.'),
    )
    expect(() => new MySqlStore({ uri, connectionLimit: 'ten' as never })).toThrow(invalid('got "ten"'))
    expect(() => new MySqlStore({ uri, table: Number.NaN as never })).toThrow(invalid('must be a plain SQL identifier'))
  })

  it('SqliteStore and MemoryStore refuse a clock without now(), sleep() and timer()', () => {
    expect(() => new SqliteStore({ path: ':memory:', clock: { now: () => 0 } as never })).toThrow(
      invalid('new SqliteStore(): clock must be an object with now(), sleep(), timer(); it has no sleep(), timer().'),
    )
    expect(() => new MemoryStore({ clock: Date.now as never })).toThrow(
      invalid('new MemoryStore(): clock must be an object with now(), sleep(), timer()'),
    )
  })
})
