/**
 * idempotentTask with graphile-worker's helpers as a task gets them (the real queue runs in
 * test/graphile-worker.test.ts).
 */
import { describe, expect, it } from 'vitest'
import { MemoryStore } from '../../backends/memory/index.js'
import { Ledger } from '../../core/ledger.js'
import { idempotentTask } from './index.js'

const helpers = (id: string, key: string) => ({ job: { id, key, task_identifier: 'charge', attempts: 1 } })

describe('idempotentTask', () => {
  it('runs a task once whose value JSON cannot hold (a BigInt, a circular object): graphile-worker ignores it, so it is not stored', async () => {
    const ledger = new Ledger({ store: new MemoryStore(), lease: 100 })
    let runs = 0
    const circular: { self?: unknown } = {}
    circular.self = circular
    const task = idempotentTask<{ order: string }>(
      async (payload) => {
        runs++
        // What a query builder or an HTTP client returns: a row with a bigint id, a response with its socket.
        return payload.order === 'big' ? { id: 1n } : circular
      },
      { ledger },
    )
    for (const order of ['big', 'circular']) {
      await task({ order }, helpers('1', `order-${order}`))
      // Added again (or retried, had the first one thrown): the record replays, the effect does not repeat.
      await new Promise((resolve) => setTimeout(resolve, 150))
      await task({ order }, helpers('2', `order-${order}`))
    }
    expect(runs).toBe(2)
  })
})
