/**
 * The seam between a SQL store and the user's own data layer (docs/orm.md): how to open a transaction
 * with the tool the application already writes through (Prisma, Drizzle, Kysely, TypeORM, Knex,
 * Sequelize, postgres.js, …), and how to run one of the store's statements inside it. With it,
 * `ledger.runInTransaction` hands the work the tool's own transaction object, and the record's
 * completion commits with the work's writes, or rolls back with them.
 *
 * One small adapter per tool implements it (`idemkey/drizzle`, `idemkey/kysely`, …); anything else can
 * implement it in a few lines.
 */
import { IdempotencyError } from '../errors.js'
import type { SavepointCommand } from './store.js'

/** A value the store binds to a statement's placeholder. */
export type SqlValue = string | number | boolean | null | Buffer

/** What one statement answered. */
export interface SqlOutcome {
  /**
   * The rows the statement returned when it returns rows (every PostgreSQL statement the store sends
   * through a tool does), else the rows it changed (MySQL `affectedRows`).
   */
  count: number
}

/**
 * Transactions of the user's data layer, for `PostgresStore` and `MySqlStore`'s `transactions` option.
 *
 * @example
 * import { drizzleTransactions } from 'idemkey/drizzle'
 * const store = new PostgresStore({ pool, transactions: drizzleTransactions(db) })
 * await new Ledger({ store }).runInTransaction({ key, payload }, async ({ tx }) => tx.insert(orders).values(order))
 */
export interface SqlTransactions<Tx> {
  /** The tool, for messages (`'drizzle'`). */
  readonly tool: string
  /**
   * The SQL the store sends: `'postgres'` statements number their placeholders (`$1`, `$2`, a number
   * may repeat), `'mysql'` statements use `?` in order.
   */
  readonly dialect: 'postgres' | 'mysql'
  /** Runs `fn` in one of the tool's transactions: commits when it resolves, rolls back when it throws. */
  transaction<R>(fn: (tx: Tx) => Promise<R>): Promise<R>
  /**
   * Runs one of the store's statements inside `tx`, with its values bound to its placeholders. An
   * adapter that can have its tool prepare the statement (name it, so it is parsed and planned once per
   * connection) does so unless `options.prepare` is `false`: the store's `preparedStatements: false`
   * (behind a pooler that cannot keep them) and its partitioned layout ask for unnamed statements.
   */
  execute(tx: Tx, sql: string, values: readonly SqlValue[], options?: SqlExecuteOptions): Promise<SqlOutcome>
  /**
   * The node-postgres client under `tx`, when the tool runs on one and lets it be reached. The store
   * then sends its statements to it as named prepared statements (parsed and planned once per
   * connection, as on the raw path) instead of through `execute`. Optional.
   */
  pgClient?(tx: Tx): PgClientOfTool | undefined
}

/** Options of {@link SqlTransactions.execute}. */
export interface SqlExecuteOptions {
  /** Whether the statement may be prepared under a name on the tool's connection. @default true */
  prepare?: boolean
}

/** What {@link SqlTransactions.pgClient} answers: a node-postgres `Client`/`PoolClient` inside the transaction. */
export interface PgClientOfTool {
  query(config: { name?: string; text: string; values?: unknown[] }): Promise<{ rows: unknown[]; rowCount: number | null }>
}

/**
 * `candidate` when it is a node-postgres client (a `pg.Client` or a pool's client: it has
 * `connectionParameters` and `query`), else `undefined`. Adapters use it to find the client a tool
 * keeps under its transaction object.
 */
export function asPgClient(candidate: unknown): PgClientOfTool | undefined {
  const client = candidate as { query?: unknown; connectionParameters?: unknown } | null | undefined
  return client && typeof client.query === 'function' && typeof client.connectionParameters === 'object'
    ? (client as PgClientOfTool)
    : undefined
}

/**
 * The savepoint `runInTransaction` takes around the work (the same SQL on PostgreSQL, MySQL/MariaDB and
 * SQLite): a final failure the work returns is rolled back to it before the record's completion is
 * written in the same transaction (`RunOptions.failedWrites`).
 */
export const WORK_SAVEPOINT: Readonly<Record<SavepointCommand, string>> = {
  set: 'SAVEPOINT idemkey_work',
  rollback: 'ROLLBACK TO SAVEPOINT idemkey_work',
}

/** A quoted literal or identifier (left alone), or a `$n` placeholder. */
const PLACEHOLDER = /('(?:[^']|'')*'|"(?:[^"]|"")*")|\$(\d+)/g

/**
 * `$n` placeholders to `?` in order, for tools that bind only positional `?` (Knex, Sequelize's
 * replacements): a number used twice is bound twice. Quoted text (`'…'`, `"…"`) is left alone.
 *
 * @example positional('SELECT $1::text, $2, $1', ['a', 'b']) // { sql: 'SELECT ?::text, ?, ?', values: ['a', 'b', 'a'] }
 */
export function positional(sql: string, values: readonly SqlValue[]): { sql: string; values: SqlValue[] } {
  const out: SqlValue[] = []
  const text = sql.replace(PLACEHOLDER, (match, quoted: string | undefined, n: string | undefined) => {
    if (quoted !== undefined) return match
    const index = Number(n) - 1
    if (!(index in values)) throw new RangeError(`idemkey: statement uses $${n} but has ${values.length} values`)
    out.push(values[index] as SqlValue)
    return '?'
  })
  return { sql: text, values: out }
}

/**
 * Splits a `$n` statement into its text pieces and the value of each placeholder, for tools that build
 * SQL from fragments (Drizzle's `sql`): `strings[i]` comes before `params[i]`, and the last string after.
 */
export function fragments(sql: string, values: readonly SqlValue[]): { strings: string[]; params: SqlValue[] } {
  const strings: string[] = []
  const params: SqlValue[] = []
  let last = 0
  for (const match of sql.matchAll(PLACEHOLDER)) {
    if (match[1] !== undefined) continue
    const index = Number(match[2]) - 1
    if (!(index in values)) throw new RangeError(`idemkey: statement uses $${match[2]} but has ${values.length} values`)
    strings.push(sql.slice(last, match.index))
    params.push(values[index] as SqlValue)
    last = match.index + match[0].length
  }
  strings.push(sql.slice(last))
  return { strings, params }
}

/** Validates a `transactions` option at construction, with a message that names what is missing. */
export function assertSqlTransactions(value: unknown, store: string, dialect: 'postgres' | 'mysql'): void {
  const candidate = value as Partial<SqlTransactions<unknown>> | null
  if (
    !candidate ||
    typeof candidate.transaction !== 'function' ||
    typeof candidate.execute !== 'function' ||
    typeof candidate.tool !== 'string'
  ) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${store} transactions must come from an adapter such as drizzleTransactions(db) from 'idemkey/drizzle' (an object with tool, dialect, transaction() and execute()).`,
    )
  }
  if (candidate.dialect !== dialect) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${store} transactions are for ${String(candidate.dialect)} (${candidate.tool}), but this store is ${dialect}: pass an adapter made from a ${dialect} connection of ${candidate.tool}.`,
    )
  }
}
