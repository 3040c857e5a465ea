/**
 * `idemkey inspect --inboxes`: each consumer of an inbox table with its oldest kept ID, the real
 * start of its dedup window (docs/messaging.md, "Choosing the inbox retention"). The inboxes live in
 * the application's SQL database, the one `--store` names; their own classes read the oldest row.
 */

import { mysqlBesideTable, mysqlTableName } from '../../backends/mysql/messaging.js'
import { openNodeSqlite } from '../../backends/sqlite/driver.js'
import type { Inbox, InboxFailure } from '../../messaging/inbox/types.js'
import { besideTable, isMissingTable, quoteName } from '../../messaging/message.js'
import { age, renderTable } from '../output.js'
import { CliError } from '../run.js'
import { describeStore, driverError, type StoreSpec } from '../store-url.js'

/** The table the inboxes use unless told otherwise. */
export const DEFAULT_INBOX_TABLE = 'idemkey_inbox'

/** Failing messages shown per consumer at most. */
export const FAILING_SHOWN = 10

/** One consumer of the inbox table, its oldest kept ID (`null`s: it keeps none), and its failing messages. */
export interface InboxReportRow {
  consumer: string
  oldestMessageId: string | null
  oldestProcessedAtMs: number | null
  /** Messages with attempts recorded against `maxAttempts`, most first (at most {@link FAILING_SHOWN}). */
  failing: InboxFailure[]
}

/**
 * An inbox table opened for reading: its consumers (those with kept IDs, and those with attempts recorded
 * only: a consumer whose every message fails keeps no ID), an inbox per consumer, and how to close it.
 */
interface OpenedInboxTable {
  consumers(): Promise<string[]>
  inbox(consumer: string): Inbox<unknown>
  close(): Promise<void>
}

/** Reads every consumer of `table` in the database `spec` names, with its oldest kept ID. */
export async function readInboxes(spec: StoreSpec, table: string): Promise<InboxReportRow[]> {
  const opened = await openInboxTable(spec, table)
  try {
    const rows: InboxReportRow[] = []
    for (const consumer of await opened.consumers()) {
      const inbox = opened.inbox(consumer)
      const [oldest, failing] = await Promise.all([inbox.oldest?.(), inbox.failing?.(FAILING_SHOWN)])
      rows.push({
        consumer,
        oldestMessageId: oldest?.messageId ?? null,
        oldestProcessedAtMs: oldest?.processedAtMs ?? null,
        failing: failing ?? [],
      })
    }
    return rows
  } catch (error) {
    throw new CliError(`Could not read the inbox table "${table}" of ${describeStore(spec)}: ${(error as Error).message}`)
  } finally {
    await opened.close()
  }
}

/** The report as a table: consumer, oldest kept ID's time and age, its message ID. */
export function renderInboxes(rows: readonly InboxReportRow[], table: string, nowMs: number): string {
  if (rows.length === 0) return `inbox table "${table}": no consumer has kept an ID`
  const body = rows.map((row) =>
    row.oldestProcessedAtMs === null
      ? [row.consumer, '-', '-', '- (none kept)']
      : [row.consumer, new Date(row.oldestProcessedAtMs).toISOString(), age(row.oldestProcessedAtMs, nowMs), row.oldestMessageId ?? ''],
  )
  const kept = `inbox table "${table}": each consumer's oldest kept ID (its window reaches back this far)\n${renderTable(['CONSUMER', 'OLDEST', 'AGE', 'MESSAGE ID'], body)}`
  const failing = rows.flatMap((row) =>
    row.failing.map((f) => [
      row.consumer,
      String(f.attempts),
      new Date(f.lastAttemptAtMs).toISOString(),
      age(f.lastAttemptAtMs, nowMs),
      f.messageId,
    ]),
  )
  if (failing.length === 0) return `${kept}\nno message has attempts recorded (nothing failing)`
  return `${kept}\nmessages with attempts recorded against maxAttempts (failing, or delivered again and running; at most ${FAILING_SHOWN} per consumer, most first):\n${renderTable(['CONSUMER', 'ATTEMPTS', 'LAST', 'AGE', 'MESSAGE ID'], failing)}`
}

/**
 * Sorted, without repeats: the consumers of the inbox table and of its failures table (none when that
 * table is missing: an inbox not migrated since it came).
 */
async function union(kept: Promise<string[]>, failing: Promise<string[]>): Promise<string[]> {
  const lists = await Promise.all([
    kept,
    failing.catch((error: unknown) => {
      if (isMissingTable(error)) return []
      throw error
    }),
  ])
  return [...new Set(lists.flat())].sort()
}

