/**
 * idemkey/bullmq against a real Redis: the effect of a job runs once per logical key whatever BullMQ
 * does (retries with backoff, a stalled job re-processed after its worker was SIGKILLed, the same work
 * enqueued twice, several worker processes at once), every job completes, and a key reused with other
 * data fails its job without a retry.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { join } from 'node:path'
import { type Job, Queue, QueueEvents, Worker } from 'bullmq'
import { Redis } from 'ioredis'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/postgres-store.js'
import { RedisStore } from '../src/backends/redis/redis-store.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotentProcessor } from '../src/jobs/bullmq/index.js'
import { eventually } from './helpers/eventually.js'
import { dropPrefix } from './helpers/redis.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'redis://127.0.0.1:6379'
const connection = { host: '127.0.0.1', port: 6379 }
const skip = await serviceSkipReason('Redis', 6379)
const skipPostgres = skip ?? (await serviceSkipReason('PostgreSQL', 5432))
const WORKER = join(import.meta.dirname, 'fixtures/bullmq/worker.ts')

describe.skipIf(skip !== undefined)('idemkey/bullmq on a real Redis', () => {
  const runId = randomUUID().slice(0, 8)
  const prefix = `idemkey-bullmq-${runId}`
  let redis: Redis
  let store: RedisStore
  let ledger: Ledger
  const queues: Array<Queue | QueueEvents | Worker> = []
  const children: ChildProcess[] = []

  beforeAll(() => {
    redis = new Redis(URL)
    store = new RedisStore({ url: URL, prefix })
    ledger = new Ledger({ store, lease: 1_000 })
  })
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    for (const q of queues.reverse()) await q.close().catch(() => {})
    for (const q of queues) if (q instanceof Queue) await q.obliterate({ force: true }).catch(() => {})
    await store.close()
    await redis.del(`effects:${runId}`, `calls:${runId}`, `applied:${runId}`)
    redis.disconnect()
    await dropPrefix(URL, prefix)
  })

  function setup(name: string) {
    const queueName = `idemkey-${name}-${runId}`
    const queue = new Queue(queueName, { connection })
    const events = new QueueEvents(queueName, { connection })
    queues.push(queue, events)
    return { queueName, queue, events }
  }
  const effects = async () => redis.hgetall(`effects:${runId}`)
  const count = (all: Record<string, string>, key: string, step: string) => Number(all[`${key}:${step}`] ?? 0)
  const track = (key: string, step: string) => redis.hincrby(`effects:${runId}`, `${key}:${step}`, 1)

  it('runs the same work enqueued twice under one jobId once; the second job completes with the first result', async () => {
    const { queueName, queue, events } = setup('twice')
    let runs = 0
    const worker = new Worker(
      queueName,
      idempotentProcessor<{ amount: number }, { charged: number; run: number }>(
        async (job, ctx) => {
          await ctx.step('charge', () => track(`twice-${job.opts.jobId}`, 'charge'))
          return { charged: job.data.amount, run: ++runs }
        },
        { ledger, lease: 1_000 },
      ),
      { connection, lockDuration: 1_000 },
    )
    queues.push(worker)
    const first = await queue.add('charge', { amount: 500 }, { jobId: 'order-1', removeOnComplete: true })
    expect(await first.waitUntilFinished(events, 10_000)).toEqual({ charged: 500, run: 1 })
    // Enqueued again (a producer retried its add): BullMQ makes a new job, idemkey replays the first's result.
    const second = await queue.add('charge', { amount: 500 }, { jobId: 'order-1', removeOnComplete: true })
    expect(await second.waitUntilFinished(events, 10_000)).toEqual({ charged: 500, run: 1 })
    expect(runs).toBe(1)
    expect(count(await effects(), 'twice-order-1', 'charge')).toBe(1)
  })

  it('fails a job whose key was used for other data, without a retry, and one with only a generated id', async () => {
    const { queueName, queue, events } = setup('reuse')
    const worker = new Worker(
      queueName,
      idempotentProcessor(async (job: Job<{ amount: number }>) => ({ charged: job.data.amount }), { ledger }),
      { connection, lockDuration: 1_000 },
    )
    queues.push(worker)
    const ok = await queue.add('charge', { amount: 1 }, { jobId: 'k-1', removeOnComplete: true })
    await ok.waitUntilFinished(events, 10_000)
    const reused = await queue.add('charge', { amount: 2 }, { jobId: 'k-1', attempts: 3 })
    await expect(reused.waitUntilFinished(events, 10_000)).rejects.toThrow(/was used before for other data/)
    expect((await queue.getJob(reused.id as string))?.attemptsMade).toBe(1)
    const unkeyed = await queue.add('charge', { amount: 3 }, { attempts: 3 })
    await expect(unkeyed.waitUntilFinished(events, 10_000)).rejects.toThrow(/has no logical key: BullMQ generated its id/)
  })

  it('fails a job whose key was used for other data without a retry in a sandboxed processor too (its error crosses a process by name)', async () => {
    const { queueName, queue, events } = setup('reuse-sandboxed')
    const worker = new Worker(queueName, join(import.meta.dirname, 'fixtures/bullmq/sandboxed.ts'), {
      connection,
      lockDuration: 1_000,
      useWorkerThreads: false,
      workerForkOptions: { execArgv: ['--import', 'tsx'], env: { ...process.env, IDEMKEY_PREFIX: prefix } },
    })
    queues.push(worker)
    const ok = await queue.add('charge', { amount: 1 }, { jobId: 'k-1', removeOnComplete: true })
    expect(await ok.waitUntilFinished(events, 20_000)).toEqual({ charged: 1 })
    const reused = await queue.add('charge', { amount: 2 }, { jobId: 'k-1', attempts: 3 })
    await expect(reused.waitUntilFinished(events, 20_000)).rejects.toThrow(/was used before for other data/)
    const failed = await queue.getJob(reused.id as string)
    expect(failed?.attemptsMade).toBe(1)
    expect(failed?.failedReason).toMatch(/was used before for other data/)
  }, 40_000)

  it('retries a failed job with backoff and resumes after its last recorded step: each effect once', async () => {
    const { queueName, queue, events } = setup('retry')
    let attempts = 0
    const worker = new Worker(
      queueName,
      idempotentProcessor<{ n: number }, string>(
        async (_job, ctx) => {
          await ctx.step('reserve', () => track('retry', 'reserve'))
          if (++attempts === 1) throw new Error('the bank timed out') // transient: released, retried by BullMQ
          await ctx.step('charge', () => track('retry', 'charge'))
          return 'done'
        },
        { ledger, key: (job) => `retry-${job.data.n}` },
      ),
      { connection, lockDuration: 1_000 },
    )
    queues.push(worker)
    const job = await queue.add('charge', { n: 1 }, { attempts: 3, backoff: { type: 'exponential', delay: 50 } })
    expect(await job.waitUntilFinished(events, 10_000)).toBe('done')
    expect(attempts).toBe(2)
    const all = await effects()
    expect([count(all, 'retry', 'reserve'), count(all, 'retry', 'charge')]).toEqual([1, 1])
  })

  it("hands BullMQ's cancellation signal to the processor: worker.cancelJob() stops a running job, and its record is released", async () => {
    const { queueName, queue, events } = setup('cancel')
    let started!: () => void
    const running = new Promise<void>((resolve) => (started = resolve))
    const worker = new Worker(
      queueName,
      idempotentProcessor<{ n: number }, string>(
        (_job, _ctx, signal) =>
          new Promise<string>((_, reject) => {
            started()
            signal?.addEventListener('abort', () => reject(new Error(`cancelled: ${String(signal.reason)}`)), { once: true })
          }),
        { ledger, lease: 1_000 },
      ),
      { connection, lockDuration: 1_000 },
    )
    queues.push(worker)
    const job = await queue.add('slow', { n: 1 }, { jobId: 'cancel-1' })
    await running
    expect(worker.cancelJob('cancel-1', 'shutting down')).toBe(true)
    await expect(job.waitUntilFinished(events, 5_000)).rejects.toThrow('cancelled: shutting down')
    // Released, not left held for its lease: the same work runs again at once.
    const again = await ledger.run({ scope: `bullmq:${queueName}`, key: 'cancel-1', payload: { n: 1 } }, () => 'again', { wait: 0 })
    expect(again).toMatchObject({ kind: 'executed', value: 'again' })
  })

  it("a stalled job keyed by the user's key does not take over the record another live holder of the same work has: the effect runs once", async () => {
    const { queueName, queue } = setup('stall-other')
    let open!: () => void
    const gate = new Promise<void>((resolve) => (open = resolve))
    const ran: string[] = []
    const work = (by: string) => async () => {
      ran.push(by)
      if (by === 'holder') await gate
      return { by }
    }
    // The same work (key o1, same data) runs elsewhere and is alive: its lease is renewed while it runs.
    const holder = ledger.run({ scope: `bullmq:${queueName}`, key: 'o1', payload: { order: 'o1' } }, work('holder'))
    try {
      await eventually(() => ran.length === 1, 'the holder to run', 10_000)
      // Job b, under its own jobId, goes to a worker process, which waits for the holder's key ...
      const child = spawn(process.execPath, ['--import', 'tsx', WORKER, queueName, runId], {
        env: { ...process.env, KEY_FROM_DATA: '1', CRASH_AFTER_CHARGE: '0' },
        stdio: ['ignore', 'pipe', 'inherit'],
      })
      children.push(child)
      await new Promise((resolve) => child.stdout?.once('data', resolve))
      await queue.add('charge', { order: 'o1' }, { jobId: 'b' })
      await eventually(async () => (await queue.getJobState('b')) === 'active', 'job b to be taken by the worker process', 10_000)
      // ... and dies holding it: BullMQ finds b stalled and hands it to this process's worker.
      child.kill('SIGKILL')
      const worker = new Worker<{ order: string }>(
        queueName,
        idempotentProcessor<{ order: string }, { by: string }>((job) => work(`job ${job.id}`)(), {
          ledger,
          key: (job) => job.data.order,
          lease: 1_000,
        }),
        { connection, lockDuration: 1_000, stalledInterval: 300 },
      )
      queues.push(worker)
      await eventually(
        async () => (await queue.getJob('b'))?.stalledCounter === 1 && ['delayed', 'completed'].includes(await queue.getJobState('b')),
        'job b, stalled, to be processed again',
        15_000,
      )
      expect(ran).toEqual(['holder'])
    } finally {
      open()
    }
    expect(await holder).toMatchObject({ kind: 'executed', value: { by: 'holder' } })
    await eventually(async () => (await queue.getJobState('b')) === 'completed', 'job b to complete', 15_000)
    expect(ran).toEqual(['holder'])
    expect((await queue.getJob('b'))?.returnvalue).toEqual({ by: 'holder' })
  }, 60_000)

  it("reads BullMQ's lock token itself: a job whose key another holder has is put back (delayed) even when a wrapper of the user's passes the job alone", async () => {
    const { queueName, queue, events } = setup('token')
    let finish!: () => void
    const holder = ledger.run(
      { scope: `bullmq:${queueName}`, key: 'tok-1', payload: { n: 1 } },
      () => new Promise<string>((resolve) => (finish = () => resolve('by the holder'))),
    )
    const wrapped = idempotentProcessor<{ n: number }, string>(async () => 'by the job', { ledger })
    // The user's own processor around the wrapper: it hands on the job, not BullMQ's token.
    const worker = new Worker<{ n: number }>(queueName, (job) => wrapped(job), { connection, lockDuration: 1_000 })
    queues.push(worker)
    const job = await queue.add('charge', { n: 1 }, { jobId: 'tok-1', attempts: 1 })
    await eventually(async () => (await queue.getJobState('tok-1')) === 'delayed', 'the job to be put back while the holder runs', 10_000)
    finish()
    expect(await holder).toMatchObject({ kind: 'executed', value: 'by the holder' })
    expect(await job.waitUntilFinished(events, 10_000)).toBe('by the holder')
    expect((await queue.getJob('tok-1'))?.attemptsMade).toBe(1)
  })

  it.each([
    ["with the default lease (the Worker's lockDuration)", 'default', { DEFAULT_LEASE: '1' }],
    ['with a lease of 30 s given (the record itself names its holder)', '30s', { LEASE_MS: '30000' }],
  ] as Array<[string, string, Record<string, string>]>)(
    "a worker process SIGKILLed mid-effect under a key of the user's, %s: the re-handed job takes its dead worker's record over at once and completes within lockDuration + stalledInterval + 2 s, each effect once",
    async (_name, variant, leaseEnv) => {
      const { queueName, queue } = setup(`kill-custom-key-${variant}`)
      const LOCK_MS = 1_500
      const STALLED_MS = 1_000
      const env = { KEY_FROM_DATA: '1', ...leaseEnv, LOCK_MS: String(LOCK_MS), STALLED_MS: String(STALLED_MS) }
      const start = (extra: Record<string, string>) =>
        new Promise<ChildProcess>((resolve, reject) => {
          const child = spawn(process.execPath, ['--import', 'tsx', WORKER, queueName, runId], {
            env: { ...process.env, ...env, ...extra },
            stdio: ['ignore', 'pipe', 'inherit'],
          })
          children.push(child)
          child.once('error', reject)
          child.stdout?.once('data', () => resolve(child))
        })
      // The crasher holds the job 3 s after its charge (locks renewed), so the survivor is up before the kill.
      const crasher = await start({ CRASH_AFTER_CHARGE: '1', CRASH_DELAY_MS: '3000' })
      const killed = new Promise<number>((resolve) => crasher.once('exit', () => resolve(Date.now())))
      // A generated job id: the record is keyed by the order, as for work that may be enqueued twice.
      const order = `o-kill-${variant}`
      const job = await queue.add('charge', { order, amount: 10 }, { attempts: 3 })
      await eventually(async () => (await queue.getJobState(job.id as string)) === 'active', 'the crasher to take the job', 10_000)
      await start({ CRASH_AFTER_CHARGE: '0' })
      const killedAtMs = await killed
      await eventually(async () => (await queue.getJobState(job.id as string)) === 'completed', 'the re-handed job to complete', 45_000)
      const tookMs = Date.now() - killedAtMs
      expect(tookMs, `completed ${tookMs} ms after the kill`).toBeLessThanOrEqual(LOCK_MS + STALLED_MS + 2_000)
      const done = await queue.getJob(job.id as string)
      expect(done?.stalledCounter).toBe(1)
      expect(done?.returnvalue).toEqual({ charged: 10 })
      const all = await effects()
      expect([count(all, order, 'reserve'), count(all, order, 'charge'), count(all, order, 'email')]).toEqual([1, 1, 1])
      for (const child of children) child.kill('SIGTERM')
    },
    90_000,
  )

  it('a worker process SIGKILLed mid-job: BullMQ re-delivers the stalled job to another worker process, which resumes it; every job of three processes completes and each effect runs once', async () => {
    const { queueName, queue } = setup('crash')
    const start = (crash: boolean) =>
      new Promise<ChildProcess>((resolve, reject) => {
        const child = spawn(process.execPath, ['--import', 'tsx', WORKER, queueName, runId], {
          env: { ...process.env, CRASH_AFTER_CHARGE: crash ? '1' : '0' },
          stdio: ['ignore', 'pipe', 'inherit'],
        })
        children.push(child)
        child.once('error', reject)
        child.stdout?.once('data', () => resolve(child))
      })
    const crasher = await start(true)
    const died = new Promise((resolve) => crasher.once('exit', (_code, signal) => resolve(signal)))
    const keys = Array.from({ length: 12 }, (_, i) => `crash-${i}`)
    for (const key of keys) await queue.add('charge', { amount: 10 }, { jobId: key, attempts: 5 })
    expect(await died).toBe('SIGKILL')
    await Promise.all([start(false), start(false)])
    // A duplicate of finished work, enqueued while the others run.
    await queue.add('charge', { amount: 10 }, { jobId: `${keys[0]}-again`, attempts: 5 })
    for (let i = 0; i < 300; i++) {
      const counts = await queue.getJobCounts('completed', 'failed', 'active', 'wait', 'delayed')
      if (counts.completed === keys.length + 1) break
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const counts = await queue.getJobCounts('completed', 'failed')
    expect(counts).toEqual({ completed: keys.length + 1, failed: 0 })
    const all = await effects()
    const calls = await redis.hgetall(`calls:${runId}`)
    for (const key of keys) {
      expect([count(all, key, 'reserve'), count(all, key, 'charge'), count(all, key, 'email')], key).toEqual([1, 1, 1])
      // A recorded step is never called again: only a step whose worker died before recording it is.
      expect(count(calls, key, 'email'), `${key} email calls`).toBe(1)
    }
    // The crashed worker's first job was taken over after its charge was recorded: it resumed at email.
    expect(Object.values(calls).every((n) => Number(n) <= 2)).toBe(true)
    for (const child of children) child.kill('SIGTERM')
  }, 60_000)
})

describe.skipIf(skipPostgres !== undefined)('idemkey/bullmq with transactional: true on a real PostgreSQL', () => {
  const run = randomUUID().slice(0, 8)
  const table = `idemkey_bullmq_${run}`
  const orders = `bullmq_orders_${run}`
  let pool: pg.Pool
  let ledger: Ledger<PostgresStore>
  const closing: Array<Queue | QueueEvents | Worker> = []

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: 'postgres://root@127.0.0.1:5432/test', max: 4 })
    const store = new PostgresStore({ pool, table })
    await store.migrate()
    ledger = new Ledger({ store })
    await pool.query(`CREATE TABLE ${orders} (id text PRIMARY KEY)`)
  })
  afterAll(async () => {
    for (const q of closing.reverse()) await q.close().catch(() => {})
    for (const q of closing) if (q instanceof Queue) await q.obliterate({ force: true }).catch(() => {})
    await pool.query(`DROP TABLE IF EXISTS ${table}, ${orders}`)
    await pool.end()
  })

  it("writes the processor's row in the record's transaction (ctx.tx): a run that throws after its write leaves no row, and the work enqueued twice writes it once", async () => {
    const queueName = `idemkey-tx-${run}`
    const queue = new Queue(queueName, { connection })
    const events = new QueueEvents(queueName, { connection })
    let runs = 0
    const worker = new Worker(
      queueName,
      idempotentProcessor<{ order: string }, string, pg.PoolClient>(
        async (job, ctx) => {
          await ctx.tx.query(`INSERT INTO ${orders} (id) VALUES ($1)`, [job.data.order])
          if (++runs === 1) throw new Error('the bank timed out after the row was written')
          return job.data.order
        },
        { ledger, key: (job) => job.data.order, transactional: true },
      ),
      { connection, lockDuration: 2_000 },
    )
    closing.push(queue, events, worker)
    const first = await queue.add('order', { order: 'o-1' }, { attempts: 3, backoff: { type: 'fixed', delay: 50 } })
    expect(await first.waitUntilFinished(events, 15_000)).toBe('o-1')
    const again = await queue.add('order', { order: 'o-1' }, { attempts: 3 })
    expect(await again.waitUntilFinished(events, 15_000)).toBe('o-1')
    expect(runs).toBe(2)
    expect((await pool.query(`SELECT count(*)::int AS n FROM ${orders}`)).rows[0]).toEqual({ n: 1 })
    expect(await ledger.store.get(`bullmq:${queueName}`, 'o-1')).toMatchObject({ status: 'completed' })
  })
})
