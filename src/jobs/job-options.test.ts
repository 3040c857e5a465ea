/**
 * The job-queue wrappers check their durations when the worker is set up: a bad `lease` or `wait`
 * was taken, and then failed every job the worker took (each one retried, and failed again).
 */
import { describe, expect, it } from 'vitest'
import { MemoryStore } from '../backends/memory/index.js'
import { Ledger } from '../core/ledger.js'
import { idempotentProcessor } from './bullmq/index.js'
import { idempotentTask } from './graphile-worker/index.js'
import { idempotentHandler } from './pg-boss/index.js'

const ledger = new Ledger({ store: new MemoryStore() })
const invalid = (name: string) => expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(name) })

describe('job-queue wrappers', () => {
  it('refuse a bad lease or wait when made (pg-boss, graphile-worker, BullMQ)', () => {
    const key = () => 'k'
    expect(() => idempotentHandler(() => 1, { ledger, key, lease: 'soon' })).toThrow(invalid('lease'))
    expect(() => idempotentHandler(() => 1, { ledger, key, wait: -5 })).toThrow(invalid('wait'))
    expect(() => idempotentTask(() => 1, { ledger, lease: '1 fortnight' })).toThrow(invalid('lease'))
    expect(() => idempotentTask(() => 1, { ledger, wait: Number.NaN })).toThrow(invalid('wait'))
    expect(() => idempotentProcessor(() => 1, { ledger, lease: 'soon' })).toThrow(invalid('lease'))
    // 0 parses as a duration, and the ledger refuses it at each run: refused here too.
    expect(() => idempotentHandler(() => 1, { ledger, key, lease: 0 })).toThrow(invalid('lease must be longer than 0'))
    expect(() => idempotentTask(() => 1, { ledger, lease: '0s' })).toThrow(invalid('lease must be longer than 0'))
    expect(() => idempotentProcessor(() => 1, { ledger, lease: 0 })).toThrow(invalid('lease must be longer than 0'))
    // pg-boss's own perJobResults is a boolean: 'yes' would be taken as true by the wrapper and not by pg-boss.
    expect(() => idempotentHandler(() => 1, { ledger, key, perJobResults: 'yes' as never })).toThrow(
      invalid('perJobResults is true or false'),
    )
  })

  it('refuse a key, scope or payload that is no function (BullMQ takes a scope string), and a handler that is none', () => {
    const key = () => 'k'
    const notFunction = (where: string, name: string) =>
      expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(`${where}: ${name} must be a function`) })
    expect(() => idempotentHandler(() => 1, { ledger, key, scope: 'billing' as never })).toThrow(
      notFunction('idempotentHandler()', 'scope'),
    )
    expect(() => idempotentHandler('charge' as never, { ledger, key })).toThrow(notFunction('idempotentHandler()', 'handler'))
    expect(() => idempotentTask(() => 1, { ledger, key: 'orderId' as never })).toThrow(notFunction('idempotentTask()', 'key'))
    expect(() => idempotentProcessor(() => 1, { ledger, payload: 'data' as never })).toThrow(
      notFunction('idempotentProcessor()', 'payload'),
    )
    expect(() => idempotentProcessor(() => 1, { ledger, scope: 42 as never })).toThrow('scope must be a function or a string')
    expect(() => idempotentProcessor(() => 1, { ledger, scope: 'emails' })).not.toThrow()
  })

  it("BullMQ: a job run without a lock token while another holds its key fails with IN_PROGRESS, as pg-boss's and graphile-worker's do", async () => {
    let release: () => void = () => {}
    const holding = ledger.run({ key: 'held-job', scope: 'bullmq:q' }, () => new Promise<void>((resolve) => (release = resolve)))
    const processor = idempotentProcessor(() => 'ran', { ledger, wait: 0 })
    const job = { id: 'held-job', queueName: 'q', data: null, opts: { jobId: 'held-job' }, stalledCounter: 0 }
    await expect(processor(job as never)).rejects.toMatchObject({
      code: 'IN_PROGRESS',
      message: expect.stringContaining('is being processed by another worker'),
    })
    release()
    await holding
  })

  it('run a job with the durations they were given', async () => {
    const handler = idempotentHandler((job: { data: { n: number } }) => job.data.n * 2, {
      ledger,
      key: () => 'pg-boss-k',
      lease: '5s',
      wait: '1s',
    })
    expect(await handler([{ id: '1', name: 'q', data: { n: 21 } }])).toBe(42)
    const task = idempotentTask((payload: { n: number }) => payload.n, { ledger, lease: '5s' })
    await expect(task({ n: 1 }, { job: { id: '1', key: 'gw-k', task_identifier: 't' } } as never)).resolves.toBeUndefined()
  })
})