async function openInboxTable(spec: StoreSpec, table: string): Promise<OpenedInboxTable> {
  switch (spec.kind) {
    case 'sqlite': {
      const { SqliteInbox } = await import('../../backends/sqlite/sqlite-inbox.js')
      const db = openNodeSqlite(spec.path, { readOnly: true })
      const name = quoteName(table, '--inbox-table')
      const failures = besideTable(table, 'failures', '--inbox-table')
      const consumersOf = async (from: string) =>
        (db.prepare(`SELECT DISTINCT consumer FROM ${from} ORDER BY consumer`).all() as Array<{ consumer: string }>).map((r) => r.consumer)
      return {
        consumers: () => union(consumersOf(name), consumersOf(failures)),
        inbox: (consumer) => new SqliteInbox({ database: db.database, consumer, table }),
        close: async () => db.close(),
      }
    }
    case 'postgres': {
      type PgModule = { Pool?: PgPoolConstructor; default?: { Pool: PgPoolConstructor } }
      const pg = await importDriver<PgModule>('postgres', 'pg', 'pg')
      const { PgInbox } = await import('../../backends/postgres/postgres-inbox.js')
      const Pool = (pg.Pool ?? pg.default?.Pool) as PgPoolConstructor
      const pool = new Pool({ connectionString: spec.url, max: 1 })
      const name = quoteName(table, '--inbox-table')
      const failures = besideTable(table, 'failures', '--inbox-table')
      return {
        // A loose index scan over the primary key (consumer, message_id): one probe per consumer, not a table
        // scan; the failures table holds failing messages only, a plain DISTINCT.
        consumers: () => {
          const kept = pool
            .query(
              `WITH RECURSIVE c AS (
                 (SELECT consumer FROM ${name} ORDER BY consumer LIMIT 1)
                 UNION ALL
                 SELECT (SELECT consumer FROM ${name} WHERE consumer > c.consumer ORDER BY consumer LIMIT 1) FROM c WHERE c.consumer IS NOT NULL)
               SELECT consumer FROM c WHERE consumer IS NOT NULL`,
            )
            .then((result) => result.rows.map((r) => String(r.consumer)))
          const failing = pool
            .query(`SELECT DISTINCT consumer FROM ${failures}`)
            .then((result) => result.rows.map((r) => String(r.consumer)))
          return union(kept, failing)
        },
        inbox: (consumer) => new PgInbox({ pool: pool as never, consumer, table }),
        close: () => pool.end(),
      }
    }
    case 'mysql': {
      type MySqlModule = { createPool?: (uri: string) => MySqlPoolLike; default?: { createPool: (uri: string) => MySqlPoolLike } }
      const mysql = await importDriver<MySqlModule>('mysql', 'mysql2', 'mysql2/promise')
      const { MySqlInbox } = await import('../../backends/mysql/mysql-inbox.js')
      const createPool = (mysql.createPool ?? mysql.default?.createPool) as (uri: string) => MySqlPoolLike
      const pool = createPool(spec.url)
      const name = mysqlTableName(table, '--inbox-table')
      const failures = mysqlBesideTable(name, 'failures')
      // DISTINCT on the primary key's first column: MySQL and MariaDB read it with a loose index scan.
      const consumersOf = async (from: string) => {
        const [rows] = await pool.query(`SELECT DISTINCT consumer FROM ${from} ORDER BY consumer`)
        return (rows as Array<{ consumer: Buffer | string }>).map((r) => String(r.consumer))
      }
      return {
        consumers: () => union(consumersOf(name.sql), consumersOf(failures)),
        inbox: (consumer) => new MySqlInbox({ pool: pool as never, consumer, table }),
        close: () => pool.end(),
      }
    }
    default:
      throw new CliError(
        `Inboxes live in SQL databases (SQLite, PostgreSQL, MySQL/MariaDB); ${describeStore(spec)} has none. Pass --store with the database your inbox writes to.`,
        2,
      )
  }
}

type PgPoolConstructor = new (options: { connectionString: string; max: number }) => PgPoolLike

interface PgPoolLike {
  query(sql: string): Promise<{ rows: Array<Record<string, unknown>> }>
  end(): Promise<void>
}

interface MySqlPoolLike {
  query(sql: string): Promise<[unknown, unknown]>
  end(): Promise<void>
}

/** Loads a database driver by a computed name (the CLI runs without the optional ones), naming a missing one. */
async function importDriver<T>(kind: string, driver: string, specifier: string): Promise<T> {
  try {
    return (await import(specifier)) as T
  } catch (error) {
    throw driverError(kind, driver, error)
  }
}
