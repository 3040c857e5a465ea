/**
 * idemkey/graphile-worker against a real PostgreSQL: the same work added again (same jobKey) completes
 * without running its effect again; a job that threw is retried by graphile-worker and resumes after its
 * last recorded step; a payload without a key is refused with what to do.
 */
import { randomUUID } from 'node:crypto'
import { type Runner, run } from 'graphile-worker'
import pg from 'pg'
import { Ledger } from '../src/core/ledger.js'
import { idempotentTask } from '../src/jobs/graphile-worker/index.js'
import { PostgresStore } from '../src/stores/postgres/postgres-store.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)

describe.skipIf(skip !== undefined)('idemkey/graphile-worker on a real PostgreSQL', () => {
  const id = randomUUID().slice(0, 8)
  const schema = `graphile_worker_${id}`
  const table = `idemkey_graphile_${id}`
  let pool: pg.Pool
  let runner: Runner
  const calls: string[] = []
  const failures: string[] = []
  let failOnce = true

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: URL, max: 6 })
    const store = new PostgresStore({ pool, table })
    await store.migrate()
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
    await runner?.stop()
    await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE; DROP TABLE IF EXISTS ${table}`)
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
})
