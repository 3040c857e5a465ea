/**
 * The inboxes' record of failed attempts (`recordFailure`, `forgetFailures`), which the consumer helpers
 * count `maxAttempts` with: shared by every process of a consumer and kept across restarts, one count per
 * consumer and message, forgotten on demand and by `purge()`. Against the real databases.
 */

import { randomUUID } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Database from 'better-sqlite3'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { MySqlInbox, PgInbox, SqliteInbox } from '../src/messaging/inbox/index.js'
import type { InboxMessage } from '../src/messaging/inbox/types.js'
import { MYSQL_URL, PG_URL } from './helpers/orm-tools.js'
import { serviceSkipReason } from './helpers/services.js'

interface FailureInbox {
  migrate(): Promise<void> | void
  recordFailure(message: InboxMessage): Promise<number>
  forgetFailures(messageId: string): Promise<void>
  failing(limit?: number): Promise<Array<{ messageId: string; attempts: number; lastAttemptAtMs: number }>>
  purge(): Promise<number> | number
}

interface Database_ {
  /** An inbox on the shared database: `consumer`, `table`, and a retention in ms. */
  inbox(consumer: string, table: string, retentionMs?: number): FailureInbox
  /** Drops every table whose name starts with `prefix`. */
  drop(prefix: string): Promise<void>
  close(): Promise<void>
}

const databases: Record<string, () => Promise<Database_ | string>> = {
  async postgres() {
    const skip = await serviceSkipReason('PostgreSQL', 5432)
    if (skip) return skip
    const pool = new pg.Pool({ connectionString: PG_URL, max: 4 })
    return {
      inbox: (consumer, table, retentionMs) => new PgInbox({ pool, consumer, table, retention: retentionMs ?? '7d' }),
      drop: async (prefix) => {
        const { rows } = await pool.query(
          `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)`,
          [prefix],
        )
        for (const { tablename } of rows) await pool.query(`DROP TABLE IF EXISTS "${tablename}"`)
      },
      close: () => pool.end(),
    }
  },
  async mysql() {
    const skip = await serviceSkipReason('MariaDB/MySQL', 3306)
    if (skip) return skip
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 })
    return {
      inbox: (consumer, table, retentionMs) => new MySqlInbox({ pool, consumer, table, retention: retentionMs ?? '7d' }),
      drop: async (prefix) => {
        const [rows] = await pool.query(
          'SELECT table_name AS name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?',
          [`${prefix}%`],
        )
        for (const { name } of rows as Array<{ name: string }>) await pool.query(`DROP TABLE IF EXISTS \`${name}\``)
      },
      close: () => pool.end(),
    }
  },
  async sqlite() {
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-inbox-failures-'))
    const database = new Database(join(dir, 'inbox.db'))
    database.pragma('journal_mode = WAL')
    // A second connection to the same file: another process of the consumer.
    const other = new Database(join(dir, 'inbox.db'))
    let turn = 0
    return {
      inbox: (consumer, table, retentionMs) =>
        new SqliteInbox({ database: turn++ % 2 === 0 ? database : other, consumer, table, retention: retentionMs ?? '7d' }),
      drop: async () => {},
      close: async () => {
        database.close()
        other.close()
        rmSync(dir, { recursive: true, force: true })
      },
    }
  },
}

const message = (id: string): InboxMessage => ({ id, payload: 'x' })

