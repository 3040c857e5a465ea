/**
 * pg-boss jobs whose effect runs once per logical key (docs/jobs.md): `idempotentHandler` wraps a
 * `boss.work(...)` handler. With `transactional: true` (a PostgresStore), the handler's business writes
 * and the job's record commit in one transaction: a crash before the commit leaves neither.
 */
import type { Duration } from '../../core/duration.js'
import type { IntentContext, Ledger, RunResult, TransactionContext } from '../../core/ledger.js'
import { IdempotencyError } from '../../errors.js'

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

/** Options of {@link idempotentHandler}. */
export type PgBossIdempotencyOptions<D> = CommonOptions<D> & { transactional?: false }
/** Options of {@link idempotentHandler} with the handler's writes in the record's transaction. */
export type PgBossTransactionalOptions<D> = CommonOptions<D> & { transactional: true }

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
  options: PgBossIdempotencyOptions<D>,
): (jobs: Array<PgBossJobLike<D>>) => Promise<R | R[]>
export function idempotentHandler<D, R, Tx = unknown>(
  handler: (job: PgBossJobLike<D>, ctx: TransactionContext<Tx>) => Promise<R> | R,
  options: PgBossTransactionalOptions<D>,
): (jobs: Array<PgBossJobLike<D>>) => Promise<R | R[]>
export function idempotentHandler<D, R>(
  handler: (job: PgBossJobLike<D>, ctx: never) => Promise<R> | R,
  options: PgBossIdempotencyOptions<D> | PgBossTransactionalOptions<D>,
): (jobs: Array<PgBossJobLike<D>>) => Promise<R | R[]> {
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
  const runOptions = {
    ...(options.lease !== undefined ? { lease: options.lease } : {}),
    ...(options.wait !== undefined ? { wait: options.wait } : {}),
  }
  const one = async (job: PgBossJobLike<D>): Promise<R> => {
    const key = options.key(job)
    const scope = options.scope ? options.scope(job) : `pg-boss:${job.name}`
    const intent = { key, scope, payload: options.payload ? options.payload(job) : (job.data ?? null) }
    const work = (ctx: IntentContext) => handler(job, ctx as never)
    const result: RunResult<R> = options.transactional
      ? await ledger.runInTransaction<R>(intent, work as never, runOptions)
      : await ledger.run<R>(intent, work, runOptions)
    switch (result.kind) {
      case 'executed':
      case 'replayed':
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
  return async (jobs) => {
    const values: R[] = []
    for (const job of jobs) values.push(await one(job))
    return jobs.length === 1 ? (values[0] as R) : values
  }
}
