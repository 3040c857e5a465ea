/**
 * idempotentProcessor with jobs as BullMQ hands them to a processor (the real queue, worker processes
 * and stalls run in test/bullmq.test.ts).
 */
import type { Job } from 'bullmq'
import { describe, expect, it } from 'vitest'
import { fingerprintOf } from '../../core/fingerprint.js'
import { Ledger } from '../../core/ledger.js'
import { MemoryStore } from '../../stores/memory/index.js'
import { idempotentProcessor } from './index.js'

/** A job as BullMQ hands it to the processor: `stalledCounter` > 0 once it was re-delivered after a stall. */
const job = (jobId: string, data: unknown, stalledCounter = 0) =>
  ({ id: jobId, queueName: 'payments', data, opts: { jobId }, stalledCounter }) as unknown as Job<unknown>

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
})
