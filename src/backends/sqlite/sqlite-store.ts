import { statSync } from 'node:fs'
import { join } from 'node:path'
import { assertClock, type Clock, systemClock } from '../../core/clock.js'
import { type Duration, parseDuration } from '../../core/duration.js'
import { assertRecordStep, stepsFromJson } from '../../core/steps-store.js'
import {
  type AcquireResult,
  DEFAULT_ABANDONED_RETENTION_MS,
  type IdempotencyStore,
  type ListFilter,
  type Outcome,
  type StoredRecord,
  type Unsubscribe,
} from '../../core/store.js'
import { assertFingerprint, assertIdentity, assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError, storeUnavailable } from '../../errors.js'
import { assertOutcome, encodeHeaders, listLimit } from '../records.js'
import { connect, openNodeSqlite, type SqliteConnection, type SqliteDatabase, type SqliteDriverName } from './driver.js'
import { migrate } from './schema.js'
import { prepareStatements, type Row, type SqliteStatements, toRecord } from './statements.js'

/** Options of {@link SqliteStore}. */
export interface SqliteStoreOptions {
  /** Database file, or `:memory:`. Several processes on one machine may share a file. @default 'idemkey.db' */
  path?: string
  /**
   * An open database to use instead of `path` (it is not closed by `close()`): a node:sqlite
   * `DatabaseSync`, or a better-sqlite3 (13 or later) `Database`. Without it the store opens `path`
   * with node:sqlite, built into Node.js 22.16+, Bun and Deno.
   */
  database?: SqliteDatabase
  /**
   * Opens `path` with another driver; the store owns what it returns and closes it on `close()`.
   * @example new SqliteStore({ path: 'idemkey.db', open: (path) => new Database(path) }) // better-sqlite3
   */
  open?: (path: string) => SqliteDatabase
  /** Table name. @default 'idemkey_records' */
  table?: string
  /** Give it the ledger's clock in tests. @default systemClock */
  clock?: Clock
  /** How long a writer waits for another process's lock before `STORE_UNAVAILABLE`. @default '5s' */
  busyTimeout?: Duration
  /**
   * `normal` survives a process crash (WAL, no fsync per commit); `full` also survives power loss,
   * at a cost of one fsync per write. @default 'normal'
   */
  synchronous?: 'normal' | 'full'
  /** How long a record whose lease ended is kept before it may be purged. @default '24h' */
  abandonedRetention?: Duration
}

/**
 * The embedded default: records in a SQLite file in WAL mode, shared safely by several processes
 * on one machine. Every operation is one statement (acquire: an upsert that only takes the row when
 * no live record holds it), so it is atomic across processes.
 *
 * @example const store = new SqliteStore({ path: 'idemkey.db' })
 */
export class SqliteStore implements IdempotencyStore {
  readonly name = 'sqlite'
  readonly serverClock = false
  readonly #db: SqliteConnection
  readonly #ownsDb: boolean
  readonly #clock: Clock
  readonly #abandonedRetentionMs: number
  readonly #watchers = new Map<string, Set<() => void>>()
  readonly #sql: SqliteStatements

