/**
 * pg-boss jobs whose effect runs once per logical key (docs/jobs.md): `idempotentHandler` wraps a
 * `boss.work(...)` handler. With `transactional: true` (a PostgresStore), the handler's business writes
 * and the job's record commit in one transaction: a crash before the commit leaves neither. With a
 * transactional pg-boss worker and a store made with `pgBossTransactions()`, that transaction is
 * pg-boss's own, and the job's completion commits in it too.
 */
import { AsyncLocalStorage } from 'node:async_hooks'
import { type Duration, runDurations } from '../../core/duration.js'
import { fingerprintOf } from '../../core/fingerprint.js'
import type { IntentContext, Ledger, RunResult, TransactionContext } from '../../core/ledger.js'
import type { SqlTransactions } from '../../core/sql-transactions.js'
import { assertFunctions } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'

/**
 * pg-boss's handler transaction: the `tx` that `boss.work(name, { transactional: true }, (jobs, tx) => …)`
 * hands its handler (pg-boss's `IDatabase`), in which pg-boss also completes the jobs.
 */
export interface PgBossDb {
  executeSql(text: string, values?: unknown[]): Promise<{ rows: unknown[] }>
}

/** The transaction of the pg-boss batch being handled, set by {@link idempotentHandler} for {@link pgBossTransactions}. */
const batchTransaction = new AsyncLocalStorage<PgBossDb>()

/**
 * Transactions for a `PostgresStore` on pg-boss's database (its `transactions` option) that join the
 * transaction of a transactional pg-boss worker: the record's completion, the handler's writes (through
 * `ctx.tx`, pg-boss's own `tx`) and pg-boss's completion of the job commit together, or not at all.
 * Each run takes a savepoint in that transaction, so a run that rolls back (its work threw, or its lease
 * was lost) takes back only its own writes. Only inside `boss.work(name, { transactional: true }, …)` with
 * `idempotentHandler(…, { transactional: true })`; elsewhere the store's transactions refuse with a
 * clear error, so give other code its own store (the same pool and table).
 *
 * @example
 * const store = new PostgresStore({ pool, table, transactions: pgBossTransactions() })
 * await boss.work('invoices', { transactional: true }, idempotentHandler(work, { ledger: new Ledger({ store }), key, transactional: true }))
 */
export function pgBossTransactions(): SqlTransactions<PgBossDb> {
  let savepoints = 0
  return {
    tool: 'pg-boss',
    dialect: 'postgres',
    async transaction(fn) {
      const db = batchTransaction.getStore()
      if (!db) {
        throw new IdempotencyError(
          'INVALID_OPTION',
          "pgBossTransactions() joins pg-boss's handler transaction, and there is none here: use this store's ledger only in boss.work(name, { transactional: true }, idempotentHandler(…, { transactional: true })), and give other code a PostgresStore of its own on the same pool and table.",
        )
      }
      const savepoint = `idemkey_run_${++savepoints}`
      await db.executeSql(`SAVEPOINT ${savepoint}`)
      let value: Awaited<ReturnType<typeof fn>>
      try {
        value = await fn(db)
      } catch (error) {
        // Back to before this run, in a transaction that goes on: pg-boss then fails (and rolls back) the batch.
        await db.executeSql(`ROLLBACK TO SAVEPOINT ${savepoint}`).catch(() => {})
        throw error
      }
      await db.executeSql(`RELEASE SAVEPOINT ${savepoint}`)
      return value
    },
    async execute(db, sql, values) {
      // Every statement the PostgreSQL store sends through a tool returns its rows.
      return { count: (await db.executeSql(sql, [...values])).rows.length }
    },
  }
}

/** The part of a pg-boss `Job` the wrapper reads (structural: any pg-boss 10+ fits). */
export interface PgBossJobLike<D> {
  id: string
  name: string
  data: D
}

