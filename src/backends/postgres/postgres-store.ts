import { type SqlTransactions, type SqlValue, WORK_SAVEPOINT } from '../../core/sql-transactions.js'
import { assertRecordStep } from '../../core/steps-store.js'
import type {
  AcquireResult,
  ListFilter,
  Outcome,
  SavepointCommand,
  StoredRecord,
  TransactionalStore,
  Unsubscribe,
} from '../../core/store.js'
import { assertFingerprint, assertIdentity, assertPositiveInteger } from '../../core/validate.js'
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
import { channelName, clientTransaction, endPool, openPool } from './connect.js'
import { DurabilityCheck } from './durability.js'
import { heldRows } from './held-rows.js'
import { convertLayout, type LayoutConversion } from './layout-migration.js'
import { Listener } from './listener.js'
import type { PostgresStoreOptions, PostgresStoreTransactionsOption } from './options.js'
import { PartitionedAcquire } from './partitioned-acquire.js'
import { type PartitionedStatements, partitionedStatements } from './partitioned-statements.js'
import type { PostgresLayout } from './partitions.js'
import type { PgClientLike, PgPoolLike, PgQueryable, PgQueryResult } from './pool.js'
import { rowHeld, toStoreError } from './postgres-errors.js'
import { resolveOptions } from './resolve-options.js'
import { type Rotation, rotate } from './rotation.js'
import { type AcquireRow, acquireAnswer, type Row, toRecord } from './rows.js'
import { migrate } from './schema.js'
import { COLUMNS, NOW_MS, qualified, type Statement, type Statements, statements } from './statements.js'
import { PostgresTasks } from './tasks.js'

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
  /** The acquire of the partitioned layout (absent on the plain one). */
  readonly #partitioned: PartitionedAcquire<Client> | undefined
  /** The interval a partitioned table `migrate()` creates gets. */
  readonly #intervalMs: number
  readonly #retentionMs: number
  readonly #prepared: boolean
  /** `query_timeout` of every statement sent on the pool (never inside a caller's transaction). */
  readonly #queryTimeoutMs: number
  /** The one close(), once asked for. */
  #closing: Promise<void> | undefined
  readonly #begin: string
  /** `SET TRANSACTION ISOLATION LEVEL …` for a tool's transaction, when `isolationLevel` was given. */
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
  /** The `durability` check, run before the pool is first used (absent: the option was not given). */
  readonly #durability: DurabilityCheck | undefined

  constructor(options: PostgresStoreOptions<Client> & PostgresStoreTransactionsOption<Tx>) {
    const resolved = resolveOptions(options)
    const { schema, table } = resolved
    this.schema = schema
    this.table = table
    this.layout = resolved.layout
    this.#sql = statements(schema, table)
    if (resolved.layout === 'partitioned') {
      this.#parted = partitionedStatements(schema, table)
      this.#partitioned = new PartitionedAcquire({
        ...resolved,
        sql: this.#parted,
        ready: (operation) => this.#ready(operation),
        query: (operation, statement, values) => this.#query(operation, statement, values),
      })
    }
    this.#intervalMs = resolved.intervalMs
    this.#retentionMs = resolved.retentionMs
    this.#prepared = resolved.prepared
    this.#queryTimeoutMs = resolved.queryTimeoutMs
    this.#begin = resolved.begin
    this.#toolIsolation = resolved.toolIsolation
    this.#tool = options.transactions
    this.#ownsPool = options.pool === undefined
    this.#durability = resolved.durability && new DurabilityCheck(resolved.durability)
    if (resolved.open) {
      const { connectionString, max, connectionTimeoutMs, synchronousCommit } = resolved.open
      this.#opening = openPool(connectionString, max, connectionTimeoutMs, synchronousCommit)
      // An open that fails is reported by the first operation, never as an unhandled rejection.
      this.#opening.catch(() => {})
    } else if (this.#durability) this.#opening = Promise.resolve(options.pool as PgPoolLike<Client>)
    else this.#pool = options.pool as PgPoolLike<Client>
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
          parted && statement === parted.acquire
            ? (this.#partitioned as PartitionedAcquire<Client>).acquire(values)
            : this.#query(operation, statement, values),
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
    await this.#partitioned?.ensurePartitions('migrate')
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
        const row = (await (this.#partitioned as PartitionedAcquire<Client>).acquire(batch)).rows[0] as AcquireRow | undefined
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
    return clientTransaction(pool, this.#begin, fn, (operation, error) => toStoreError(operation, error, this.schema, this.table))
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
      const pool = await (this.#opening as Promise<PgPoolLike<Client>>)
      // Until the durability check passes the pool stays unset, so every operation comes here first.
      await this.#durability?.check(pool)
      this.#pool = pool
      return pool
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
