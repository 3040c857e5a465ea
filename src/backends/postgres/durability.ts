/**
 * The `durability` option: what a completion must wait for before PostgreSQL acknowledges it, and the
 * check, at the store's first use, that the session and the server give it (docs/postgres.md,
 * "Replication and failover").
 */
import { IdempotencyError } from '../../errors.js'
import type { PgQueryable } from './pool.js'

/**
 * What a commit waits for, weakest to strongest, as PostgreSQL's `synchronous_commit` names it. With
 * `'on'` (flushed on a synchronous standby) or `'remote_apply'` (also replayed there, so visible to its
 * readers) an acknowledged record survives the loss of the primary and a promotion of that standby;
 * `'remote_write'` survives it unless the standby's machine fails at the same moment.
 */
export type SynchronousCommit = 'remote_write' | 'on' | 'remote_apply'

/**
 * The `durability` option of `PostgresStore`: completions acknowledged only once a synchronous standby
 * has them. The store's own pool (`connectionString`) sets `synchronous_commit` on each session; with
 * your pool, set it on the role (`ALTER ROLE app SET synchronous_commit = 'remote_apply'`) or in the
 * pool's `options`. Either way the store checks, before its first operation, the session's
 * `synchronous_commit`, the server's `synchronous_standby_names`, and that a standby streams as
 * synchronous (`pg_stat_replication.sync_state`), and refuses or warns as `onMismatch` says.
 *
 * @example new PostgresStore({ connectionString, durability: { synchronousCommit: 'remote_apply' } })
 */
export interface PostgresDurability {
  /** What a commit waits for. */
  synchronousCommit: SynchronousCommit
  /**
   * When the check finds less than asked: `'refuse'` fails every operation with
   * {@link PostgresDurabilityError} (`STORE_UNAVAILABLE`) and checks again at the next one, so a store
   * that started while its standby was away serves once it is back; `'warn'` calls `warn` once and
   * serves. @default 'refuse'
   */
  onMismatch?: 'refuse' | 'warn'
  /** Where a `'warn'` goes. @default console.warn */
  warn?: (message: string, error: PostgresDurabilityError) => void
}

/** One setting found short of what `durability` asks, and the change that closes it. */
export interface DurabilityProblem {
  /** The setting: `synchronous_commit`, `synchronous_standby_names`, `pg_stat_replication.sync_state`, or the role's membership of `pg_monitor`. */
  setting: string
  /** What the check read. */
  found: string
  /** What it needs. */
  wanted: string
  /** The change to make, in words a DBA can run. */
  fix: string
}

/**
 * The session or the server cannot give what the store's `durability` option asks: an acknowledged
 * completion could be lost if the primary fails. `problems` names each setting and its fix.
 *
 * @example
 * catch (error) { if (error instanceof PostgresDurabilityError) log.fatal(error.problems) }
 */
export class PostgresDurabilityError extends IdempotencyError {
  readonly problems: readonly DurabilityProblem[]
  constructor(problems: readonly DurabilityProblem[]) {
    const lines = problems.map((problem) => `${problem.setting} is ${problem.found}, needs ${problem.wanted}: ${problem.fix}`)
    super(
      'STORE_UNAVAILABLE',
      `postgres: durability { synchronousCommit } is not met, so an acknowledged completion could be lost with the primary: ${lines.join('; ')}.`,
    )
    this.problems = problems
  }
}

const LEVELS = ['off', 'local', 'remote_write', 'on', 'remote_apply']

