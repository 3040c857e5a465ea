import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { parseDuration, parseTimerDuration } from '../../core/duration.js'
import { assertSqlTransactions, type SqlTransactions, type SqlValue, WORK_SAVEPOINT } from '../../core/sql-transactions.js'
import { assertRecordStep, stepsFromJson } from '../../core/steps-store.js'
import {
  type AcquireResult,
  DEFAULT_ABANDONED_RETENTION_MS,
  type IdempotencyStore,
  type ListFilter,
  type Outcome,
  type SavepointCommand,
  type StoredRecord,
  type TransactionalStore,
} from '../../core/store.js'
import { assertFingerprint, assertIdentity, assertOptionalPositiveInteger, assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { listLimit } from '../records.js'
import { batchStatements } from './batch-statements.js'
import { type AcquireInput, type FencedInput, fitsBatch, type GroupCommits, groupCommits, type KeyInput, lostRaces } from './batches.js'
import { BoundedPool } from './bounded.js'
import { heldRows } from './held-rows.js'
import { isRetryable, rowHeld, toStoreError } from './mysql-errors.js'
import type { MySqlStoreOptions } from './options.js'
import type { MySqlConnectionLike, MySqlPoolLike, MySqlTransaction, MySqlValue, WriteResult } from './pool.js'
import { completeValues, identity, liveAnswer, type Row, toRecord } from './records.js'
import { migrate } from './schema.js'
import { bind, COLUMNS, NOW_MS, type Statement, type Statements, statements } from './statements.js'
import { completeOn, runTransaction } from './transaction.js'

/**
 * Records in a MySQL 8 or MariaDB 10.6+ table (InnoDB), shared by any number of processes and
 * machines. Leases and expiry are decided by the database server's clock. Acquire reads the row
 * first (a live record answers at once); a new key is taken by a plain INSERT, anything else by one
 * `INSERT … ON DUPLICATE KEY UPDATE` that takes the row only when no live record holds it, then a
 * read of the row: atomic under any concurrency, no transaction held open across round trips.
 * Concurrent callers share: operations of one kind issued while one is in flight go out together
 * when it returns, one statement per kind and one commit (`groupCommit`, on by default; never inside
 * your transaction).
 * Implements `TransactionalStore` too: `ledger.runInTransaction` commits business writes and the
 * record together.
 * Create the table once with {@link MySqlStore.migrate} (or `idemkey migrate`).
 *
 * @example
 * import mysql from 'mysql2/promise'
 * const store = new MySqlStore({ pool: mysql.createPool('mysql://app@127.0.0.1/app') })
 * await store.migrate()
 * const ledger = new Ledger({ store })
 */
export class MySqlStore<Tx = MySqlTransaction> implements IdempotencyStore, TransactionalStore<Tx> {
  readonly name = 'mysql'
  readonly serverClock = true
  /** The table this store reads and writes. */
  readonly table: string
  readonly #sql: Statements
  readonly #lockRetries: number
  /** The pool as given or opened: your transactions and `migrate()` run on it. */
  #pool: MySqlPoolLike | undefined
  /** The same pool with every statement bounded by `queryTimeout`: the store's own statements run on it. */
  #bounded: BoundedPool | undefined
  /** The one close(), once asked for. */
  #closing: Promise<void> | undefined
  readonly #queryTimeoutMs: number
  readonly #opening: Promise<MySqlPoolLike> | undefined
  readonly #ownsPool: boolean
  /** The user's data layer, when `transactions` was given: `transaction()` runs in it. */
  readonly #tool: SqlTransactions<Tx> | undefined
  /** Group commit of the pool path (absent with `groupCommit: false`). */
  readonly #groups: GroupCommits | undefined

  constructor(options: MySqlStoreOptions<Tx>) {
    const table = options?.table ?? 'idemkey_records'
    // At most 53 characters: index names append up to 11 (`_created_at`), and MySQL allows 64.
    if (typeof table !== 'string' || !/^[A-Za-z_][A-Za-z0-9_]{0,52}$/.test(table)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `MySqlStore table "${table}" must be a plain SQL identifier (letters, digits, underscore).`,
      )
    }
    assertOptionalPositiveInteger(options?.connectionLimit, 'MySqlStore connectionLimit')
    if ((options?.pool === undefined) === (options?.uri === undefined)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'MySqlStore needs exactly one of { pool } (a mysql2/promise pool) or { uri } (mysql://user:password@host:port/database).',
      )
    }
    this.table = table
    const retentionMs = parseDuration(options.abandonedRetention ?? DEFAULT_ABANDONED_RETENTION_MS, 'abandonedRetention')
    this.#sql = statements(table, retentionMs)
    this.#lockRetries = options.lockRetries ?? 5
    if (!Number.isSafeInteger(this.#lockRetries) || this.#lockRetries < 0) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `MySqlStore lockRetries must be a non-negative integer, got ${String(options.lockRetries)}.`,
      )
    }
    this.#queryTimeoutMs = parseTimerDuration(options.queryTimeout ?? '10s', 'queryTimeout')
    if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'MySqlStore', 'mysql')
    this.#tool = options.transactions
    this.#ownsPool = options.pool === undefined
    if (options.pool) this.#pool = options.pool
    else {
      const connectTimeout = parseDuration(options.connectionTimeout ?? '5s', 'connectionTimeout')
      this.#opening = openPool(options.uri as string, options.connectionLimit ?? 10, connectTimeout)
    }
    // An open that fails is reported by the first operation; never as an unhandled rejection.
    this.#opening?.catch(() => {})
    if (options.groupCommit ?? true) {
      this.#groups = groupCommits({
        sql: batchStatements(table, retentionMs),
        query: (operation, sql, values) => this.#once(operation, async (pool) => (await pool.query(sql, values))[0]),
        transaction: (operation, fn) => this.#once(operation, (pool) => batchTransaction(pool, fn)),
        one: {
          acquire: (input) => this.#acquireOne(input),
          get: (input) => this.#getOne(input),
          renew: async (input) => (await this.#write('renew', this.#sql.renew, input)) === 1,
          complete: async (input) => (await this.#write('complete', this.#sql.complete, input)) === 1,
          release: async (input) => (await this.#write('release', this.#sql.release, input)) === 1,
        },
      })
    }
  }

  /** Creates the table (or upgrades it) if needed; safe to call on every start, from many processes at once. */
  async migrate(): Promise<void> {
    await migrate((await this.#ready('migrate')).unbounded, this.table)
  }

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    assertIdentity(scope, key)
    assertFingerprint(fingerprint)
    assertPositiveInteger(leaseMs, 'leaseMs')
    const input = { ...identity(scope, key), fingerprint, leaseMs }
    return this.#groups ? this.#groups.acquire.run(input) : this.#acquireOne(input)
  }

  async #acquireOne({ fingerprint, leaseMs, ...id }: AcquireInput): Promise<AcquireResult> {
    // Most acquires meet a live record (a replay, a duplicate in flight) or no record at all, so a
    // plain read comes first: it answers the first kind without a write. For no record, a plain
    // INSERT takes the key (a duplicate-key error means another caller was faster). Otherwise, or
    // after losing that race, the conditional upsert decides and its claim tells who won.
    const seen = (await this.#read('acquire', this.#sql.peek, id))[0]
    if (seen !== undefined) {
      const answer = liveAnswer(seen, fingerprint)
      if (answer) return answer
      // A takeover: unless another transaction holds the row (a holder that completed the record in
      // its own transaction, not committed yet), which the upsert would wait for. In flight, then, for
      // the ledger to wait on; when it ends is not known here, the lease asked for is the hint.
      if (await this.#held(id)) return { kind: 'in_progress', lockedUntilMs: Date.now() + leaseMs }
    } else if (await this.#insert({ ...id, fingerprint, lease: leaseMs, claim: randomBytes(16) })) {
      return { kind: 'acquired', token: 1 }
    }
    // When the upsert takes nothing, the read says why. If the row changed in between so that it is
    // takeable again (released, expired, evicted), try again.
    for (let round = 0; round < 100; round++) {
      const claim = randomBytes(16)
      await this.#write('acquire', this.#sql.acquire, { ...id, fingerprint, lease: leaseMs, claim })
      const row = (await this.#read('acquire', this.#sql.acquired, { ...id, claim }))[0]
      if (row === undefined) continue
      if (Number(row.mine) === 1) {
        const steps = stepsFromJson(row.steps)
        return steps ? { kind: 'acquired', token: Number(row.token), steps } : { kind: 'acquired', token: Number(row.token) }
      }
      const answer = liveAnswer(row, fingerprint)
      if (answer) return answer
    }
    throw lostRaces(id.key)
  }

  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    assertIdentity(scope, key)
    assertPositiveInteger(leaseMs, 'leaseMs')
    return this.#fenced('renew', { ...identity(scope, key), token, lease: leaseMs })
  }

  async complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return this.#fenced('complete', completeValues(scope, key, token, outcome, ttlMs) as FencedInput)
  }

  /** A fenced write on the pool path: batched with concurrent ones of its kind (when small enough), or its single UPDATE. */
  async #fenced(operation: 'renew' | 'complete' | 'release', input: FencedInput): Promise<boolean> {
    if (this.#groups && fitsBatch(input)) return this.#groups[operation].run(input)
    return (await this.#write(operation, this.#sql[operation], input)) === 1
  }

  /**
   * Runs `fn` in a transaction on one pool connection (docs/mysql.md, "Business writes and the record in one transaction"): commits when it resolves, rolls back
   * when it throws. Use it through `ledger.runInTransaction`, or with {@link MySqlStore.completeInTransaction}.
   * With the `transactions` option, it is your tool's transaction instead.
   */
  async transaction<R>(fn: (tx: Tx) => Promise<R>): Promise<R> {
    if (this.#tool) return this.#tool.transaction(fn)
    return runTransaction((await this.#ready('transaction')).unbounded, this.table, fn as unknown as (tx: MySqlTransaction) => Promise<R>)
  }

  /**
   * `complete` inside `tx`. The row stays locked until `tx` ends, so no takeover can slip in between;
   * `false` means the token is no longer current and the caller must roll back.
   */
  async completeInTransaction(tx: Tx, scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    return this.#writeIn(tx, 'completeInTransaction', identity(scope, key), token, completeValues(scope, key, token, outcome, ttlMs))
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
      else await (tx as unknown as MySqlTransaction).query(text)
    } catch (error) {
      // errno 1305: the savepoint is gone with the whole transaction, which InnoDB rolled back (a deadlock).
      if ((error as { errno?: unknown } | null)?.errno === 1305) {
        throw new IdempotencyError(
          'STORE_UNAVAILABLE',
          `mysql: ${text}${tool ? ` (through ${tool.tool})` : ''}: the transaction is no longer open, so the record is not completed. InnoDB rolls a whole transaction back on a deadlock (errno 1213), business writes included: let a deadlock error propagate out of the work, and a retry runs it again in a new transaction.`,
          { cause: error },
        )
      }
      throw toStoreError(tool ? `${text} (through ${tool.tool})` : text, error, this.table)
    }
  }

  /** One UPDATE of the record's `steps`, fenced by token (docs/steps.md). */
  async recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    assertRecordStep(scope, key, token, name, result)
    return (await this.#write('recordStep', this.#sql.recordStep, { ...identity(scope, key), token, name, result })) === 1
  }

  /** `recordStep` inside `tx`: the step commits with the transaction's business writes, or rolls back with them. */
  async recordStepInTransaction(tx: Tx, scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    assertRecordStep(scope, key, token, name, result)
    const id = identity(scope, key)
    return this.#writeIn(tx, 'recordStepInTransaction', id, token, { ...id, token, name, result })
  }

  /**
   * One fenced UPDATE inside `tx` (the store's connection, or the tool's transaction); `true` when it
   * changed the row. The store's own connection is watched (transaction.ts); through a tool, on MariaDB,
   * the statement also asks that the transaction be open (statements.ts, WHILE_OPEN), and when it changes
   * nothing while the record is still this attempt's, the transaction has ended under the work.
   */
  async #writeIn(
    tx: Tx,
    operation: 'completeInTransaction' | 'recordStepInTransaction',
    id: KeyInput,
    token: number,
    values: Record<string, MySqlValue>,
  ): Promise<boolean> {
    if (!this.#tool) {
      const statement = operation === 'completeInTransaction' ? this.#sql.complete : this.#sql.recordStep
      return completeOn(tx as unknown as MySqlTransaction, this.table, statement, values)
    }
    const statement = operation === 'completeInTransaction' ? this.#sql.completeInToolTransaction : this.#sql.recordStepInToolTransaction
    const through = `${operation} (through ${this.#tool.tool})`
    let changed: boolean
    try {
      changed = (await this.#tool.execute(tx, statement.sql, bind(statement, values) as SqlValue[])).count === 1
    } catch (error) {
      throw toStoreError(through, error, this.table)
    }
    if (changed) return true
    // Fenced out (another holder's token, or no longer in progress), or, on MariaDB, no transaction open:
    // the record as committed tells. It is still this attempt's only in the second case.
    const record = (await this.#read(operation, this.#sql.get, { ...id }))[0]
    if (record === undefined || record.status !== 'in_progress' || Number(record.token) !== token) return false
    throw new IdempotencyError(
      'STORE_UNAVAILABLE',
      `mysql: ${through}: the transaction is no longer open on its connection, so the record is not completed. InnoDB rolls a whole transaction back on a deadlock (errno 1213), business writes included, and the connection goes on in autocommit: work that caught the error and carried on wrote outside any transaction, and what it wrote stays written. An implicit commit (DDL, LOCK TABLES) or a COMMIT sent through ${this.#tool.tool} ends it too. Let a deadlock error propagate out of the work: the record is released, and a retry runs the work again in a new transaction.`,
    )
  }

  async release(scope: string, key: string, token: number): Promise<boolean> {
    assertIdentity(scope, key)
    return this.#fenced('release', { ...identity(scope, key), token })
  }

  async get(scope: string, key: string): Promise<StoredRecord | null> {
    assertIdentity(scope, key)
    const input = identity(scope, key)
    return this.#groups ? this.#groups.get.run(input) : this.#getOne(input)
  }

  async #getOne(input: KeyInput): Promise<StoredRecord | null> {
    const row = (await this.#read('get', this.#sql.get, { ...input }))[0]
    return row ? toRecord(row) : null
  }

  async list(filter: ListFilter = {}): Promise<StoredRecord[]> {
    const limit = listLimit(filter)
    if (limit === 0) return []
    const where: string[] = []
    const values: MySqlValue[] = []
    if (!filter.includeExpired) where.push(`expires_at > ${NOW_MS}`)
    if (filter.scope !== undefined) {
      where.push('scope = ?')
      values.push(Buffer.from(filter.scope, 'utf8'))
    }
    if (filter.status !== undefined) {
      where.push('status = ?')
      values.push(filter.status)
    }
    if (filter.createdBeforeMs !== undefined) {
      where.push('created_at <= ?')
      values.push(filter.createdBeforeMs)
    }
    const sql = `SELECT ${COLUMNS} FROM \`${this.table}\` ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
      ORDER BY created_at, scope, \`key\` LIMIT ${limit}`
    const rows = await this.#run('list', async (pool) => (await pool.query(sql, values))[0] as Row[])
    return rows.map(toRecord)
  }

  /** Whether an open transaction holds each record's row (a holder inside its transaction), asked without waiting: held-rows.ts. */
  async heldInTransaction(records: ReadonlyArray<{ scope: string; key: string }>): Promise<boolean[]> {
    if (records.length === 0) return []
    return this.#run('heldInTransaction', (pool) => heldRows(pool, this.table, records))
  }

  async purgeExpired(limit: number): Promise<number> {
    assertPositiveInteger(limit, 'limit')
    return this.#write('purgeExpired', this.#sql.purge(limit), {})
  }

  async evict(scope: string, key: string): Promise<boolean> {
    assertIdentity(scope, key)
    return (await this.#write('evict', this.#sql.evict, identity(scope, key))) > 0
  }

  /** Ends the pool the store opened from `uri`; a pool you passed in stays open. Once: a second call waits for the first. */
  close(): Promise<void> {
    this.#closing ??= this.#close()
    return this.#closing
  }

  async #close(): Promise<void> {
    if (!this.#ownsPool) return
    // The calls made before close() are answered first: callers queued behind a batch in flight go
    // out in the next batch, which an ended pool would fail with STORE_UNAVAILABLE.
    if (this.#groups) await Promise.all(Object.values(this.#groups).map((group) => group.idle()))
    const pool = this.#pool ?? (await this.#opening?.catch(() => undefined))
    const bounded = this.#bounded ?? (pool && new BoundedPool(pool, this.#queryTimeoutMs))
    this.#pool = undefined
    this.#bounded = undefined
    // Bounded: connections that never answer the goodbye (half-open ones) are destroyed.
    await bounded?.end()
  }

  /** The pool, opened if needed (the store uses it through a BoundedPool). */
  async #raw(operation: string): Promise<MySqlPoolLike> {
    if (this.#pool) return this.#pool
    try {
      this.#pool = await (this.#opening as Promise<MySqlPoolLike>)
      return this.#pool
    } catch (error) {
      throw toStoreError(operation, error, this.table)
    }
  }

  /** The pool with the store's statements bounded by queryTimeout (`unbounded`: your transactions and migrate). */
  async #ready(operation: string): Promise<BoundedPool> {
    if (this.#bounded) return this.#bounded
    const pool = await this.#raw(operation)
    this.#bounded ??= new BoundedPool(pool, this.#queryTimeoutMs)
    return this.#bounded
  }

  async #write(operation: string, statement: Statement, values: Record<string, MySqlValue>): Promise<number> {
    return this.#run(
      operation,
      async (pool) => ((await pool.execute(statement.sql, bind(statement, values)))[0] as WriteResult).affectedRows,
    )
  }

  /** A plain INSERT of a new record: `false` when the key already exists (ER_DUP_ENTRY, 1062). */
  async #insert(values: Record<string, MySqlValue>): Promise<boolean> {
    const statement = this.#sql.insert
    return this.#run('acquire', async (pool) => {
      try {
        await pool.execute(statement.sql, bind(statement, values))
        return true
      } catch (error) {
        if ((error as { errno?: number } | null)?.errno === 1062) return false
        throw error
      }
    })
  }

  /** Whether another transaction holds the record's row now (statements.ts, `held`): asked once, never waited for. */
  async #held(values: Record<string, MySqlValue>): Promise<boolean> {
    const statement = this.#sql.held
    return this.#once('acquire', (pool) => pool.execute(statement.sql, bind(statement, values))).then(
      () => false,
      (error: unknown) => {
        if (rowHeld(error)) return true
        throw error
      },
    )
  }

  async #read(operation: string, statement: Statement, values: Record<string, MySqlValue>): Promise<Row[]> {
    return this.#run(operation, async (pool) => (await pool.execute(statement.sql, bind(statement, values)))[0] as Row[])
  }

  /** Runs one step of a batch, once: a batch that fails is answered by the group commit (docs/mysql.md, "Group commit"). */
  async #once<R>(operation: string, step: (pool: MySqlPoolLike) => Promise<R>): Promise<R> {
    const pool = await this.#ready(operation)
    try {
      return await step(pool)
    } catch (error) {
      throw toStoreError(operation, error, this.table)
    }
  }

  /**
   * Runs one statement. Each is its own (autocommit) transaction: after a deadlock or a lock wait
   * timeout the server rolled it back, so it is retried, a bounded number of times, after a short
   * random pause. Other driver errors become STORE_UNAVAILABLE (STORE_SCHEMA for a missing table).
   */
  async #run<R>(operation: string, step: (pool: MySqlPoolLike) => Promise<R>): Promise<R> {
    const pool = await this.#ready(operation)
    for (let attempt = 0; ; attempt++) {
      try {
        return await step(pool)
      } catch (error) {
        if (!isRetryable(error) || attempt >= this.#lockRetries) throw toStoreError(operation, error, this.table)
        await sleep(Math.random() * 5 * (attempt + 1))
      }
    }
  }
}

async function openPool(uri: string, connectionLimit: number, connectTimeout: number): Promise<MySqlPoolLike> {
  let mysql: { createPool(options: object): unknown }
  try {
    mysql = ((await import('mysql2/promise')) as unknown as { default: typeof mysql }).default
  } catch (error) {
    throw new IdempotencyError('INVALID_OPTION', 'MySqlStore({ uri }) needs the mysql2 package: npm install mysql2', { cause: error })
  }
  return mysql.createPool({ uri, connectionLimit, connectTimeout, supportBigNumbers: true }) as MySqlPoolLike
}

/**
 * A batch's transaction on one pool connection: rolled back when `fn` throws. Errors come back raw,
 * to be typed for the batch's operation (as its single statement's would be).
 */
async function batchTransaction<R>(pool: MySqlPoolLike, fn: (connection: MySqlConnectionLike) => Promise<R>): Promise<R> {
  const connection = await pool.getConnection()
  try {
    await connection.query('START TRANSACTION')
    const result = await fn(connection)
    await connection.query('COMMIT')
    return result
  } catch (error) {
    // A failed rollback leaves nothing to undo that the server will not undo when the connection goes.
    await connection.query('ROLLBACK').catch(() => {})
    throw error
  } finally {
    connection.release()
  }
}
