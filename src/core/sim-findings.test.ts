/**
 * Rules the deterministic simulator (npm run sim, docs/testing.md) found broken, pinned here by hand so a
 * plain unit test fails too if they break again. Each names the seed that first showed it.
 */
import { randomUUID } from 'node:crypto'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { createEngine } from '../http/engine.js'
import type { HttpRequestLike, HttpResponseLike } from '../http/types.js'
import { ManualClock } from './clock.js'
import { Ledger } from './ledger.js'

const flush = async () => {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve))
}

describe('a holder that lost its lease (found by the simulator, seed 308)', () => {
  it('starts no new step once a renewal told it the lease is gone: the step throws FENCED_OUT and does not run', async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const zombie = new Ledger({ store, clock, lease: 3_000 })
    const other = new Ledger({ store, clock, lease: 3_000 })
    const key = `k-${randomUUID()}`
    const ran: string[] = []
    let resume: () => void = () => {}
    const paused = new Promise<void>((resolve) => {
      resume = resolve
    })
    const first = zombie.run({ key, payload: { n: 1 } }, async (ctx) => {
      await ctx.step('reserve', () => ran.push('reserve #1'))
      await paused // stalls past its lease
      await ctx.step('charge', () => ran.push('charge #1'))
      return 'first'
    })
    await flush()
    // The lease ends without a renewal reaching the store (the holder is stalled); another holder takes over.
    await store.renew('default', key, 1, 1) // the store's view: this lease ends in 1 ms
    clock.advance(10)
    const second = await other.run({ key, payload: { n: 1 } }, async (ctx) => {
      await ctx.step('charge', () => ran.push(`charge #${ctx.token}`))
      return 'second'
    })
    expect(second).toMatchObject({ kind: 'executed', value: 'second' })
    clock.advance(1_000) // the zombie's renewal is due: the store refuses it
    await flush()
    resume()
    await expect(first).rejects.toMatchObject({ code: 'FENCED_OUT' })
    expect(ran).toEqual(['reserve #1', 'charge #2'])
  })
})

describe('a fenced-out holder over HTTP (found by the simulator, seed 234)', () => {
  it('answers 409 FENCED_OUT instead of its own response, and a retry gets the response that was stored', async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const ledger = new Ledger({ store, clock, lease: 3_000 })
    const engine = createEngine({ ledger, scope: () => 'tenant' })
    const key = `k-${randomUUID()}`
    const request = (): HttpRequestLike => ({
      method: 'POST',
      url: '/charges',
      headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      body: async () => new TextEncoder().encode('{"amount":5}'),
    })
    const answer = (by: string): HttpResponseLike => ({
      status: 201,
      headers: { 'content-type': 'text/plain' },
      body: new TextEncoder().encode(by),
    })
    let resume: () => void = () => {}
    const stalled = new Promise<void>((resolve) => {
      resume = resolve
    })
    const zombie = engine.handle(request(), async () => {
      await stalled
      return answer('zombie')
    })
    await flush()
    // Its lease ends while it stalls; a second attempt takes over and stores its answer.
    const scope = (await store.list({ limit: 10 }))[0]?.scope as string
    await store.renew(scope, key, 1, 1)
    clock.advance(10)
    const winner = await engine.handle(request(), async () => answer('winner'))
    expect(new TextDecoder().decode(winner.body)).toBe('winner')
    resume()
    const late = await zombie
    expect(late.status).toBe(409)
    expect(new TextDecoder().decode(late.body)).toContain('FENCED_OUT')
    const retry = await engine.handle(request(), async () => answer('never runs'))
    expect(retry.headers['idempotent-replayed']).toBe('true')
    expect(new TextDecoder().decode(retry.body)).toBe('winner')
  })
})