for (const [name, open] of Object.entries(databases)) {
  const opened = await open()
  describe.skipIf(typeof opened === 'string')(`${name} inbox: failed attempts, for maxAttempts`, () => {
    const db = opened as Database_
    const table = `idemkey_inbox_failures_${randomUUID().slice(0, 8)}`
    afterAll(async () => {
      await db.drop(table)
      await db.close()
    })

    it('migrates the failures table beside the inbox, idempotently', async () => {
      await db.inbox('c', table).migrate()
      await db.inbox('c', table).migrate()
    })

    it("counts one consumer's failures of a message across its processes, apart from other consumers and messages", async () => {
      const [first, second] = [db.inbox('billing', table), db.inbox('billing', table)]
      expect(await first.recordFailure(message('m1'))).toBe(1)
      expect(await second.recordFailure(message('m1'))).toBe(2)
      expect(await first.recordFailure(message('m1'))).toBe(3)
      expect(await db.inbox('shipping', table).recordFailure(message('m1'))).toBe(1)
      expect(await first.recordFailure(message('m2'))).toBe(1)
    })

    it('counts every concurrent failure once', async () => {
      const [first, second] = [db.inbox('busy', table), db.inbox('busy', table)]
      const counts = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? first : second).recordFailure(message('hot'))))
      expect(await first.recordFailure(message('hot'))).toBe(21)
      // Each count is one statement: concurrent callers each see their own.
      expect([...counts].sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1))
    })

    it("forgets a message's failures on demand: moved back after it was given up on, it starts afresh", async () => {
      const inbox = db.inbox('forget', table)
      await inbox.recordFailure(message('f1'))
      await inbox.recordFailure(message('f1'))
      await inbox.recordFailure(message('f2'))
      await inbox.forgetFailures('f1')
      expect(await inbox.recordFailure(message('f1'))).toBe(1)
      expect(await inbox.recordFailure(message('f2'))).toBe(2)
    })

    it('purges failures last recorded longer ago than the retention', async () => {
      const inbox = db.inbox('purged', table, 50)
      await inbox.recordFailure(message('old'))
      await new Promise((resolve) => setTimeout(resolve, 200))
      await inbox.recordFailure(message('fresh'))
      await inbox.purge()
      expect(await inbox.recordFailure(message('old'))).toBe(1)
      expect(await inbox.recordFailure(message('fresh'))).toBe(2)
    })

    it('names the failures table within the identifier limit for the longest inbox table name', async () => {
      // 59 characters, the longest MySqlInbox takes: "<table>_failures" would be 68, past MySQL's 64 and PostgreSQL's 63.
      const long = `${table}_${'x'.repeat(59 - table.length - 1)}`
      expect(long).toHaveLength(59)
      const inbox = db.inbox('c', long)
      await inbox.migrate()
      expect(await inbox.recordFailure(message('m'))).toBe(1)
      expect(await db.inbox('c', long).recordFailure(message('m'))).toBe(2)
    })

    it("lists a consumer's failing messages, most attempts first, then the latest, within a limit; none once forgotten", async () => {
      const inbox = db.inbox('listed', table)
      const before = Date.now()
      for (const id of ['once', 'thrice', 'twice', 'thrice', 'twice', 'thrice', 'once-later']) {
        await inbox.recordFailure(message(id))
        await new Promise((resolve) => setTimeout(resolve, 5))
      }
      await db.inbox('other', table).recordFailure(message('elsewhere'))
      const failing = await inbox.failing()
      expect(failing.map((f) => [f.messageId, f.attempts])).toEqual([
        ['thrice', 3],
        ['twice', 2],
        ['once-later', 1],
        ['once', 1],
      ])
      for (const f of failing) {
        expect(f.lastAttemptAtMs).toBeGreaterThanOrEqual(before - 1_000)
        expect(f.lastAttemptAtMs).toBeLessThanOrEqual(Date.now() + 1_000)
      }
      expect((await inbox.failing(2)).map((f) => f.messageId)).toEqual(['thrice', 'twice'])
      await inbox.forgetFailures('thrice')
      expect((await inbox.failing(1)).map((f) => f.messageId)).toEqual(['twice'])
      await expect(inbox.failing(0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
      // An inbox not migrated since the failures table came has none recorded.
      expect(await db.inbox('c', `${table}_none`).failing()).toEqual([])
    })

    it('refuses to count on an inbox not migrated since, naming migrate()', async () => {
      const unmigrated = `${table}_none`
      await expect(db.inbox('c', unmigrated).recordFailure(message('m'))).rejects.toMatchObject({
        message: expect.stringMatching(/migrate\(\)/),
      })
    })
  })
}
