/**
 * idemkey/pg-boss against a real PostgreSQL: the same work sent twice runs once and both jobs complete
 * with its output; a job retried after a throw resumes after its last recorded step; with
 * `transactional: true` the handler's row and the record commit together; a worker process SIGKILLed
 * mid-job (after a recorded step, or after the business write before its commit) leaves an active job that
 * pg-boss's supervisor expires and retries, and another worker process resumes it: each effect once.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { join } from 'node:path'
import pg from 'pg'
import { PgBoss } from 'pg-boss'
import { PostgresStore } from '../src/backends/postgres/postgres-store.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotentHandler, type PgBossDb, pgBossTransactions } from '../src/jobs/pg-boss/index.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const WORKER = join(import.meta.dirname, 'fixtures/pg-boss/worker.ts')

describe.skipIf(skip !== undefined)('idemkey/pg-boss on a real PostgreSQL', () => {
  const run = randomUUID().slice(0, 8)
  const schema = `pgboss_${run}`
  const table = `idemkey_pgboss_${run}`
  let pool: pg.Pool
  let boss: PgBoss
  let ledger: Ledger<PostgresStore>
  const children: ChildProcess[] = []

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: URL, max: 6 })
    const store = new PostgresStore({ pool, table })
    await store.migrate()
    ledger = new Ledger({ store, lease: 1_000 })
    await pool.query(
      `CREATE TABLE effects_${run} (job_key text NOT NULL, step text NOT NULL); CREATE TABLE crash_orders_${run} (order_id text NOT NULL)`,
    )
    // Expiry of a dead worker's job runs in the supervisor's monitor pass, which claims each queue at most
    // once per monitorIntervalSeconds (60 s by default): both intervals down to 1 s.
    boss = new PgBoss({
      connectionString: URL,
      schema,
      superviseIntervalSeconds: 1,
      monitorIntervalSeconds: 1,
      maintenanceIntervalSeconds: 1,
    })
    boss.on('error', () => {})
    await boss.start()
  }, 60_000)
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    await boss?.stop({ graceful: false }).catch(() => {})
    await pool.query(
      `DROP SCHEMA IF EXISTS ${schema} CASCADE; DROP TABLE IF EXISTS ${table}, orders_${run}, effects_${run}, crash_orders_${run}`,
    )
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

  it('with perJobResults, a job that always throws fails alone: its batch neighbours complete with their values, and a reused key is dead-lettered without a retry', async () => {
    const queue = `perjob-${run}`
    const dead = `perjob-dead-${run}`
    await boss.createQueue(dead)
    await boss.createQueue(queue, { deadLetter: dead, retryLimit: 2, retryDelay: 0 })
    // Sent before the worker starts, so the first fetch takes them as one batch.
    const a = (await boss.send(queue, { order: 'o-a', amount: 1 })) as string
    const poison = (await boss.send(queue, { order: 'o-poison', amount: 2 })) as string
    const c = (await boss.send(queue, { order: 'o-c', amount: 3 })) as string
    const runs: string[] = []
    const batches: number[] = []
    const handler = idempotentHandler<{ order: string; amount: number }, { charged: number }>(
      async (job) => {
        runs.push(job.data.order)
        if (job.data.order === 'o-poison') throw new Error('the bank refuses this card')
        return { charged: job.data.amount }
      },
      { ledger, key: (job) => job.data.order, perJobResults: true },
    )
    await boss.work<{ order: string; amount: number }>(
      queue,
      { pollingIntervalSeconds: 0.5, batchSize: 10, perJobResults: true },
      (jobs) => {
        batches.push(jobs.length)
        return handler(jobs)
      },
    )
    const [done, failed, alsoDone] = await settled(queue, [a, poison, c])
    // o-a's key again, with other data (pg-boss does not fetch a batch in send order, so it comes after).
    const reused = (await boss.send(queue, { order: 'o-a', amount: 99 })) as string
    const [refused] = await settled(queue, [reused])
    expect(batches[0]).toBe(3)
    expect(done).toEqual({ state: 'completed', output: { charged: 1 } })
    expect(alsoDone).toEqual({ state: 'completed', output: { charged: 3 } })
    expect(failed).toMatchObject({ state: 'failed', output: { message: 'the bank refuses this card' } })
    expect(refused).toMatchObject({ state: 'failed', output: { code: 'FINGERPRINT_MISMATCH' } })
    // The poison job used its retries (three runs); the good ones ran once, the reused key never.
    expect(runs.filter((order) => order === 'o-poison')).toHaveLength(3)
    expect(runs.filter((order) => order !== 'o-poison').sort()).toEqual(['o-a', 'o-c'])
    expect((await boss.getJobById(queue, reused))?.retryCount).toBe(0)
    // Only the reused key went to the dead letter queue at once; the poison job joins it once its retries end.
    const deadJobs = await boss.fetch<{ order: string; amount: number }>(dead, { batchSize: 10 })
    expect(deadJobs.map((job) => job.data).sort((x, y) => x.amount - y.amount)).toEqual([
      { order: 'o-poison', amount: 2 },
      { order: 'o-a', amount: 99 },
    ])
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

  describe("pgBossTransactions(): the run joins the transactional worker's own transaction", () => {
    let joined: Ledger<PostgresStore<pg.PoolClient, PgBossDb>>
    beforeAll(async () => {
      joined = new Ledger({ store: new PostgresStore({ pool, table, transactions: pgBossTransactions() }), lease: 1_000 })
      await pool.query(
        `CREATE TABLE joined_orders_${run} (id text NOT NULL, xid text NOT NULL);
         CREATE TABLE joined_parents_${run} (id int PRIMARY KEY);
         CREATE TABLE joined_deferred_${run} (parent int REFERENCES joined_parents_${run} (id) DEFERRABLE INITIALLY DEFERRED)`,
      )
    })
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS joined_orders_${run}, joined_deferred_${run}, joined_parents_${run}`)
    })

    const xminOf = async (sql: string, values: unknown[]) => ((await pool.query(sql, values)).rows[0] as { xmin: string } | undefined)?.xmin

    it("the handler's row, the record's completion and pg-boss's completion of the job are written by one transaction, pg-boss's", async () => {
      const queue = `joined-${run}`
      await boss.createQueue(queue)
      await boss.work<{ order: string }>(
        queue,
        { pollingIntervalSeconds: 0.5, transactional: true },
        idempotentHandler<{ order: string }, string, PgBossDb>(
          async (job, ctx) => {
            await ctx.tx.executeSql(`INSERT INTO joined_orders_${run} (id, xid) VALUES ($1, pg_current_xact_id()::xid::text)`, [
              job.data.order,
            ])
            return job.data.order
          },
          { ledger: joined, key: (job) => job.data.order, transactional: true },
        ),
      )
      const ids = [(await boss.send(queue, { order: 'j-1' })) as string, (await boss.send(queue, { order: 'j-1' })) as string]
      expect(await settled(queue, ids)).toEqual([
        { state: 'completed', output: { value: 'j-1' } },
        { state: 'completed', output: { value: 'j-1' } },
      ])
      const { rows } = await pool.query(`SELECT xid, xmin::text AS xmin FROM joined_orders_${run} WHERE id = 'j-1'`)
      expect(rows.length).toBe(1)
      const order = rows[0] as { xid: string; xmin: string }
      // The run writes in a savepoint of the handler's transaction: the row and the record's completion
      // carry that subtransaction's id; pg-boss completes the job in the transaction itself.
      expect(await xminOf(`SELECT xmin::text AS xmin FROM ${table} WHERE key = $1`, ['j-1'])).toBe(order.xmin)
      expect(await xminOf(`SELECT xmin::text AS xmin FROM ${schema}.job WHERE id = $1`, [ids[0]])).toBe(order.xid)
    })

    it("a commit that fails after the run takes back the row, the record's completion and the job's completion together; the retried job runs once", async () => {
      const queue = `joined-commit-${run}`
      await boss.createQueue(queue)
      let attempts = 0
      await boss.work<{ order: string }>(
        queue,
        { pollingIntervalSeconds: 0.5, transactional: true },
        idempotentHandler<{ order: string }, string, PgBossDb>(
          async (job, ctx) => {
            await ctx.tx.executeSql(`INSERT INTO joined_orders_${run} (id, xid) VALUES ($1, 'x')`, [job.data.order])
            // A deferred foreign key that fails only at COMMIT, after the run and pg-boss's completion.
            if (++attempts === 1) await ctx.tx.executeSql(`INSERT INTO joined_deferred_${run} (parent) VALUES (1)`)
            return `${job.data.order} attempt ${attempts}`
          },
          { ledger: joined, key: (job) => job.data.order, transactional: true },
        ),
      )
      const id = (await boss.send(queue, { order: 'j-2' }, { retryLimit: 1, retryDelay: 0 })) as string
      // The first attempt's completion rolled back: the retry finds its record still in progress, takes
      // it over once the lease ends (1 s), and runs the work; a completion that had committed would replay.
      expect(await settled(queue, [id])).toEqual([{ state: 'completed', output: { value: 'j-2 attempt 2' } }])
      expect(attempts).toBe(2)
      expect((await boss.getJobById(queue, id))?.retryCount).toBe(1)
      expect((await pool.query(`SELECT count(*)::int AS n FROM joined_orders_${run} WHERE id = 'j-2'`)).rows[0]).toEqual({ n: 1 })
      expect((await pool.query(`SELECT count(*)::int AS n FROM joined_deferred_${run}`)).rows[0]).toEqual({ n: 0 })
    })

    it('the same work sent twice and fetched in one batch runs once, and both jobs complete', async () => {
      const queue = `joined-batch-${run}`
      await boss.createQueue(queue)
      const ids = [
        (await boss.send(queue, { order: 'j-3' }, { retryLimit: 0 })) as string,
        (await boss.send(queue, { order: 'j-3' }, { retryLimit: 0 })) as string,
      ]
      let runs = 0
      await boss.work<{ order: string }>(
        queue,
        { pollingIntervalSeconds: 0.5, transactional: true, batchSize: 2 },
        idempotentHandler<{ order: string }, string, PgBossDb>(
          async (job, ctx) => {
            runs++
            await ctx.tx.executeSql(`INSERT INTO joined_orders_${run} (id, xid) VALUES ($1, 'x')`, [job.data.order])
            return job.data.order
          },
          { ledger: joined, key: (job) => job.data.order, transactional: true },
        ),
      )
      expect((await settled(queue, ids)).map((job) => job.state)).toEqual(['completed', 'completed'])
      expect(runs).toBe(1)
      expect((await pool.query(`SELECT count(*)::int AS n FROM joined_orders_${run} WHERE id = 'j-3'`)).rows[0]).toEqual({ n: 1 })
    }, 30_000)

    it('refuses a run outside a transactional pg-boss handler with a clear error, and releases its record', async () => {
      let ran = 0
      await expect(joined.runInTransaction({ key: `outside-${run}`, payload: 1 }, async () => ++ran)).rejects.toThrow(
        /pgBossTransactions\(\) joins pg-boss's handler transaction, and there is none here/,
      )
      expect(ran).toBe(0)
      // Released, not left in progress: the same key runs at once on a store of its own.
      expect(await ledger.run({ key: `outside-${run}`, payload: 1 }, async () => ++ran)).toMatchObject({ kind: 'executed', value: 1 })
    })
  })

  /** Starts a worker process (test/fixtures/pg-boss/worker.ts) on the queue; resolves once it works it. */
  const start = (queue: string, mode: 'steps' | 'tx' | 'joined', crash: boolean) =>
    new Promise<ChildProcess>((resolve, reject) => {
      const child = spawn(process.execPath, ['--import', 'tsx', WORKER, schema, queue, table, run, mode], {
        env: { ...process.env, CRASH: crash ? '1' : '0' },
        stdio: ['ignore', 'pipe', 'inherit'],
      })
      children.push(child)
      child.once('error', reject)
      child.once('exit', (code, signal) => reject(new Error(`worker exited before it was ready: ${code ?? signal}`)))
      child.stdout?.once('data', () => resolve(child))
    })

  /**
   * A worker process SIGKILLed in its first job: its jobs stay active until pg-boss's supervisor expires
   * them (expireInSeconds) and retries them; two other worker processes take them, and the same work sent
   * again meanwhile replays. Resolves with the jobs' final states and the highest retry count.
   */
  async function crashAndRecover(queue: string, mode: 'steps' | 'tx' | 'joined', orders: string[]) {
    await boss.createQueue(queue, { expireInSeconds: 2, retryLimit: 5, retryDelay: 0 })
    const crasher = await start(queue, mode, true)
    const died = new Promise((resolve) => crasher.once('exit', (_code, signal) => resolve(signal)))
    const ids: string[] = []
    for (const order of orders) ids.push((await boss.send(queue, { order })) as string)
    expect(await died).toBe('SIGKILL')
    await Promise.all([start(queue, mode, false), start(queue, mode, false)])
    ids.push((await boss.send(queue, { order: orders[0] })) as string)
    const jobs = await settled(queue, ids)
    const retries = await Promise.all(ids.map(async (id) => (await boss.getJobById(queue, id))?.retryCount ?? 0))
    for (const child of children) child.kill('SIGTERM')
    return { states: jobs.map((job) => job.state), maxRetry: Math.max(...retries) }
  }

  it('a worker process SIGKILLed after a recorded step: pg-boss expires and retries its job, another process resumes it; every job completes and each effect runs once', async () => {
    const orders = Array.from({ length: 6 }, (_, i) => `crash-${i}`)
    const { states, maxRetry } = await crashAndRecover(`crash-steps-${run}`, 'steps', orders)
    expect(states).toEqual(orders.map(() => 'completed').concat('completed'))
    // The killed worker's job was failed by expiry and retried, not merely picked up late.
    expect(maxRetry).toBeGreaterThanOrEqual(1)
    const { rows } = await pool.query(`SELECT job_key, step, count(*)::int AS n FROM effects_${run} GROUP BY 1, 2`)
    const counts = new Map(rows.map((row) => [`${row.job_key} ${row.step}`, row.n]))
    for (const order of orders) {
      expect([counts.get(`${order} reserve`), counts.get(`${order} charge`), counts.get(`${order} email`)], order).toEqual([1, 1, 1])
    }
    expect(rows.length).toBe(orders.length * 3)
  }, 45_000)

  it('with transactional: true, a worker process SIGKILLed after the business write but before the commit: the write rolls back, the retried job writes it once; every job completes', async () => {
    const orders = Array.from({ length: 6 }, (_, i) => `tx-crash-${i}`)
    const { states, maxRetry } = await crashAndRecover(`crash-tx-${run}`, 'tx', orders)
    expect(states).toEqual(orders.map(() => 'completed').concat('completed'))
    expect(maxRetry).toBeGreaterThanOrEqual(1)
    const { rows } = await pool.query(
      `SELECT order_id, count(*)::int AS n FROM crash_orders_${run} WHERE order_id LIKE 'tx-crash-%' GROUP BY 1 ORDER BY 1`,
    )
    expect(rows).toEqual([...orders].sort().map((order) => ({ order_id: order, n: 1 })))
  }, 45_000)

  it("with pgBossTransactions(), a worker process SIGKILLed after the record's completion but before pg-boss's commit: row, completion and job roll back together, the retried job writes the row once; every job completes", async () => {
    const orders = Array.from({ length: 6 }, (_, i) => `joined-crash-${i}`)
    const { states, maxRetry } = await crashAndRecover(`crash-joined-${run}`, 'joined', orders)
    expect(states).toEqual(orders.map(() => 'completed').concat('completed'))
    expect(maxRetry).toBeGreaterThanOrEqual(1)
    const { rows } = await pool.query(
      `SELECT order_id, count(*)::int AS n FROM crash_orders_${run} WHERE order_id LIKE 'joined-%' GROUP BY 1 ORDER BY 1`,
    )
    expect(rows).toEqual([...orders].sort().map((order) => ({ order_id: order, n: 1 })))
  }, 45_000)
})