  constructor(options: SqliteStoreOptions = {}) {
    const table = options.table ?? 'idemkey_records'
    if (typeof table !== 'string' || !/^[A-Za-z_][A-Za-z0-9_]{0,62}$/.test(table)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `SqliteStore table "${table}" must be a plain SQL identifier (letters, digits, underscore).`,
      )
    }
    assertClock('new SqliteStore()', 'clock', options.clock)
    this.#clock = options.clock ?? systemClock
    this.#abandonedRetentionMs = parseDuration(options.abandonedRetention ?? DEFAULT_ABANDONED_RETENTION_MS, 'abandonedRetention')
    const path = options.path ?? 'idemkey.db'
    if (path === '') {
      // SQLite opens "" as a private temporary database, deleted on close: nothing would be shared
      // with another process or kept across a restart, and nothing would say so.
      throw new IdempotencyError(
        'INVALID_OPTION',
        'SqliteStore path is empty: SQLite would open a private temporary database, deleted on close and seen by no other process. Give a file path (e.g. "idemkey.db"), or ":memory:" for a test.',
      )
    }
    if (options.database !== undefined && options.open !== undefined) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'SqliteStore takes { database } (yours, left open) or { open } (the store opens and closes), not both.',
      )
    }
    this.#ownsDb = options.database === undefined
    // A database of neither driver, or no driver at all, is its own clear error, not a file problem.
    const given = options.database === undefined ? undefined : connect(options.database, 'SqliteStore { database }')
    let opened: SqliteConnection | undefined
    try {
      if (!given) opened = options.open ? connect(options.open(path), 'SqliteStore { open }') : openNodeSqlite(path)
      this.#db = (given ?? opened) as SqliteConnection
      this.#db.pragma(`busy_timeout = ${parseDuration(options.busyTimeout ?? '5s', 'busyTimeout')}`)
      if (this.#ownsDb && path !== ':memory:') tunePageSize(this.#db)
      if (path !== ':memory:') this.#db.pragma('journal_mode = WAL')
      this.#db.pragma(`synchronous = ${options.synchronous === 'full' ? 'FULL' : 'NORMAL'}`)
      migrate(this.#db, table)
      this.#sql = prepareStatements(this.#db, table)
    } catch (error) {
      opened?.close()
      if (error instanceof IdempotencyError) throw error
      throw new IdempotencyError(
        'STORE_UNAVAILABLE',
        given
          ? `sqlite: cannot set up the database you passed (${given.driver}): ${(error as Error).message}.`
          : isDirectory(path)
            ? `sqlite: cannot open "${path}": it is a directory. Give the path of a database file, e.g. "${join(path, 'idemkey.db')}".`
            : `sqlite: cannot open "${path}": ${(error as Error).message}. Check that the directory exists and is writable.`,
        { cause: error },
      )
    }
  }

  /** The driver this store runs on: `node:sqlite`, or `better-sqlite3` when its database was passed. */
  get driver(): SqliteDriverName {
    return this.#db.driver
  }

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    assertIdentity(scope, key)
    assertFingerprint(fingerprint)
    assertPositiveInteger(leaseMs, 'leaseMs')
    return this.#run('acquire', () => {
      // The upsert takes the row only when no live record holds it. When it takes nothing, the
      // read tells why; if the row changed in between (released, purged), try again.
      for (;;) {
        const now = this.#clock.now()
        const lockedUntil = now + leaseMs
        const taken = this.#sql.acquire.get(scope, key, fingerprint, lockedUntil, now, now, lockedUntil + this.#abandonedRetentionMs) as
          | { token: number; steps: string | null }
          | undefined
        if (taken) {
          if (taken.steps === null) return { kind: 'acquired', token: taken.token }
          return { kind: 'acquired', token: taken.token, steps: stepsFromJson(taken.steps) ?? [] }
        }
        const row = this.#sql.get.get(scope, key) as Row | undefined
        if (!row || row.expires_at <= now) continue
        const ended = row.status === 'in_progress' && (row.locked_until as number) <= now
        // An ended attempt with steps is taken over only by its own request (see the statement).
        if (ended && (row.fingerprint === fingerprint || !row.has_steps)) continue
        if (row.fingerprint !== fingerprint) return { kind: 'mismatch' }
        if (row.status === 'in_progress') return { kind: 'in_progress', lockedUntilMs: row.locked_until as number }
        return { kind: 'replay', record: toRecord(row) }
      }
    })
  }

  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(leaseMs, 'leaseMs')
    return this.#run('renew', () => {
      const now = this.#clock.now()
      const lockedUntil = now + leaseMs
      return (
        this.#sql.renew.run({ scope, key, token, now, locked_until: lockedUntil, expires_at: lockedUntil + this.#abandonedRetentionMs })
          .changes === 1
      )
    })
  }

  async complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(ttlMs, 'ttlMs')
    assertOutcome(outcome)
    const done = await this.#run('complete', () => {
      const now = this.#clock.now()
      return (
        this.#sql.complete.run(
          outcome.status,
          outcome.response.status,
          encodeHeaders(outcome.response.headers),
          outcome.response.body,
          outcome.resourceId ?? null,
          now,
          now + ttlMs,
          scope,
          key,
          token,
        ).changes === 1
      )
    })
    if (done) this.#notify(scope, key)
    return done
  }

  async release(scope: string, key: string, token: number): Promise<boolean> {
    assertIdentity(scope, key)
    const done = await this.#run('release', () => {
      const now = this.#clock.now()
      return this.#sql.release.run({ scope, key, token, now, expires_at: now + this.#abandonedRetentionMs }).changes === 1
    })
    if (done) this.#notify(scope, key)
    return done
  }

  /**
   * One UPDATE of the record's `steps` JSON, fenced by token: `json_set` for a result, `json_insert`
   * for a started marker (which so never replaces a result).
   */
  async recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    assertRecordStep(scope, key, token, name, result)
    const path = `$."${name}"`
    return this.#run('recordStep', () =>
      result === null
        ? this.#sql.stepStarted.run(path, this.#clock.now(), scope, key, token).changes === 1
        : this.#sql.stepResult.run(path, result, this.#clock.now(), scope, key, token).changes === 1,
    )
  }

  async get(scope: string, key: string): Promise<StoredRecord | null> {
    assertIdentity(scope, key)
    return this.#run('get', () => {
      const row = this.#sql.get.get(scope, key) as Row | undefined
      return row && row.expires_at > this.#clock.now() ? toRecord(row) : null
    })
  }

  async list(filter: ListFilter = {}): Promise<StoredRecord[]> {
    const limit = listLimit(filter)
    return this.#run('list', () => {
      const rows = this.#sql.list.all({
        now: filter.includeExpired ? Number.MIN_SAFE_INTEGER : this.#clock.now(),
        scope: filter.scope ?? null,
        status: filter.status ?? null,
        created_before: filter.createdBeforeMs ?? null,
        limit,
      }) as Row[]
      return rows.map(toRecord)
    })
  }

  async purgeExpired(limit: number): Promise<number> {
    assertPositiveInteger(limit, 'limit')
    return this.#run('purgeExpired', () => Number(this.#sql.purge.run({ now: this.#clock.now(), limit }).changes))
  }

  async evict(scope: string, key: string): Promise<boolean> {
    assertIdentity(scope, key)
    const existed = await this.#run('evict', () => this.#sql.evict.run(scope, key).changes === 1)
    if (existed) this.#notify(scope, key)
    return existed
  }

  /** In-process notifications; waiters in other processes poll. */
  watch(scope: string, key: string, onChange: () => void): Unsubscribe {
    const id = `${scope}\n${key}`
    let listeners = this.#watchers.get(id)
    if (!listeners) {
      listeners = new Set()
      this.#watchers.set(id, listeners)
    }
    listeners.add(onChange)
    return () => {
      listeners.delete(onChange)
      if (listeners.size === 0) this.#watchers.delete(id)
    }
  }

  async close(): Promise<void> {
    this.#watchers.clear()
    // The calls made before close() wait for their group commit at the end of the turn: commit them
    // now, or they would run on a closed database and fail (an outcome already produced, not stored).
    this.#flush()
    if (this.#ownsDb) this.#db.close()
  }

  #notify(scope: string, key: string): void {
    const listeners = this.#watchers.get(`${scope}\n${key}`)
    if (listeners) for (const listener of [...listeners]) listener()
  }

  /**
   * Runs one synchronous database step. Steps issued while others are queued are committed together
   * in one `BEGIN IMMEDIATE` transaction (group commit): one WAL commit for many operations, so
   * concurrent callers are not bound by the cost of a commit each. Each step stays atomic on its own,
   * and the transaction holds the write lock, so other processes still see one step at a time.
   * Driver errors (SQLITE_BUSY, a closed database) become STORE_UNAVAILABLE.
   *
   * When a batch commits depends on what is at stake if the process dies first:
   * - `recordStep` commits at the next microtask: the next step of its run waits on it, and until the
   *   step's result is on disk a crash lets a takeover run that step again.
   * - Everything else, `complete` included, waits for the end of the event-loop turn (setImmediate),
   *   so that the operations of every request served in the same turn share one commit: under load
   *   the outcomes of the upstream answers read in one turn, and the acquires of the requests that
   *   arrived in it, are one WAL write with one set of locks. A `complete` still resolves only once
   *   its commit is done, so an outcome is durable before its caller answers; the window in which a
   *   crash loses a ran-but-unrecorded outcome grows by at most the rest of that turn.
   * A `recordStep` takes whatever else is queued along into its batch.
   */
  #run<R>(operation: string, step: () => R): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.#queue.push({ operation, step, resolve: resolve as (value: unknown) => void, reject })
      if (operation === 'recordStep') {
        if (!this.#flushSoon) {
          this.#flushSoon = true
          queueMicrotask(this.#flush)
        }
      } else if (!this.#flushAtTurnEnd) {
        this.#flushAtTurnEnd = true
        setImmediate(this.#flush)
      }
    })
  }

  readonly #queue: QueuedStep[] = []
  #flushSoon = false
  #flushAtTurnEnd = false

  readonly #flush = (): void => {
    // A flush takes the whole queue; a flush still scheduled finds it empty, or serves later steps.
    this.#flushSoon = false
    this.#flushAtTurnEnd = false
    if (this.#queue.length === 0) return
    const batch = this.#queue.splice(0)
    if (batch.length === 1) {
      const only = batch[0] as QueuedStep
      try {
        only.resolve(only.step())
      } catch (error) {
        only.reject(storeUnavailable('sqlite', only.operation, error))
      }
      return
    }
    const results: StepResult[] = []
    try {
      this.#db.immediate(() => runSteps(batch, results))
    } catch (error) {
      // BEGIN or COMMIT failed (the lock stayed busy past busyTimeout): nothing of the batch was written.
      for (const queued of batch) queued.reject(storeUnavailable('sqlite', queued.operation, error))
      return
    }
    for (const [i, queued] of batch.entries()) {
      const result = results[i]
      if (result?.ok) queued.resolve(result.value)
      else queued.reject(storeUnavailable('sqlite', queued.operation, result?.error))
    }
  }
}