interface CommonOptions<D> {
  ledger: Ledger
  /**
   * The job's logical key: the same for every send of the same piece of work (an order id, a request
   * key). pg-boss's job id is new at every `send`, so it cannot be the default.
   */
  key: (job: PgBossJobLike<D>) => string
  /** Namespace of the records. @default `pg-boss:<queue name>` */
  scope?: (job: PgBossJobLike<D>) => string
  /** What must be equal for two jobs under one key to be the same work. @default `job.data` */
  payload?: (job: PgBossJobLike<D>) => unknown
  lease?: Duration
  wait?: Duration
}

/**
 * With `perJobResults: true`, and pg-boss's own `perJobResults: true` on `boss.work` (pg-boss 12), each
 * job of a batch is settled alone: a job whose work throws fails (and is retried) by itself, the others
 * complete with their values; a key reused with other data is dead-lettered (no retry can mend it).
 * Without it, one job that throws fails its whole batch, and one that always throws takes its batch
 * neighbours' retries with it. Not with pg-boss's transactional worker (pg-boss refuses the two together).
 */
interface PerJobOption {
  perJobResults?: boolean
}

/** Options of {@link idempotentHandler}. */
export type PgBossIdempotencyOptions<D> = CommonOptions<D> & { transactional?: false } & PerJobOption
/** Options of {@link idempotentHandler} with the handler's writes in the record's transaction. */
export type PgBossTransactionalOptions<D> = CommonOptions<D> & { transactional: true } & PerJobOption

/**
 * One job's outcome for a `perJobResults` worker: pg-boss's `JobResult`. `completed` carries the job's
 * value, `failed` the error (retried per the queue's settings), `deadletter` a reused key's error
 * (failed for good, to the queue's dead letter queue if it has one).
 */
export interface PgBossJobResult<R> {
  id: string
  status: 'completed' | 'failed' | 'deadletter'
  output?: R | Error
}

/** A key reused with other data: the job fails (and pg-boss retries it per its retry settings: set `retryLimit: 0` for such errors, or inspect `code`). */
export class PgBossKeyReusedError extends IdempotencyError {
  constructor(queue: string, key: string) {
    super(
      'FINGERPRINT_MISMATCH',
      `idemkey: job key "${key}" in queue "${queue}" was used before for other data, so this job was not run. Two different pieces of work share one key: give each its own key.`,
    )
  }
}

/**
 * Wraps a pg-boss work handler (it gets the batch of jobs; each job is run through the ledger in turn).
 * A job's value is recorded: the same work sent again completes with the first value, without running;
 * a retried job (pg-boss's retry after a throw or an expired lock) resumes after its last recorded
 * step (`ctx.step`); a job whose key another worker holds waits for it, then replays or takes over.
 *
 * @example
 * await boss.work('payments', idempotentHandler(async (job, ctx) => charge(job.data), { ledger, key: (job) => job.data.orderId }))
 */
