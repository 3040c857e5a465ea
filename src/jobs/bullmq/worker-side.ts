/**
 * What the BullMQ wrapper reads of the Worker running a job, and the job's mark of the record it holds.
 *
 * BullMQ keeps the Worker on the job it hands a processor (as the job's `queue`, not in its typings):
 * its `opts` (with `lockDuration`, the Worker's default applied) and its backend (`getBackend()`, which
 * reads a job's logs on any of BullMQ's backends). A sandboxed processor's job has neither: there the
 * wrapper falls back to BullMQ's default lock (30 s) and to waiting out a dead holder's lease.
 */
import type { Job } from 'bullmq'

/** BullMQ's default `lockDuration`, for a job whose Worker cannot be read (a sandboxed processor). */
export const BULLMQ_DEFAULT_LOCK_MS = 30_000

interface WorkerSide {
  opts?: { lockDuration?: unknown }
  getBackend?: () => {
    getJobLogs?: (jobId: string, start: number, end: number, asc: boolean) => Promise<{ logs: string[] }>
  }
}

function workerOf(job: Job<unknown>): WorkerSide | undefined {
  return (job as unknown as { queue?: WorkerSide }).queue
}

/** The `lockDuration` of the Worker running `job`: how long BullMQ's lock on it lasts unrenewed. */
export function lockDurationOf(job: Job<unknown>): number {
  const lockMs = workerOf(job)?.opts?.lockDuration
  return typeof lockMs === 'number' && lockMs > 0 ? lockMs : BULLMQ_DEFAULT_LOCK_MS
}

/** The lock token of this delivery of `job`: BullMQ hands it to the processor and also sets it on the job. */
export function lockTokenOf(job: Job<unknown>, handed: string | undefined): string | undefined {
  return handed ?? (typeof job.token === 'string' ? job.token : undefined)
}

/**
 * The mark, one line of the job's log (`job.log`), that says which record this job holds and with which
 * fencing token: `idemkey: holds ["<scope>","<key>"] with token <n>`. The next delivery of the same job
 * (BullMQ re-hands a stalled job under its own id) reads it back to tell its own dead holder from
 * another job of the same logical work.
 */
const MARK = /^idemkey: holds (\[.*\]) with token (\d+)$/
/** How many of the newest log lines are searched for the mark: the processor may log after it. */
const MARK_SEARCH = 50

/** Writes the mark. Never rejects: a mark that failed only costs a later delivery the wait for the lease. */
export function markHolder(job: Job<unknown>, scope: string, key: string, token: number): Promise<void> {
  try {
    return job.log(`idemkey: holds ${JSON.stringify([scope, key])} with token ${token}`).then(
      () => {},
      () => {},
    )
  } catch {
    return Promise.resolve()
  }
}

/**
 * The token an earlier delivery of `job` marked for (scope, key); `undefined` when there is no such mark or
 * no way to read it (a failed read only costs this delivery the wait for the lease, as without a mark).
 */
export async function markedToken(job: Job<unknown>, scope: string, key: string): Promise<number | undefined> {
  const backend = workerOf(job)?.getBackend?.()
  if (job.id === undefined || typeof backend?.getJobLogs !== 'function') return undefined
  const logs = await backend.getJobLogs(job.id, 0, MARK_SEARCH - 1, false).then(
    (read) => read.logs,
    () => [],
  )
  const identity = JSON.stringify([scope, key])
  for (const line of logs) {
    const match = MARK.exec(line)
    if (match) return match[1] === identity ? Number(match[2]) : undefined
  }
  return undefined
}
