/**
 * idemkey/graphile-worker against a real PostgreSQL: the same work added again (same jobKey) completes
 * without running its effect again; a job that threw is retried by graphile-worker and resumes after its
 * last recorded step; a payload without a key is refused with what to do; a worker process SIGKILLed
 * mid-job leaves its job locked until `forceUnlockWorkers`, then another worker process resumes it.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { join } from 'node:path'
import { makeWorkerUtils, type Runner, run } from 'graphile-worker'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/postgres-store.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotentTask } from '../src/jobs/graphile-worker/index.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const WORKER = join(import.meta.dirname, 'fixtures/graphile-worker/worker.ts')

describe.skipIf(skip !== undefined)('idemkey/graphile-worker on a real PostgreSQL', () => {
  const id = randomUUID().slice(0, 8)
  const schema = `graphile_worker_${id}`
  const table = `idemkey_graphile_${id}`
  let pool: pg.Pool
  let runner: Runner
  const calls: string[] = []
  const failures: string[] = []
  let failOnce = true
  const children: ChildProcess[] = []

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: URL, max: 6 })
    const store = new PostgresStore({ pool, table })
    await store.migrate()
    await pool.query(`CREATE TABLE effects_${id} (job_key text NOT NULL, step text NOT NULL)`)
    const ledger = new Ledger({ store, lease: 2_000 })
    runner = await run({
      connectionString: URL,
      schema,
      concurrency: 2,
      noHandleSignals: true,
      pollInterval: 100,
      logger: new (await import('graphile-worker')).Logger(() => () => {}),
      taskList: {
        charge: idempotentTask<{ order: string }>(
          async (payload, _helpers, ctx) => {
            await ctx.step('charge', () => calls.push(`charge ${payload.order}`))
            if (payload.order === 'flaky' && failOnce) {
              failOnce = false
              throw new Error('the bank timed out')
            }
            await ctx.step('email', () => calls.push(`email ${payload.order}`))
          },
          { ledger },
        ),
      },
    })
    // job:error for each failed attempt (retried or not).
    runner.events.on('job:error', ({ error }) => failures.push(String((error as Error).message)))
  }, 60_000)
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    await runner?.stop()
    await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE; DROP TABLE IF EXISTS ${table}, effects_${id}`)
    await pool.end()
  })

  const done = async (jobKey: string) => {
    for (let i = 0; i < 100; i++) {
      const { rows } = await pool.query(`SELECT count(*)::int AS n FROM ${schema}._private_jobs WHERE key = $1`, [jobKey])
      if (rows[0].n === 0) return
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    throw new Error(`job ${jobKey} did not finish`)
  }

  it('runs the same work added twice under one jobKey once', async () => {
    await runner.addJob('charge', { order: 'o-1' }, { jobKey: 'order-o-1' })
    await done('order-o-1')
    await runner.addJob('charge', { order: 'o-1' }, { jobKey: 'order-o-1' })
    await done('order-o-1')
    expect(calls.filter((c) => c.endsWith(' o-1'))).toEqual(['charge o-1', 'email o-1'])
  })

  it('retries a job that threw and resumes it after its last recorded step', async () => {
    await runner.addJob('charge', { order: 'flaky' }, { jobKey: 'order-flaky', maxAttempts: 3 })
    // graphile-worker's first retry waits about e^1 s.
    for (let i = 0; i < 100 && !calls.includes('email flaky'); i++) await new Promise((resolve) => setTimeout(resolve, 100))
    expect(calls.filter((c) => c.endsWith(' flaky'))).toEqual(['charge flaky', 'email flaky'])
    expect(failures).toContain('the bank timed out')
  })

  it('refuses a job without a logical key, saying to add it with a jobKey', async () => {
    await runner.addJob('charge', { order: 'no-key' }, { maxAttempts: 1 })
    for (let i = 0; i < 50 && !failures.some((f) => /no logical key/.test(f)); i++) await new Promise((resolve) => setTimeout(resolve, 100))
    expect(failures.some((f) => /has no logical key: add it with a jobKey/.test(f))).toBe(true)
    expect(calls).not.toContain('charge no-key')
  })

  /** Starts a worker process (test/fixtures/graphile-worker/worker.ts); resolves with the id its jobs are locked under once it runs. */
  const start = (crash: boolean) =>
    new Promise<{ child: ChildProcess; lockedBy: string[] }>((resolve, reject) => {
      const child = spawn(process.execPath, ['--import', 'tsx', WORKER, schema, table, id], {
        env: { ...process.env, CRASH: crash ? '1' : '0' },
        stdio: ['ignore', 'pipe', 'inherit'],
      })
      children.push(child)
      child.once('error', reject)
      child.once('exit', (code, signal) => reject(new Error(`worker exited before it was ready: ${code ?? signal}`)))
      let out = ''
      child.stdout?.on('data', (chunk) => {
        out += chunk
        if (out.includes('\n')) resolve({ child, lockedBy: JSON.parse(out.slice(0, out.indexOf('\n'))).lockedBy })
      })
    })

  it('a worker process SIGKILLed after a recorded step: its job stays locked until forceUnlockWorkers, then another process resumes it; every job completes and each effect runs once', async () => {
    const utils = await makeWorkerUtils({
      connectionString: URL,
      schema,
      logger: new (await import('graphile-worker')).Logger(() => () => {}),
    })
    try {
      const crasher = await start(true)
      const died = new Promise((resolve) => crasher.child.once('exit', (_code, signal) => resolve(signal)))
      const keys = Array.from({ length: 6 }, (_, i) => `crash-${i}`)
      for (const key of keys) await utils.addJob('crash_charge', { order: key }, { jobKey: key, maxAttempts: 5 })
      expect(await died).toBe('SIGKILL')
      // graphile-worker frees a dead worker's jobs after 4 hours; whoever knows it died frees them now, by
      // the id they are locked under (0.18: the worker pool's id).
      const locked = await pool.query(`SELECT key FROM ${schema}._private_jobs WHERE locked_by = ANY($1)`, [crasher.lockedBy])
      expect(locked.rows).toEqual([{ key: keys[0] }])
      await utils.forceUnlockWorkers(crasher.lockedBy)
      await Promise.all([start(false), start(false)])
      // A duplicate of finished work, added while the others run.
      await utils.addJob('crash_charge', { order: keys[1] }, { jobKey: keys[1], maxAttempts: 5 })
      // A completed job is deleted; a failed one stays with its error.
      const remaining = async () =>
        (await pool.query(`SELECT key, attempts, last_error FROM ${schema}._private_jobs WHERE key = ANY($1)`, [keys])).rows
      for (let i = 0; i < 200 && (await remaining()).length > 0; i++) await new Promise((resolve) => setTimeout(resolve, 100))
      expect(await remaining()).toEqual([])
      const { rows } = await pool.query(`SELECT job_key, step, count(*)::int AS n FROM effects_${id} GROUP BY 1, 2`)
      const counts = new Map(rows.map((row) => [`${row.job_key} ${row.step}`, row.n]))
      for (const key of keys) {
        expect([counts.get(`${key} reserve`), counts.get(`${key} charge`), counts.get(`${key} email`)], key).toEqual([1, 1, 1])
      }
      expect(rows.length).toBe(keys.length * 3)
    } finally {
      for (const child of children) child.kill('SIGTERM')
      await utils.release()
    }
  }, 45_000)
})