export function idempotentHandler<D, R>(
  handler: (job: PgBossJobLike<D>, ctx: IntentContext) => Promise<R> | R,
  options: PgBossIdempotencyOptions<D> & { perJobResults: true },
): (jobs: Array<PgBossJobLike<D>>) => Promise<Array<PgBossJobResult<R>>>
export function idempotentHandler<D, R, Tx = unknown>(
  handler: (job: PgBossJobLike<D>, ctx: TransactionContext<Tx>) => Promise<R> | R,
  options: PgBossTransactionalOptions<D> & { perJobResults: true },
): (jobs: Array<PgBossJobLike<D>>) => Promise<Array<PgBossJobResult<R>>>
export function idempotentHandler<D, R>(
  handler: (job: PgBossJobLike<D>, ctx: IntentContext) => Promise<R> | R,
  options: PgBossIdempotencyOptions<D>,
): (jobs: Array<PgBossJobLike<D>>, tx?: PgBossDb) => Promise<R | R[]>
export function idempotentHandler<D, R, Tx = unknown>(
  handler: (job: PgBossJobLike<D>, ctx: TransactionContext<Tx>) => Promise<R> | R,
  options: PgBossTransactionalOptions<D>,
): (jobs: Array<PgBossJobLike<D>>, tx?: PgBossDb) => Promise<R | R[]>
export function idempotentHandler<D, R>(
  handler: (job: PgBossJobLike<D>, ctx: never) => Promise<R> | R,
  options: PgBossIdempotencyOptions<D> | PgBossTransactionalOptions<D>,
): (jobs: Array<PgBossJobLike<D>>, tx?: PgBossDb) => Promise<R | R[] | Array<PgBossJobResult<R>>> {
  const ledger = options?.ledger
  if (!ledger || typeof ledger.run !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'idempotentHandler(handler, { ledger, key }) needs a Ledger: new Ledger({ store }).')
  }
  if (typeof options.key !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      "idempotentHandler(handler, { ledger, key }) needs key: (job) => the work's logical key (pg-boss makes a new job id at every send).",
    )
  }
  assertFunctions('idempotentHandler()', { handler, scope: options.scope, payload: options.payload }, { required: ['handler'] })
  if (options.perJobResults !== undefined && typeof options.perJobResults !== 'boolean') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `idempotentHandler(): perJobResults is true or false (as on boss.work), got ${JSON.stringify(options.perJobResults)}.`,
    )
  }
  // Checked here, so a bad duration fails where the worker is set up, not every job it takes.
  const runOptions = runDurations({ lease: options.lease, wait: options.wait })
  const one = async (job: PgBossJobLike<D>, batch: Map<string, { fingerprint: string; value: R }> | undefined): Promise<R> => {
    const key = options.key(job)
    const scope = options.scope ? options.scope(job) : `pg-boss:${job.name}`
    const intent = { key, scope, payload: options.payload ? options.payload(job) : (job.data ?? null) }
    const seen = batch && { id: JSON.stringify([scope, key]), fingerprint: fingerprintOf(intent.payload ?? null) }
    const earlier = seen && batch?.get(seen.id)
    if (earlier) {
      // Run earlier in this batch: its record is completed in pg-boss's transaction, not yet committed.
      if (earlier.fingerprint !== seen.fingerprint) throw new PgBossKeyReusedError(job.name, key)
      return earlier.value
    }
    const work = (ctx: IntentContext) => handler(job, ctx as never)
    const result: RunResult<R> = options.transactional
      ? await ledger.runInTransaction<R>(intent, work as never, runOptions)
      : await ledger.run<R>(intent, work, runOptions)
    switch (result.kind) {
      case 'executed':
      case 'replayed':
        if (seen) batch?.set(seen.id, { fingerprint: seen.fingerprint, value: result.value })
        return result.value
      case 'mismatch':
        throw new PgBossKeyReusedError(job.name, key)
      case 'in_progress':
        // pg-boss retries the job per its retry settings; by then the other holder has finished or died.
        throw new IdempotencyError(
          'IN_PROGRESS',
          `idemkey: job key "${key}" is being processed by another worker; pg-boss will retry this job.`,
        )
    }
  }
  const all = async (jobs: Array<PgBossJobLike<D>>, joined: boolean) => {
    // In pg-boss's transaction a job's record completes uncommitted, its row locked until the batch
    // commits: a later job of the same batch under the same key waited on that lock from the pool (for
    // the store's timeout, then the whole batch failed, again at each retry). It gets the earlier job's
    // value instead, as a replay would, or the reused-key error.
    const batch = joined && jobs.length > 1 ? new Map<string, { fingerprint: string; value: R }>() : undefined
    const values: R[] = []
    for (const job of jobs) values.push(await one(job, batch))
    return jobs.length === 1 ? (values[0] as R) : values
  }
  if (options.perJobResults === true) {
    // Each job settled alone (pg-boss's perJobResults): one that throws fails by itself.
    return async (jobs) => {
      const results: Array<PgBossJobResult<R>> = []
      for (const job of jobs) {
        try {
          results.push({ id: job.id, status: 'completed', output: await one(job, undefined) })
        } catch (error) {
          const output = error instanceof Error ? error : new Error(String(error))
          results.push({ id: job.id, status: error instanceof PgBossKeyReusedError ? 'deadletter' : 'failed', output })
        }
      }
      return results
    }
  }
  return (jobs, tx) =>
    // A transactional worker's transaction, for a store made with pgBossTransactions() to join.
    options.transactional && tx !== undefined ? batchTransaction.run(tx, () => all(jobs, true)) : all(jobs, false)
}