/** Checks a `durability` option's shape; throws `INVALID_OPTION`. */
export function assertDurability(durability: unknown): asserts durability is PostgresDurability | undefined {
  if (durability === undefined) return
  const value = durability as Partial<PostgresDurability> | null
  const level = value?.synchronousCommit
  if (typeof level !== 'string' || LEVELS.indexOf(level) < LEVELS.indexOf('remote_write')) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `PostgresStore durability.synchronousCommit must be 'remote_write', 'on' or 'remote_apply', got ${JSON.stringify(level)}.`,
    )
  }
  if (value?.onMismatch !== undefined && value.onMismatch !== 'refuse' && value.onMismatch !== 'warn') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `PostgresStore durability.onMismatch must be 'refuse' or 'warn', got ${JSON.stringify(value.onMismatch)}.`,
    )
  }
  if (value?.warn !== undefined && typeof value.warn !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'PostgresStore durability.warn must be a function.')
  }
}

const CHECK = `SELECT current_setting('synchronous_commit') AS commit,
  current_setting('synchronous_standby_names') AS names,
  current_user AS who,
  (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))::int AS sync,
  (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)::int AS hidden`

interface CheckRow {
  commit: string
  names: string
  who: string
  sync: number
  hidden: number
}

/** What a session and its server give, read in one statement; the problems against `wanted` (empty: met). */
export async function durabilityProblems(db: PgQueryable, wanted: SynchronousCommit): Promise<DurabilityProblem[]> {
  const row = (await db.query(CHECK)).rows[0] as CheckRow
  const problems: DurabilityProblem[] = []
  if (LEVELS.indexOf(row.commit) < LEVELS.indexOf(wanted)) {
    problems.push({
      setting: 'synchronous_commit',
      found: `'${row.commit}' in this session`,
      wanted: `'${wanted}' or stronger`,
      fix: `ALTER ROLE "${row.who}" SET synchronous_commit = '${wanted}' (or the pool's options: '-c synchronous_commit=${wanted}')`,
    })
  }
  if (row.names.trim() === '') {
    problems.push({
      setting: 'synchronous_standby_names',
      found: 'empty (commits wait for no standby)',
      wanted: 'a standby that streams',
      fix: `ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (*)'; SELECT pg_reload_conf() (on the primary; a managed service has its own switch: Patroni synchronous_mode, RDS Multi-AZ cluster)`,
    })
  } else if (row.hidden > 0 && row.sync === 0) {
    problems.push({
      setting: `the role "${row.who}"'s rights on pg_stat_replication`,
      found: 'unable to read sync_state',
      wanted: 'read access, to confirm a synchronous standby streams',
      fix: `GRANT pg_monitor TO "${row.who}"`,
    })
  } else if (row.sync === 0) {
    problems.push({
      setting: 'pg_stat_replication.sync_state',
      found: `'sync' or 'quorum' on no standby (synchronous_standby_names = '${row.names}')`,
      wanted: 'one streaming standby named by synchronous_standby_names',
      fix: 'start the standby, and check that its application_name matches synchronous_standby_names (commits wait until one streams)',
    })
  }
  return problems
}

/**
 * Runs the check once for a store: concurrent first operations share one check; a check that found the
 * settings short (refused) or failed runs again at the next operation; `'warn'` warns once and passes.
 */
export class DurabilityCheck {
  #passed = false
  #running: Promise<void> | undefined
  constructor(readonly durability: PostgresDurability) {}

  /** Resolves when `db` gives what was asked (or the mismatch was warned of); throws {@link PostgresDurabilityError}. */
  check(db: PgQueryable): Promise<void> {
    if (this.#passed) return Promise.resolve()
    this.#running ??= this.#check(db).finally(() => {
      this.#running = undefined
    })
    return this.#running
  }

  async #check(db: PgQueryable): Promise<void> {
    const problems = await durabilityProblems(db, this.durability.synchronousCommit)
    if (problems.length === 0) {
      this.#passed = true
      return
    }
    const error = new PostgresDurabilityError(problems)
    if ((this.durability.onMismatch ?? 'refuse') === 'refuse') throw error
    this.#passed = true
    const warn = this.durability.warn ?? ((message: string) => console.warn(message))
    warn(`${error.message} Serving anyway (durability.onMismatch: 'warn').`, error)
  }
}
