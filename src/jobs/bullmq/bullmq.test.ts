/**
 * idempotentProcessor with jobs as BullMQ hands them to a processor (the real queue, worker processes
 * and stalls run in test/bullmq.test.ts).
 */
import type { Job } from 'bullmq'
import { describe, expect, it } from 'vitest'
import { MemoryStore } from '../../backends/memory/index.js'
import { fingerprintOf } from '../../core/fingerprint.js'
import { Ledger } from '../../core/ledger.js'
import { idempotentProcessor } from './index.js'

/** A job as BullMQ hands it to the processor: `stalledCounter` > 0 once it was re-delivered after a stall. */
const job = (jobId: string, data: unknown, stalledCounter = 0, prefix = 'bull') =>
  ({ id: jobId, queueName: 'payments', prefix, data, opts: { jobId }, stalledCounter }) as unknown as Job<unknown>

const within = <T>(ms: number, promise: Promise<T>) =>
  Promise.race([promise, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`not done within ${ms} ms`)), ms))])

describe('idempotentProcessor', () => {
  it("takes a stalled job's record over when BullMQ hands the job on, not after the dead worker's lease", async () => {
    const store = new MemoryStore()
    const ledger = new Ledger({ store })
    const data = { amount: 500 }
    // The worker that had the job died holding its record: its lease (10 s) runs on, no one renews it.
    const dead = await store.acquire('bullmq:payments', 'order-1', fingerprintOf(data), 10_000)
    expect(dead.kind).toBe('acquired')
    const ran: string[] = []
    const processor = idempotentProcessor(async () => ran.push('charge'), { ledger, lease: '10s' })
    // BullMQ found the job stalled (its lock ended) and re-delivered it: it runs now.
    await within(2_000, processor(job('order-1', data, 1), 'lock-token'))
    expect(ran).toEqual(['charge'])
  })
  it("keeps the records of queues of one name under two BullMQ prefixes apart: one never replays the other's job", async () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    const ran: string[] = []
    const processor = idempotentProcessor(
      async (j: Job<unknown>) => {
        ran.push(j.prefix)
        return { chargedBy: j.prefix }
      },
      { ledger },
    )
    // Two deployments (staging and production, or two tenants) on one Redis, told apart by their prefix.
    expect(await processor(job('order-1', { amount: 500 }, 0, 'staging'), 'lock-a')).toEqual({ chargedBy: 'staging' })
    expect(await processor(job('order-1', { amount: 500 }, 0, 'production'), 'lock-b')).toEqual({ chargedBy: 'production' })
    // Other data under the same jobId is another piece of work in another queue, not a reused key.
    expect(await processor(job('order-2', { amount: 1 }, 0, 'staging'), 'lock-c')).toEqual({ chargedBy: 'staging' })
    expect(await processor(job('order-2', { amount: 2 }, 0, 'production'), 'lock-d')).toEqual({ chargedBy: 'production' })
    expect(ran).toEqual(['staging', 'production', 'staging', 'production'])
    // The default prefix keeps the scope records were written under before: bullmq:<queue name>.
    await processor(job('order-3', { amount: 3 }), 'lock-e')
    expect(await ledger.store.get('bullmq:payments', 'order-3')).toMatchObject({ status: 'completed' })
  })
})
