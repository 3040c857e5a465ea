/**
 * kyselyTransactions with a Kysely built from another copy of kysely than the one idemkey imports: here
 * kysely's CommonJS build beside its ESM one (an ESM app whose Kysely comes from CommonJS code), whose
 * classes are not the same objects. The dialect is told by what the adapter supports, not by
 * `instanceof`, and a transaction runs through it against the real PostgreSQL.
 */
import { randomUUID } from 'node:crypto'
import { createRequire } from 'node:module'
import * as esm from 'kysely'
import mysql from 'mysql2'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { kyselyTransactions } from '../src/orm/kysely/index.js'
import { PG_URL } from './fixtures/messaging/pg.js'
import { MYSQL_URL } from './fixtures/messaging/sql.js'
import { serviceSkipReason } from './helpers/services.js'

const cjs = createRequire(import.meta.url)('kysely') as typeof esm
const pgSkip = await serviceSkipReason('PostgreSQL', 5432)

describe('kyselyTransactions with a Kysely from another copy of kysely (CommonJS beside ESM)', () => {
  it('is another copy: its adapters are not instances of the classes idemkey imports', () => {
    expect(cjs.PostgresAdapter).not.toBe(esm.PostgresAdapter)
    expect(new cjs.PostgresAdapter()).not.toBeInstanceOf(esm.PostgresAdapter)
  })

  it('tells PostgreSQL and MySQL apart, and refuses a dialect it cannot serve with what to pass', async () => {
    const onPg = new cjs.Kysely<unknown>({ dialect: new cjs.PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL }) }) })
    const onMysql = new cjs.Kysely<unknown>({ dialect: new cjs.MysqlDialect({ pool: mysql.createPool({ uri: MYSQL_URL }) }) })
    try {
      expect(kyselyTransactions(onPg).dialect).toBe('postgres')
      expect(kyselyTransactions(onMysql).dialect).toBe('mysql')
    } finally {
      await onPg.destroy()
      await onMysql.destroy()
    }
    const onSqlite = new cjs.Kysely<unknown>({
      dialect: new cjs.SqliteDialect({ database: { close() {}, prepare: () => ({}) as never } as never }),
    })
    expect(() => kyselyTransactions(onSqlite)).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining("{ dialect: 'postgres' }") }),
    )
  })

  it.skipIf(pgSkip !== undefined)('runs the work in that Kysely’s transaction, with the record', async () => {
    const table = `kysely_copies_${randomUUID().replaceAll('-', '').slice(0, 12)}`
    const pool = new pg.Pool({ connectionString: PG_URL })
    const db = new cjs.Kysely<Record<string, { id: string }>>({ dialect: new cjs.PostgresDialect({ pool }) })
    const store = new PostgresStore({ pool, table: `${table}_records`, transactions: kyselyTransactions(db) })
    try {
      await pool.query(`CREATE TABLE ${table} (id text PRIMARY KEY)`)
      await store.migrate()
      const ledger = new Ledger({ store })
      const key = randomUUID()
      const run = () =>
        ledger.runInTransaction({ key, payload: { id: key } }, async ({ tx }) => {
          await tx.insertInto(table).values({ id: key }).execute()
          return { id: key }
        })
      expect((await run()).kind).toBe('executed')
      expect((await run()).kind).toBe('replayed')
      expect((await pool.query(`SELECT id FROM ${table}`)).rows).toEqual([{ id: key }])
    } finally {
      await store.close()
      await pool.query(`DROP TABLE IF EXISTS ${table}, ${table}_records`)
      await db.destroy()
    }
  })
})
