/**
 * graphile-worker tasks whose effect runs once per logical key (docs/jobs.md): `idempotentTask` wraps a
 * task. The key is the job's `jobKey` when the producer set one (`addJob(task, payload, { jobKey })`),
 * else what `key` derives from the payload; graphile-worker's numeric job id changes at every add.
 */
import { type Duration, runDurations } from '../../core/duration.js'
import type { IntentContext, Ledger } from '../../core/ledger.js'
import { assertFunctions } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'

/** The part of graphile-worker's task helpers the wrapper reads (structural: any 0.16+ fits). */
export interface GraphileHelpersLike {
  job: { id: string; key: string | null; task_identifier: string; attempts: number }
}

/** Options of {@link idempotentTask}. */
export interface GraphileIdempotencyOptions<P> {
  ledger: Ledger
  /** The work's logical key when the producer sets no `jobKey`. */
  key?: (payload: P, helpers: GraphileHelpersLike) => string
  /** Namespace of the records. @default `graphile-worker:<task identifier>` */
  scope?: (payload: P, helpers: GraphileHelpersLike) => string
  lease?: Duration
  wait?: Duration
}

/**
 * Wraps a task `(payload, helpers) => ...`. The same work added again completes at once (the first run's
 * effect is recorded), a retried job (graphile-worker retries a throw with backoff, and a job whose worker
 * died once its lock expires) resumes after its last recorded step, and a key reused with another payload
 * fails with `FINGERPRINT_MISMATCH` (graphile-worker retries it up to `maxAttempts`: it keeps failing).
 * The task gets the ledger's context as a third argument (`ctx.step` for durable steps). Its value is not
 * recorded (graphile-worker does not use it).
 *
 * @example
 * await run({ connectionString, taskList: { charge: idempotentTask(async (payload, helpers, ctx) => ..., { ledger }) } })
 */
export function idempotentTask<P = unknown, H extends GraphileHelpersLike = GraphileHelpersLike>(
  task: (payload: P, helpers: H, ctx: IntentContext) => Promise<unknown> | unknown,
  options: GraphileIdempotencyOptions<P>,
): (payload: unknown, helpers: H) => Promise<void> {
  const ledger = options?.ledger
  if (!ledger || typeof ledger.run !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'idempotentTask(task, { ledger }) needs a Ledger: new Ledger({ store }).')
  }
  assertFunctions('idempotentTask()', { task, key: options.key, scope: options.scope }, { required: ['task'] })
  // Checked here, so a bad duration fails where the worker is set up, not every job it takes.
  const runOptions = runDurations({ lease: options.lease, wait: options.wait })
  return async (raw, helpers) => {
    const payload = raw as P
    const key = helpers.job.key ?? options.key?.(payload, helpers)
    if (!key) {
      throw new IdempotencyError(
        'KEY_INVALID',
        `idemkey: job ${helpers.job.id} (${helpers.job.task_identifier}) has no logical key: add it with a jobKey (addJob(task, payload, { jobKey })), or give idempotentTask a key: (payload) => ...`,
      )
    }
    const scope = options.scope ? options.scope(payload, helpers) : `graphile-worker:${helpers.job.task_identifier}`
    // graphile-worker does nothing with a task's value, so none is stored: one JSON cannot hold (a row with
    // a bigint id, an HTTP response) failed the job after its effect, and each retry ran it again.
    const work = async (ctx: IntentContext) => {
      await task(payload, helpers, ctx)
      return null
    }
    const result = await ledger.run({ key, scope, payload: payload ?? null }, work, runOptions)
    if (result.kind === 'mismatch') {
      throw new IdempotencyError(
        'FINGERPRINT_MISMATCH',
        `idemkey: job key "${key}" was used before for another payload, so this job was not run.`,
      )
    }
    if (result.kind === 'in_progress') {
      throw new IdempotencyError(
        'IN_PROGRESS',
        `idemkey: job key "${key}" is being processed by another worker; graphile-worker will retry this job.`,
      )
    }
  }
}
