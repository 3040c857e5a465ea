/**
 * `PostgresStore`'s options checked and resolved to what the store keeps: names, layout, durations
 * in milliseconds, the isolation statements, and how to open the pool it owns.
 */
import { type Duration, parseDuration, parseTimerDuration } from '../../core/duration.js'
import { assertSqlTransactions } from '../../core/sql-transactions.js'
import { DEFAULT_ABANDONED_RETENTION_MS } from '../../core/store.js'
import { assertOptionalPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { assertDurability, type PostgresDurability } from './durability.js'
import type { PostgresStoreOptions, PostgresStoreTransactionsOption } from './options.js'
import { assertPartitionedName, type PostgresLayout } from './partitions.js'
import type { PgClientLike } from './pool.js'

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/
const ISOLATION_LEVELS = ['read committed', 'repeatable read', 'serializable']

export interface ResolvedPostgresOptions {
  schema: string
  table: string
  layout: PostgresLayout
  /** The interval a partitioned table `migrate()` creates gets. */
  intervalMs: number
  retentionMs: number
  prepared: boolean
  /** `query_timeout` of every statement sent on the pool. */
  queryTimeoutMs: number
  /** Opens the store's own transactions. */
  begin: string
  /**
   * The isolation asked for with `isolationLevel`, set as the first statement of a tool's transaction
   * (`undefined`: the option was not given, and the tool's transaction keeps its own level).
   */
  toolIsolation: string | undefined
  /** The pool to open when no `pool` was given (`synchronousCommit`: set on each of its sessions). */
  open: { connectionString: string; max: number; connectionTimeoutMs: number; synchronousCommit?: string } | undefined
  /** What to check before the first operation (`undefined`: nothing). */
  durability: PostgresDurability | undefined
}

/** Checks the options in the order their errors are reported and resolves them; throws `INVALID_OPTION`. */
export function resolveOptions<Client extends PgClientLike, Tx>(
  options: PostgresStoreOptions<Client> & PostgresStoreTransactionsOption<Tx>,
): ResolvedPostgresOptions {
  const schema = options?.schema ?? 'public'
  const table = options?.table ?? 'idemkey_records'
  for (const [name, value] of [
    ['schema', schema],
    ['table', table],
  ] as const) {
    if (typeof value !== 'string' || !IDENTIFIER.test(value)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `PostgresStore ${name} "${value}" must be a plain SQL identifier (letters, digits, underscore; up to 63).`,
      )
    }
  }
  if ((options?.pool === undefined) === (options?.connectionString === undefined)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'PostgresStore needs exactly one of { pool } (a pg.Pool) or { connectionString } (postgres://user:password@host:port/database).',
    )
  }
  assertOptionalPositiveInteger((options as { max?: unknown }).max, 'PostgresStore max (connections)')
  const layout = options.layout ?? 'plain'
  if (layout !== 'plain' && layout !== 'partitioned') {
    throw new IdempotencyError('INVALID_OPTION', `PostgresStore layout must be 'plain' or 'partitioned', got ${JSON.stringify(layout)}.`)
  }
  const intervalMs = parseDuration(options.partitionInterval ?? '1d', 'partitionInterval')
  if (layout === 'partitioned') {
    if (intervalMs <= 0) {
      // A table created so would carry an interval of 0, and every partition's bounds divide by it.
      throw new IdempotencyError(
        'INVALID_OPTION',
        `PostgresStore partitionInterval must be longer than 0 with layout 'partitioned' (e.g. '1d'), got ${JSON.stringify(options.partitionInterval)}.`,
      )
    }
    assertPartitionedName(table)
  }
  const retentionMs = parseDuration(options.abandonedRetention ?? DEFAULT_ABANDONED_RETENTION_MS, 'abandonedRetention')
  // On the partitioned layout every statement is planned when it runs: a plan cached while the
  // partition of now was new and nearly empty scans it whole once it has filled (a sequential scan
  // is the cheapest plan for a tiny table, and nothing replans until autovacuum analyzes it).
  const prepared = layout === 'plain' && (options.preparedStatements ?? true)
  const queryTimeoutMs = parseTimerDuration(options.queryTimeout ?? '10s', 'queryTimeout')
  const isolation = options.isolationLevel ?? 'read committed'
  if (!ISOLATION_LEVELS.includes(isolation)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `PostgresStore isolationLevel must be 'read committed', 'repeatable read' or 'serializable', got ${JSON.stringify(isolation)}.`,
    )
  }
  assertDurability(options.durability)
  if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'PostgresStore', 'postgres')
  return {
    schema,
    table,
    layout,
    intervalMs,
    retentionMs,
    prepared,
    queryTimeoutMs,
    begin: `BEGIN ISOLATION LEVEL ${isolation.toUpperCase()}`,
    toolIsolation: options.isolationLevel === undefined ? undefined : `SET TRANSACTION ISOLATION LEVEL ${isolation.toUpperCase()}`,
    open: options.pool
      ? undefined
      : {
          connectionString: options.connectionString as string,
          max: (options as { max?: number }).max ?? 10,
          connectionTimeoutMs: parseDuration((options as { connectionTimeout?: Duration }).connectionTimeout ?? '5s', 'connectionTimeout'),
          ...(options.durability ? { synchronousCommit: options.durability.synchronousCommit } : {}),
        },
    durability: options.durability,
  }
}
