import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Database from 'better-sqlite3'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { MySqlInbox, PgInbox, SqliteInbox } from '../../src/messaging/inbox/index.js'
import { MYSQL_URL, PG_URL } from './orm-tools.js'
import { serviceSkipReason } from './services.js'

/** Every inbox idemkey ships. */
export type AnyInbox = PgInbox | MySqlInbox | SqliteInbox

/** One database the inboxes run on, shared by a test file. */
export interface InboxDatabase {
  /** An inbox on the shared database: `consumer`, `table`, and a retention in ms. */
  inbox(consumer: string, table: string, retentionMs?: number): AnyInbox
  /** Drops every table whose name starts with `prefix`. */
  drop(prefix: string): Promise<void>
  close(): Promise<void>
}

/**
 * Opens each inbox's database (PostgreSQL, MySQL/MariaDB, SQLite in a temporary file), or the reason to
 * skip it, so a test file runs one suite per inbox. `connections` is the pool size of the servers; the
 * SQLite inboxes alternate between two connections to one file (two processes of a consumer).
 */
export const inboxDatabases = (connections = 4): Record<string, () => Promise<InboxDatabase | string>> => ({
  async postgres() {
    const skip = await serviceSkipReason('PostgreSQL', 5432)
    if (skip) return skip
    const pool = new pg.Pool({ connectionString: PG_URL, max: connections })
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
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: connections })
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
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-inbox-'))
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
})