type StepResult = { ok: true; value: unknown } | { ok: false; error: unknown }

/** Runs each queued step inside one transaction; a failing statement is rolled back alone. */
function runSteps(batch: QueuedStep[], results: StepResult[]): void {
  for (const queued of batch) {
    try {
      results.push({ ok: true, value: queued.step() })
    } catch (error) {
      results.push({ ok: false, error })
    }
  }
}

interface QueuedStep {
  operation: string
  step: () => unknown
  resolve: (value: unknown) => void
  reject: (error: unknown) => void
}

/** Page size given to a file this store creates. */
const NEW_FILE_PAGE_SIZE = 1024
/** WAL written between automatic checkpoints: SQLite's default (1,000 pages of 4 KiB) in bytes. */
const WAL_CHECKPOINT_BYTES = 4 * 1024 * 1024

/**
 * Gives a new file 1 KiB pages. A commit writes every page it changed to the WAL, whole and
 * checksummed (an acquire changes four: the row and three index entries; a complete two), so smaller
 * pages make each write cheaper, bodies of a few KiB included. A file that already has pages keeps its size (WAL mode
 * cannot change it), so this only acts before the first write. The checkpoint threshold is set in
 * bytes, not pages, so the WAL grows no larger than with SQLite's defaults and its checkpoints (two
 * fsyncs each) come no more often.
 */
function tunePageSize(db: SqliteConnection): void {
  db.pragma(`page_size = ${NEW_FILE_PAGE_SIZE}`)
  const pageSize = Number(db.pragma('page_size'))
  db.pragma(`wal_autocheckpoint = ${Math.ceil(WAL_CHECKPOINT_BYTES / pageSize)}`)
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path, { throwIfNoEntry: false })?.isDirectory() === true
  } catch {
    return false
  }
}
