import { randomUUID } from 'node:crypto'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { ManualClock } from '../src/core/clock.js'
import { deriveKey } from '../src/core/derive-key.js'
import { Ledger } from '../src/core/ledger.js'
import type { PendingStep } from '../src/core/steps.js'
import { getIdempotency, withIdempotency } from '../src/http/fetch/index.js'

describe('steps over HTTP', () => {
  it('gives the handler ctx.step and captured values: a retry after a 5xx resumes after the recorded steps', async () => {
    const clock = new ManualClock()
    const ledger = new Ledger({ store: new MemoryStore({ clock }), clock })
    const effects: string[] = []
    let failEmail = true
    const pending: PendingStep[][] = []
    const handler = withIdempotency(
      ledger,
      async (request: Request) => {
        const ctx = getIdempotency(request)
        if (!ctx) throw new Error('no idempotency context')
        const orderId = await ctx.uuid()
        const placedAt = await ctx.now()
        const charge = await ctx.step('charge', (step) => {
          effects.push(`charge ${step.key}`)
          return { id: 'ch_1' }
        })
        await ctx.step('email', () => {
          if (failEmail) throw new Error('mail server down')
          effects.push('email')
          return true
        })
        return Response.json({ orderId, placedAt, charge: charge.id, takeover: ctx.takeover }, { status: 201 })
      },
      { reconcile: (steps) => void pending.push(steps) },
    )
    const key = randomUUID()
    const make = () => new Request('http://localhost/checkout', { method: 'POST', headers: { 'idempotency-key': key }, body: '{}' })
    await expect(handler(make())).rejects.toThrow('mail server down')
    failEmail = false
    clock.advance(5_000)
    const second = await handler(make())
    expect(second.status).toBe(201)
    const body = (await second.json()) as { orderId: string; placedAt: number; takeover: boolean }
    expect(body.takeover).toBe(true)
    expect(body.placedAt).toBe(clock.now() - 5_000)
    expect(effects).toEqual([`charge ${deriveKey(key, 'charge')}`, 'email'])
    // Each step records a started marker first with reconcile set: email had started, with no result.
    expect(pending).toEqual([[{ name: 'email', key: deriveKey(key, 'email') }]])
    const replay = await handler(make())
    expect(await replay.json()).toEqual(body)
  })
})
