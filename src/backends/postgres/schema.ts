import { IdempotencyError } from '../../errors.js'
import { holding } from './connect.js'
import { intervalOf, layoutComment, type PostgresLayout, partitionedTableDdl } from './partitions.js'
import type { PgClientLike, PgPoolLike } from './pool.js'
import { toStoreError } from './postgres-errors.js'
import { ALL_COLUMNS, qualified, RECORD_COLUMNS_V1 } from './statements.js'

/**
 * The schema version this release writes, kept in the table's comment (`idemkey schema 1: …`).
 *
 * @example SELECT obj_description('idemkey_records'::regclass) -- 'idemkey schema 1: …'
 */
export const SCHEMA_VERSION = 2

const VERSION_COMMENT = /^idemkey schema (\d+)/

/**
 * Each entry upgrades the schema by one version; index 0 creates version 1.
 *
 * - scope and key are `text COLLATE "C"`: byte-wise equality and ordering, the fastest comparison,
 *   and `k` and `k ` stay two keys. Any scope text round-trips (PostgreSQL text holds every
 *   character except NUL, which scopes and keys cannot contain).
 * - Times are integer epoch milliseconds of the server's clock (`clock_timestamp()`), like every
 *   other store: no time zones, and the ledger gets the numbers it compares.
 * - The primary key makes acquire one index lookup at any table size; `expires_at` makes purge a
 *   range scan; the partial index on in-progress rows keeps "how many are running, how many are
 *   stuck" cheap to ask however many completed rows there are.
 * - `waiters` is set by a process that waits for the record, so that its completion sends a NOTIFY;
 *   completions nobody waits for send none (each NOTIFY serializes commits database-wide).
 * - A plain (logged) table: an UNLOGGED one is emptied by a crash, and replays would run twice.
 */
const MIGRATIONS: Array<(schema: string, table: string) => string[]> = [
  (schema, table) => {
    const t = qualified(schema, table)
    return [
      `CREATE TABLE IF NOT EXISTS ${t} (
        ${RECORD_COLUMNS_V1},
        CONSTRAINT "${table}_pkey" PRIMARY KEY (scope, "key")
      )`,
      `CREATE INDEX IF NOT EXISTS "${table}_expires_at" ON ${t} (expires_at)`,
      `CREATE INDEX IF NOT EXISTS "${table}_in_progress" ON ${t} (locked_until) WHERE status = 'in_progress'`,
    ]
  },
  // Version 2: durable steps (docs/steps.md), one jsonb object per record. Adding a nullable column
  // without a default rewrites nothing: existing rows, in progress or not, keep working in place.
  (schema, table) => [`ALTER TABLE ${qualified(schema, table)} ADD COLUMN IF NOT EXISTS steps jsonb NULL`],
]

/** The plain table at the current schema version: every migration in turn. */
export function plainTableDdl(schema: string, table: string): string[] {
  return MIGRATIONS.flatMap((migration) => migration(schema, table))
}

/** The layout the store expects: plain, or partitioned with the interval a new table gets. */
export interface LayoutChoice {
  layout: PostgresLayout
  intervalMs: number
}

/**
 * Creates or upgrades the schema, idempotently, in one transaction. A transaction-scoped advisory
 * lock makes processes that migrate at the same time take turns (concurrent `CREATE TABLE IF NOT
 * EXISTS` can otherwise fail). Then checks that the table has the columns the store reads, is
 * not UNLOGGED, and has the layout the store was given (converting one is `convertLayout`, never
 * implicit: it rewrites every row under an exclusive lock).
 */
export async function migrate(pool: PgPoolLike, schema: string, table: string, choice: LayoutChoice): Promise<void> {
  let client: PgClientLike
  try {
    client = await pool.connect()
  } catch (error) {
    throw toStoreError('migrate', error, schema, table)
  }
  const t = qualified(schema, table)
  // A connection whose rollback failed is in an unknown state, a lost one is gone: holding() destroys either.
  await holding(client, async (held) => {
    try {
      await client.query('BEGIN')
      await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`idemkey:migrate:${schema}.${table}`])
      if (schema !== 'public') await client.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`)
      const found = await client.query(
        `SELECT c.relpersistence AS persistence, c.relkind AS kind, obj_description(c.oid, 'pg_class') AS comment
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
        [schema, table],
      )
      const existing = found.rows[0] as { persistence: string; kind: string; comment: string | null } | undefined
      const layout: PostgresLayout = existing ? (existing.kind === 'p' ? 'partitioned' : 'plain') : choice.layout
      if (layout !== choice.layout) {
        throw new IdempotencyError(
          'STORE_SCHEMA',
          `postgres: table ${t} has the ${layout} layout, and the store was given layout '${choice.layout}'. Convert it with \`idemkey migrate --store … --layout ${choice.layout}\` (or store.convertLayout(), which rewrites every row under an exclusive lock), or give the store layout '${layout}'.`,
        )
      }
      let current = existing ? Number(VERSION_COMMENT.exec(existing.comment ?? '')?.[1] ?? 1) : 0
      if (!existing && layout === 'partitioned') {
        // A new partitioned table is created at the current version (its first partitions come with
        // the store's rotation, or an insert's on-demand creation).
        for (const sql of partitionedTableDdl(schema, table)) await client.query(sql)
        current = SCHEMA_VERSION
        await client.query(`COMMENT ON TABLE ${t} IS '${layoutComment(SCHEMA_VERSION, layout, choice.intervalMs)}'`)
      }
      if (current > SCHEMA_VERSION) {
        throw new IdempotencyError(
          'STORE_SCHEMA',
          `postgres: table ${t} has idemkey schema version ${current}, newer than this idemkey understands (${SCHEMA_VERSION}). Upgrade idemkey, or point it at another table.`,
        )
      }
      for (let version = current; version < SCHEMA_VERSION; version++) {
        for (const sql of (MIGRATIONS[version] as (schema: string, table: string) => string[])(schema, table)) await client.query(sql)
      }
      // Only the owner may comment; an app user with row grants on an up-to-date table never needs to.
      // A partitioned table keeps the interval it was made with (its partitions have that length).
      if (current < SCHEMA_VERSION) {
        const intervalMs = layout === 'partitioned' ? (intervalOf(existing?.comment ?? null) ?? choice.intervalMs) : 0
        await client.query(`COMMENT ON TABLE ${t} IS '${layoutComment(SCHEMA_VERSION, layout, intervalMs)}'`)
      }
      // A table that was there before (current = 1 without a comment) may be someone else's: check its shape.
      await client.query(`SELECT ${ALL_COLUMNS} FROM ${t} LIMIT 0`)
      if (existing?.persistence === 'u') {
        throw new IdempotencyError(
          'STORE_SCHEMA',
          `postgres: table ${t} is UNLOGGED, so a server crash empties it and finished operations would run again. Run ALTER TABLE ${t} SET LOGGED.`,
        )
      }
      await client.query('COMMIT')
    } catch (error) {
      await client.query('ROLLBACK').catch(held.discard)
      throw toStoreError('migrate', error, schema, table)
    }
  })
}
