import { parseDuration, parseTimerDuration } from '../../core/duration.js'
import { assertSqlTransactions, type SqlTransactions, type SqlValue, WORK_SAVEPOINT } from '../../core/sql-transactions.js'
import { assertRecordStep } from '../../core/steps-store.js'
import {
  type AcquireResult,
  DEFAULT_ABANDONED_RETENTION_MS,
  type ListFilter,
  type Outcome,
  type SavepointCommand,
  type StoredRecord,
  type TransactionalStore,
  type Unsubscribe,
} from '../../core/store.js'
import { assertFingerprint, assertIdentity, assertOptionalPositiveInteger, assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { assertOutcome, encodeHeaders, listLimit } from '../records.js'
import { batchStatements } from './batch-statements.js'
import {
  type AcquireInput,
  type CompleteInput,
  type FencedInput,
  type GroupCommits,
  groupCommits,
  type KeyInput,
  lostRaces,
  type RenewInput,
} from './batches.js'
import { channelName, endPool, holding, openPool } from './connect.js'
import { heldRows } from './held-rows.js'
import { convertLayout, type LayoutConversion } from './layout-migration.js'
import { Listener } from './listener.js'
import type { PostgresStoreOptions, PostgresStoreTransactionsOption } from './options.js'
import { type PartitionedStatements, partitionedStatements } from './partitioned-statements.js'
import { assertPartitionedName, type PostgresLayout } from './partitions.js'
import type { PgClientLike, PgPoolLike, PgQueryable, PgQueryResult } from './pool.js'
import { lockNotGranted, rowHeld, toStoreError } from './postgres-errors.js'
import { ensurePartitions, inTransaction, type Rotation, rotate } from './rotation.js'
import { type AcquireRow, acquireAnswer, type Row, toRecord } from './rows.js'
import { migrate } from './schema.js'
import { COLUMNS, NOW_MS, qualified, type Statement, type Statements, statements } from './statements.js'
import { PostgresTasks } from './tasks.js'

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/

/**
 * Records in a PostgreSQL table, shared by any number of processes and machines, with business writes and the record in one
 * transaction when you want them (docs/postgres.md).
 * Leases and expiry are decided by the server's clock (`clock_timestamp()`). Acquire is one
 * statement (a read of the live record, or an `INSERT … ON CONFLICT … DO UPDATE … WHERE` that takes
 * the row only when no live record holds it), so a first request costs two round trips (acquire,
 * complete) and a replay one. Concurrent callers share: operations of one kind issued while one
 * is in flight go out together when it returns, as one statement and one commit (`groupCommit`,
 * on by default; never inside your transaction). Waiters are woken by LISTEN/NOTIFY on one shared connection, and poll
 * as well. With `ledger.runInTransaction`, the work's writes and the completion commit together, and
 * a fenced-out holder's writes roll back. Create the table once with {@link PostgresStore.migrate}
 * (or `idemkey migrate`).
 *
 * @example
 * import pg from 'pg'
 * const store = new PostgresStore({ pool: new pg.Pool({ connectionString: process.env.DATABASE_URL }) })
 * await store.migrate()
 * const ledger = new Ledger({ store })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => {
 *   await tx.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [order.id, order.total])
 *   return { orderId: order.id }
 * })
 */
export class PostgresStore<Client extends PgClientLike = PgClientLike, Tx = Client> implements TransactionalStore<Tx> {
  readonly name = 'postgres'
  readonly serverClock = true
  /** Schema of the table. */
  readonly schema: string
  /** The table this store reads and writes. */
  readonly table: string
  /** How the table is laid out: one plain table, or time partitions (the `layout` option). */
  readonly layout: PostgresLayout
  /** The NOTIFY channel completions are announced on (`null` with `notifications: false`). */
  readonly channel: string | null
  /**
   * Wakes `onChange` on NOTIFY from any process that completes, releases or evicts the record.
   * Absent with `notifications: false` (the ledger polls).
   */
  readonly watch?: (scope: string, key: string, onChange: () => void) => Unsubscribe
  readonly #sql: Statements
  /** The statements of the partitioned layout (absent on the plain one). */
  readonly #parted: PartitionedStatements | undefined
  /** The interval a partitioned table `migrate()` creates gets. */
  readonly #intervalMs: number
  readonly #retentionMs: number
  readonly #prepared: boolean
  /** `query_timeout` of every statement sent on the pool (never inside a caller's transaction). */
  readonly #queryTimeoutMs: number
  /** The one close(), once asked for. */
  #closing: Promise<void> | undefined
  readonly #begin: string
  /**
   * The isolation asked for with `isolationLevel`, set as the first statement of a tool's transaction
   * (`undefined`: the option was not given, and the tool's transaction keeps its own level).
   */
  readonly #toolIsolation: string | undefined
  readonly #ownsPool: boolean
  readonly #listener: Listener | undefined
  readonly #tasks: PostgresTasks
  #pool: PgPoolLike<Client> | undefined
  readonly #opening: Promise<PgPoolLike<Client>> | undefined
  /** The user's data layer, when `transactions` was given: `transaction()` runs in it. */
  readonly #tool: SqlTransactions<Tx> | undefined
  /** Group commit of the pool path (absent with `groupCommit: false`). */
  readonly #groups: GroupCommits | undefined

  constructor(options: PostgresStoreOptions<Client> & PostgresStoreTransactionsOption<Tx>) {
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
    this.schema = schema
    this.table = table
    this.#sql = statements(schema, table)
    const layout = options.layout ?? 'plain'
    if (layout !== 'plain' && layout !== 'partitioned') {
      throw new IdempotencyError('INVALID_OPTION', `PostgresStore layout must be 'plain' or 'partitioned', got ${JSON.stringify(layout)}.`)
    }
    this.layout = layout
    this.#intervalMs = parseDuration(options.partitionInterval ?? '1d', 'partitionInterval')
    if (layout === 'partitioned') {
      if (this.#intervalMs <= 0) {
        // A table created so would carry an interval of 0, and every partition's bounds divide by it.
        throw new IdempotencyError(
          'INVALID_OPTION',
          `PostgresStore partitionInterval must be longer than 0 with layout 'partitioned' (e.g. '1d'), got ${JSON.stringify(options.partitionInterval)}.`,
        )
      }
      assertPartitionedName(table)
      this.#parted = partitionedStatements(schema, table)
    }
    this.#retentionMs = parseDuration(options.abandonedRetention ?? DEFAULT_ABANDONED_RETENTION_MS, 'abandonedRetention')
    // On the partitioned layout every statement is planned when it runs: a plan cached while the
    // partition of now was new and nearly empty scans it whole once it has filled (a sequential scan
    // is the cheapest plan for a tiny table, and nothing replans until autovacuum analyzes it).
    this.#prepared = (options.layout ?? 'plain') === 'plain' && (options.preparedStatements ?? true)
    this.#queryTimeoutMs = parseTimerDuration(options.queryTimeout ?? '10s', 'queryTimeout')
    const isolation = options.isolationLevel ?? 'read committed'
    if (!['read committed', 'repeatable read', 'serializable'].includes(isolation)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `PostgresStore isolationLevel must be 'read committed', 'repeatable read' or 'serializable', got ${JSON.stringify(isolation)}.`,
      )
    }
    this.#begin = `BEGIN ISOLATION LEVEL ${isolation.toUpperCase()}`
    this.#toolIsolation = options.isolationLevel === undefined ? undefined : `SET TRANSACTION ISOLATION LEVEL ${isolation.toUpperCase()}`
    if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'PostgresStore', 'postgres')
    this.#tool = options.transactions
    this.#ownsPool = options.pool === undefined
    if (options.pool) this.#pool = options.pool
    else {
      this.#opening = openPool(
        options.connectionString,
        options.max ?? 10,
        parseDuration(options.connectionTimeout ?? '5s', 'connectionTimeout'),
      )
      // An open that fails is reported by the first operation, never as an unhandled rejection.
      this.#opening.catch(() => {})
    }
    this.channel = options.notifications === false ? null : channelName(schema, table)
    if (this.channel) {
      const arm = async (id: string) => {
        const cut = id.indexOf('\n')
        const result = await this.#query('watch', this.#sql.flagWaiter, [id.slice(0, cut), id.slice(cut + 1)])
        return Number((result.rows[0] as { seen: string | number }).seen) > 0
      }
      const listener = new Listener(() => this.#ready('watch'), this.channel, arm, this.#queryTimeoutMs)
      this.#listener = listener
      this.watch = (scope, key, onChange) => listener.watch(`${scope}\n${key}`, onChange)
    }
    this.#tasks = new PostgresTasks(this, options.gc, this.#parted ? () => this.rotatePartitions() : undefined)
    if (options.groupCommit ?? true) {
      const batch = batchStatements(schema, table)
      const parted = this.#parted
      this.#groups = groupCommits({
        sql: parted ? { ...batch, acquire: parted.acquire } : batch,
        retentionMs: this.#retentionMs,
        channel: this.channel,
        query: (operation, statement, values) =>
          parted && statement === parted.acquire ? this.#lockedAcquire(values) : this.#query(operation, statement, values),
        one: {
          acquire: (input) => this.#acquireOne(input),
          get: (input) => this.#getOne(input),
          renew: (input) => this.#renewOne(input),
          complete: (input) => this.#completeOne(input),
          release: (input) => this.#releaseOne(input),
        },
      })
    }
  }

  /**
   * Creates the table and its indexes if needed; safe to call on every start, from many processes at once.
   * On the partitioned layout, also creates the partition of now and those ahead. Refuses a table
   * of the other layout (see {@link PostgresStore.convertLayout}).
   */
  async migrate(): Promise<void> {
    const pool = await this.#ready('migrate')
    await migrate(pool, this.schema, this.table, { layout: this.layout, intervalMs: this.#intervalMs })
    if (this.#parted) await this.#ensurePartitions('migrate')
  }

  /**
   * Rewrites the table in this store's layout, records kept (from plain to partitioned, or back):
   * one transaction under an exclusive lock, so every store on the table waits for it. Creates the
   * table if missing; does nothing on a table in this layout already. `idemkey migrate --layout`.
   */
  async convertLayout(): Promise<LayoutConversion> {
    const pool = await this.#ready('convertLayout')
    return convertLayout(pool, this.schema, this.table, { layout: this.layout, intervalMs: this.#intervalMs })
  }

  /**
   * On the partitioned layout: creates the partitions of now and ahead, and detaches and drops each
   * ended partition whose every record has expired. What the `gc` loop and `idemkey gc` run.
   */
  async rotatePartitions(): Promise<Rotation> {
    if (!this.#parted) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `postgres: rotatePartitions() needs layout 'partitioned'; table "${this.schema}"."${this.table}" is plain (use purgeExpired).`,
      )
    }
    const pool = await this.#ready('rotatePartitions')
    try {
      return await rotate(pool, this.schema, this.table, this.#intervalMs)
    } catch (error) {
      throw toStoreError('rotatePartitions', error, this.schema, this.table)
    }
  }

  /**
   * Creates the partition of now and those ahead. For an acquire whose insert found its partition
   * missing (a missed rotation), a lock not granted in time is no failure: another transaction holds
   * it, one creating the same partitions for other callers, or a rotation, and the acquire's next
   * attempt finds the partition, or asks again.
   */
  async #ensurePartitions(operation: 'migrate' | 'acquire'): Promise<void> {
    try {
      await ensurePartitions(await this.#ready(operation), this.schema, this.table, this.#intervalMs)
    } catch (error) {
      if (operation === 'acquire' && lockNotGranted(error)) return
      throw toStoreError(operation, error, this.schema, this.table)
    }
  }

  /**
   * The partitioned acquire (partitioned-statements.ts), in the batch statement's shape: a lock-free
   * read answers the callers whose key has a live record (replays, duplicates in flight, mismatches);
   * the others go on under the key locks.
   */
  async #lockedAcquire(values: unknown[]): Promise<PgQueryResult> {
    const [scopes, keys, fingerprints, leases, watched] = values as [string[], string[], string[], number[], string[]]
    const peeked = (await this.#query('acquire', (this.#parted as PartitionedStatements).peek, [scopes, keys, fingerprints]))
      .rows as Array<{
      n: string | number
    }>
    if (peeked.length === scopes.length) return { rows: peeked, rowCount: peeked.length }
    // The callers the read left unanswered go on under the key locks, numbered again from 1 (and
    // the first of each key among them may write); their rows are numbered back as the caller's.
    const answered = new Set(peeked.map((row) => Number(row.n)))
    const rest = scopes.map((_, i) => i).filter((i) => !answered.has(i + 1))
    const pick = <T>(column: T[]) => rest.map((i) => column[i] as T)
    const first = rest.map((i, j) => j === 0 || scopes[i] !== scopes[rest[j - 1] as number] || keys[i] !== keys[rest[j - 1] as number])
    const locked = await this.#underKeyLocks([
      pick(scopes),
      pick(keys),
      pick(fingerprints),
      pick(leases),
      pick(watched),
      first.map((flag) => (flag ? 't' : 'f')),
      values[6],
    ])
    const rows = [
      ...peeked,
      ...(locked.rows as Array<{ n: string | number }>).map((row) => ({ ...row, n: (rest[Number(row.n) - 1] as number) + 1 })),
    ]
    return { rows, rowCount: rows.length }
  }

  /**
   * The keys' advisory locks, then the acquire statement, in one READ COMMITTED transaction, so the
   * statement's snapshot comes after the locks. An insert that found no partition for now (a
   * rotation was missed) creates the partitions and runs again.
   */
  async #underKeyLocks(values: unknown[]): Promise<PgQueryResult> {
    const parted = this.#parted as PartitionedStatements
    const pool = await this.#ready('acquire')
    const named = (statement: Statement, params: unknown[]) =>
      this.#prepared
        ? { name: statement.name, text: statement.text, values: params, query_timeout: this.#queryTimeoutMs }
        : { text: statement.text, values: params, query_timeout: this.#queryTimeoutMs }
    for (let attempt = 0; ; attempt++) {
      try {
        return await inTransaction(pool, async (tx) => {
          await tx.query(named(parted.lock, [values[0], values[1], `${this.schema}.${this.table}`]))
          return tx.query(named(parted.acquire, values))
        })
      } catch (error) {
        if (attempt < 3 && noPartition(error)) {
          await this.#ensurePartitions('acquire')
          continue
        }
        throw toStoreError('acquire', error, this.schema, this.table)
      }
    }
  }

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    assertIdentity(scope, key)
    assertFingerprint(fingerprint)
    assertPositiveInteger(leaseMs, 'leaseMs')
    // A watch registered before the record existed could not flag it: flag it as it is created.
    const watched = this.#listener?.watches(`${scope}\n${key}`) ?? false
    const input = { scope, key, fingerprint, leaseMs, watched }
    return this.#groups ? this.#groups.acquire.run(input) : this.#acquireOne(input)
  }

  async #acquireOne(input: AcquireInput): Promise<AcquireResult> {
    try {
      return await this.#acquireRounds(input)
    } catch (error) {
      // Another transaction holds the row (a holder that completed the record in its own transaction,
      // not committed yet): in flight, for the ledger to wait on. When it ends is not known here; the
      // lease asked for is the hint.
      if (rowHeld(error)) return { kind: 'in_progress', lockedUntilMs: Date.now() + input.leaseMs }
      throw error
    }
  }

  async #acquireRounds({ scope, key, fingerprint, leaseMs, watched }: AcquireInput): Promise<AcquireResult> {
    if (this.#parted) {
      // The batch statement with one caller: the partitioned layout has no single-key form.
      const batch = [[scope], [key], [fingerprint], [leaseMs], [watched ? 't' : 'f'], ['t'], this.#retentionMs]
      for (let round = 0; round < 100; round++) {
        const row = (await this.#lockedAcquire(batch)).rows[0] as AcquireRow | undefined
        if (!row) throw new IdempotencyError('STORE_SCHEMA', 'postgres: acquire returned no row; is the table an idemkey table?')
        const answer = acquireAnswer(row, scope, key, fingerprint)
        if (answer) return answer
      }
      throw lostRaces({ scope, key })
    }
    const values = [scope, key, fingerprint, leaseMs, this.#retentionMs, watched]
    // Neither a token nor a live record comes back only when another caller changed the row between
    // this statement's snapshot and its insert: run it again, with a fresh snapshot.
    for (let round = 0; round < 100; round++) {
      const row = (await this.#query('acquire', this.#sql.acquire, values)).rows[0] as AcquireRow | undefined
      if (!row) throw new IdempotencyError('STORE_SCHEMA', 'postgres: acquire returned no row; is the table an idemkey table?')
      const answer = acquireAnswer(row, scope, key, fingerprint)
      if (answer) return answer
    }
    throw lostRaces({ scope, key })
  }

  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(leaseMs, 'leaseMs')
    const input = { scope, key, token, leaseMs }
    return this.#groups ? this.#groups.renew.run(input) : this.#renewOne(input)
  }

  async #renewOne({ scope, key, token, leaseMs }: RenewInput): Promise<boolean> {
    const result = await this.#query('renew', this.#sql.renew, [scope, key, token, leaseMs, this.#retentionMs])
    return result.rowCount === 1
  }

  async complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return this.#complete(undefined, scope, key, token, outcome, ttlMs)
  }

  /** `complete` inside the transaction `tx` (from {@link PostgresStore.transaction}); the notice goes out at commit. */
  async completeInTransaction(tx: Tx, scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return this.#complete(tx, scope, key, token, outcome, ttlMs)
  }

  /**
   * Sets the savepoint `runInTransaction` takes before the work, or rolls `tx` back to it (a final
   * failure the work returned keeps none of its writes: `RunOptions.failedWrites`). Through a tool, on
   * its transaction's connection, unprepared.
   */
  async savepointInTransaction(tx: Tx, command: SavepointCommand): Promise<void> {
    const text = WORK_SAVEPOINT[command]
    const tool = this.#tool
    try {
      if (tool) await tool.execute(tx, text, [], { prepare: false })
      else await (tx as unknown as PgQueryable).query(text)
    } catch (error) {
      throw toStoreError(tool ? `${text} (through ${tool.tool})` : text, error, this.schema, this.table)
    }
  }

  /** One UPDATE of the record's `steps`, fenced by token (docs/steps.md). */
  async recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    return this.#recordStep(undefined, scope, key, token, name, result)
  }

  /** `recordStep` inside `tx`: the step commits with the transaction's business writes, or rolls back with them. */
  async recordStepInTransaction(tx: Tx, scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    return this.#recordStep(tx, scope, key, token, name, result)
  }

  async #recordStep(tx: Tx | undefined, scope: string, key: string, token: number, name: string, result: string | null) {
    assertRecordStep(scope, key, token, name, result)
    return (await this.#query('recordStep', this.#sql.recordStep, [scope, key, token, name, result], tx)).rowCount === 1
  }

  async release(scope: string, key: string, token: number): Promise<boolean> {
    assertIdentity(scope, key)
    const input = { scope, key, token }
    return this.#groups ? this.#groups.release.run(input) : this.#releaseOne(input)
  }

  async #releaseOne({ scope, key, token }: FencedInput): Promise<boolean> {
    const result = await this.#query('release', this.#sql.release, [scope, key, this.channel, token, this.#retentionMs])
    return result.rowCount === 1
  }

  async get(scope: string, key: string): Promise<StoredRecord | null> {
    assertIdentity(scope, key)
    return this.#groups ? this.#groups.get.run({ scope, key }) : this.#getOne({ scope, key })
  }

  async #getOne({ scope, key }: KeyInput): Promise<StoredRecord | null> {
    const row = (await this.#query('get', this.#sql.get, [scope, key])).rows[0] as Row | undefined
    return row ? toRecord(row) : null
  }

  async list(filter: ListFilter = {}): Promise<StoredRecord[]> {
    const limit = listLimit(filter)
    const where: string[] = []
    const values: unknown[] = []
    const param = (value: unknown) => `$${values.push(value)}`
    if (!filter.includeExpired) where.push(`expires_at > ${NOW_MS}`)
    if (filter.scope !== undefined) where.push(`scope = ${param(filter.scope)}`)
    if (filter.status !== undefined) where.push(`status = ${param(filter.status)}`)
    if (filter.createdBeforeMs !== undefined) where.push(`created_at <= ${param(filter.createdBeforeMs)}`)
    const text = `SELECT ${COLUMNS} FROM ${qualified(this.schema, this.table)} ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
      ORDER BY created_at, scope, "key" LIMIT ${param(limit)}`
    const result = await this.#run('list', (pool) => pool.query({ text, values, query_timeout: this.#queryTimeoutMs }))
    return (result.rows as Row[]).map(toRecord)
  }

  /** Whether an open transaction holds each record's row (a holder inside its transaction), asked without waiting: held-rows.ts. */
  async heldInTransaction(records: ReadonlyArray<{ scope: string; key: string }>): Promise<boolean[]> {
    if (records.length === 0) return []
    return this.#run('heldInTransaction', (pool) => heldRows(pool, qualified(this.schema, this.table), records, this.#queryTimeoutMs))
  }

  async purgeExpired(limit: number): Promise<number> {
    assertPositiveInteger(limit, 'limit')
    return (await this.#query('purgeExpired', this.#parted?.purge ?? this.#sql.purge, [limit])).rowCount ?? 0
  }

  async evict(scope: string, key: string): Promise<boolean> {
    assertIdentity(scope, key)
    return ((await this.#query('evict', this.#sql.evict, [scope, key, this.channel])).rowCount ?? 0) > 0
  }

  /**
   * Runs `fn` in a transaction on one client of the pool (`BEGIN` at the configured isolation level):
   * commits when it resolves, rolls back when it throws. Errors of `fn` come through unchanged,
   * except when the connection broke under it; a failing BEGIN or COMMIT and a lost connection
   * become `STORE_UNAVAILABLE` (see `isTransientTransactionError` for serialization failures).
   * With the `transactions` option, it is your tool's transaction instead, at the tool's isolation
   * level, or at `isolationLevel` when that option is given (set as the transaction's first statement).
   */
  async transaction<R>(fn: (tx: Tx) => Promise<R>): Promise<R> {
    if (this.#tool) return this.#toolTransaction(this.#tool, fn)
    return this.#clientTransaction(fn as unknown as (tx: Client) => Promise<R>)
  }

  #toolTransaction<R>(tool: SqlTransactions<Tx>, fn: (tx: Tx) => Promise<R>): Promise<R> {
    const isolation = this.#toolIsolation
    if (isolation === undefined) return tool.transaction(fn)
    return tool.transaction(async (tx) => {
      // Before any query of the transaction, as PostgreSQL requires: the tool has sent only its BEGIN.
      await tool.execute(tx, isolation, [], { prepare: false }).catch((error: unknown) => {
        throw toStoreError(`${isolation} (through ${tool.tool})`, error, this.schema, this.table)
      })
      return fn(tx)
    })
  }

  async #clientTransaction<R>(fn: (tx: Client) => Promise<R>): Promise<R> {
    const pool = await this.#ready('transaction')
    let client: Client
    try {
      client = await pool.connect()
    } catch (error) {
      throw toStoreError('transaction', error, this.schema, this.table)
    }
    // A connection that breaks between queries (a server restart while `fn` awaits something else)
    // emits 'error' on the client: holding() hears it (unheard, it would crash the process), and destroys
    // a lost client, or one whose rollback failed (its state unknown), rather than pool it.
    return holding(client, async (held) => {
      try {
        await client.query(this.#begin).catch((error: unknown) => {
          throw toStoreError('BEGIN', error, this.schema, this.table)
        })
        const result = await fn(client)
        await client.query('COMMIT').catch((error: unknown) => {
          throw toStoreError('COMMIT', error, this.schema, this.table)
        })
        return result
      } catch (error) {
        // The connection broke under the work (a server restart): its writes are gone with it. Say so
        // with STORE_UNAVAILABLE (retry later), not as if the work itself had failed.
        const lost = held.lost()
        await client.query('ROLLBACK').catch(held.discard)
        throw lost ? toStoreError('transaction', error, this.schema, this.table) : error
      }
    })
  }

  /** Stops the purge loop and the LISTEN connection, and ends the pool the store opened (a pool you passed stays open). */
  close(): Promise<void> {
    // Once: a second close() (two shutdown hooks, the ledger's and yours) waits for the first.
    this.#closing ??= this.#close()
    return this.#closing
  }

  async #close(): Promise<void> {
    await this.#tasks.stop()
    await this.#listener?.close()
    if (!this.#ownsPool) return
    // The calls made before close() are answered first: callers queued behind a batch in flight go
    // out in the next batch, which an ended pool would fail with STORE_UNAVAILABLE.
    if (this.#groups) await Promise.all(Object.values(this.#groups).map((group) => group.idle()))
    const pool = this.#pool ?? (await this.#opening?.catch(() => undefined))
    this.#pool = undefined
    if (pool) await endPool(pool, this.#queryTimeoutMs)
  }

  /** Whether the shared LISTEN connection is up; opens it if needed. For health checks and tests. */
  async listening(): Promise<boolean> {
    return (await this.#listener?.ready()) ?? false
  }

  async #complete(tx: Tx | undefined, scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(ttlMs, 'ttlMs')
    assertOutcome(outcome)
    const body = outcome.response.body
    const input: CompleteInput = {
      scope,
      key,
      token,
      status: outcome.status,
      responseStatus: outcome.response.status,
      headers: encodeHeaders(outcome.response.headers),
      body: Buffer.from(body.buffer, body.byteOffset, body.byteLength),
      resourceId: outcome.resourceId ?? null,
      ttlMs,
    }
    // Inside a caller's transaction, the statement is the transaction's own: never batched with others.
    if (tx !== undefined) return this.#completeOne(input, tx)
    return this.#groups ? this.#groups.complete.run(input) : this.#completeOne(input)
  }

  async #completeOne(input: CompleteInput, tx?: Tx): Promise<boolean> {
    const { scope, key, token, status, responseStatus, headers, body, resourceId, ttlMs } = input
    const values = [scope, key, this.channel, token, status, responseStatus, headers, body, resourceId, ttlMs]
    const result = await this.#query('complete', this.#sql.complete, values, tx)
    return result.rowCount === 1
  }

  async #ready(operation: string): Promise<PgPoolLike<Client>> {
    if (this.#pool) return this.#pool
    try {
      this.#pool = await (this.#opening as Promise<PgPoolLike<Client>>)
      return this.#pool
    } catch (error) {
      throw toStoreError(operation, error, this.schema, this.table)
    }
  }

  #query(operation: string, statement: Statement, values: unknown[], tx?: Tx, raw = false): Promise<PgQueryResult> {
    if (tx !== undefined && this.#tool && !raw) {
      const tool = this.#tool
      // The pg client under the tool's transaction takes the prepared statement, as on the raw path.
      const client = tool.pgClient?.(tx)
      if (client) return this.#query(operation, statement, values, client as unknown as Tx & PgQueryable, true)
      return tool.execute(tx, statement.text, values as SqlValue[], { prepare: this.#prepared }).then(
        (outcome) => ({ rows: [], rowCount: outcome.count }),
        (error: unknown) => {
          throw toStoreError(`${operation} (through ${tool.tool})`, error, this.schema, this.table)
        },
      )
    }
    const on = tx as PgQueryable | undefined
    if (on) {
      const config = this.#prepared ? { name: statement.name, text: statement.text, values } : { text: statement.text, values }
      return on.query(config).catch((error: unknown) => {
        throw toStoreError(operation, error, this.schema, this.table)
      })
    }
    const query_timeout = this.#queryTimeoutMs
    const config = this.#prepared
      ? { name: statement.name, text: statement.text, values, query_timeout }
      : { text: statement.text, values, query_timeout }
    return this.#run(operation, (pool) => pool.query(config))
  }

  #run<R>(operation: string, step: (pool: PgPoolLike<Client>) => Promise<R>): Promise<R> {
    const fail = (error: unknown): never => {
      throw toStoreError(operation, error, this.schema, this.table)
    }
    // The hot path: the pool is there, so no extra await before the query goes out.
    if (this.#pool) return step(this.#pool).catch(fail)
    return this.#ready(operation).then((pool) => step(pool).catch(fail))
  }
}

/** An insert that found no partition for its `created_at` (SQLSTATE 23514, "no partition of relation … found for row"). */
function noPartition(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: string; message?: string }
  return code === '23514' && /no partition/.test(message ?? '')
}
