/**
 * BullMQ jobs/s through idempotentProcessor (Redis store, two durable steps' worth of work: none, so the
 * cost measured is the wrapper's) beside plain BullMQ, in one run on the same Redis: each round enqueues
 * a batch of new jobs (with jobIds) and times one Worker (concurrency 50) draining it, the two sides
 * alternating, so a neighbour's load falls on both alike.
 * Needs Redis on 127.0.0.1:6379.
 * Run alone: npx tsx bench/jobs.bench.ts [--jobs 2000] [--rounds 3]
 */
import { randomUUID } from 'node:crypto'
import { Queue, Worker } from 'bullmq'
import { Ledger } from '../src/core/ledger.js'
import { idempotentProcessor } from '../src/jobs/bullmq/index.js'
import { RedisStore } from '../src/stores/redis/index.js'
import { dropPrefix } from '../test/helpers/redis.js'
import { fmt, numberArg, report, table } from './lib.js'

const JOBS = numberArg('--jobs', 2_000)
const ROUNDS = numberArg('--rounds', 3)
const URL = 'redis://127.0.0.1:6379'
const connection = { host: '127.0.0.1', port: 6379 }
const run = randomUUID().slice(0, 8)
const prefix = `idemkey-bench-jobs-${run}`
const store = new RedisStore({ url: URL, prefix })
const ledger = new Ledger({ store })

type Processor = (job: { data: { n: number } }) => Promise<unknown>
const plain: Processor = async (job) => ({ done: job.data.n })
const wrapped = idempotentProcessor<{ n: number }, { done: number }>(async (job) => ({ done: job.data.n }), {
  ledger,
}) as unknown as Processor

/** Enqueues JOBS new jobs, then times one Worker draining them: jobs per second. */
async function drain(side: string, processor: Processor, round: number): Promise<number> {
  const name = `idemkey-bench-${side}-${run}-${round}`
  const queue = new Queue(name, { connection })
  await queue.addBulk(
    Array.from({ length: JOBS }, (_, i) => ({
      name: 'job',
      data: { n: i },
      opts: { jobId: `${side}-${round}-${i}`, removeOnComplete: true },
    })),
  )
  let done = 0
  let startedAt = 0
  const finished = new Promise<number>((resolve) => {
    const worker = new Worker(name, processor as never, { connection, concurrency: 50, autorun: false })
    worker.on('completed', () => {
      if (++done === JOBS) {
        const seconds = (performance.now() - startedAt) / 1000
        void worker.close().then(() => resolve(JOBS / seconds))
      }
    })
    startedAt = performance.now()
    void worker.run()
  })
  const rate = await finished
  await queue.obliterate({ force: true })
  await queue.close()
  return rate
}

const rates: Record<string, number[]> = { plain: [], idemkey: [] }
try {
  await drain('warmup', plain, 0)
  for (let round = 1; round <= ROUNDS; round++) {
    for (const [side, processor] of round % 2
      ? ([
          ['plain', plain],
          ['idemkey', wrapped],
        ] as const)
      : ([
          ['idemkey', wrapped],
          ['plain', plain],
        ] as const)) {
      rates[side]?.push(await drain(side, processor, round))
    }
  }
} finally {
  await store.close()
  await dropPrefix(URL, prefix)
}
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] as number
const plainRate = median(rates.plain as number[])
const idemkeyRate = median(rates.idemkey as number[])
report(
  'jobs',
  'BullMQ jobs through idempotentProcessor',
  'npx tsx bench/jobs.bench.ts',
  `${table(
    ['processor', 'jobs/s (median of rounds)', 'rounds', 'ratio to plain', 'target', 'met'],
    [
      ['plain BullMQ', fmt(plainRate), (rates.plain as number[]).map((r) => fmt(r)).join(', '), '1.00', '', ''],
      [
        'idempotentProcessor (RedisStore)',
        fmt(idemkeyRate),
        (rates.idemkey as number[]).map((r) => fmt(r)).join(', '),
        (idemkeyRate / plainRate).toFixed(2),
        '>= 0.80',
        idemkeyRate / plainRate >= 0.8 ? 'yes' : 'NO',
      ],
    ],
  )}\n\n` +
    `Each round enqueues ${fmt(JOBS)} new jobs (with jobIds) and times one Worker (concurrency 50) draining them; the two ` +
    'sides alternate, on the same Redis. Through the wrapper each job adds one acquire and one complete on the ' +
    "Redis store (two round trips, pipelined by ioredis with the other jobs in flight) to BullMQ's own commands.",
)
process.exit(0)
