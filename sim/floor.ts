/**
 * The simulator's floor: the code it drives with nothing around it (bench/sim.bench.ts, "The simulator
 * beside its floor"): the real engine, ledger and MemoryStore answering new keys with the payments
 * handler's three steps, sixteen callers, a fresh store every thousand requests. No client, network,
 * scheduler or checks, so no simulator of this workload can run faster: `npm run sim` prints its own
 * speed as a share of this one, measured in the same process just after, so the machine's load counts
 * on both sides alike.
 */
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { deriveKey } from '../src/core/derive-key.js'
import { Ledger } from '../src/core/ledger.js'
import { createEngine } from '../src/http/engine.js'
import type { HttpRequestLike, HttpResponseLike, IdempotencyContext } from '../src/http/types.js'

const CALLERS = 16
const encoder = new TextEncoder()
const decoder = new TextDecoder()

let run = 0

/** Answers `count` new keys through the floor; `steps: 0` leaves the handler's three steps out. */
export async function floorBatch(count: number, steps: 0 | 3 = 3): Promise<void> {
  const body = encoder.encode(JSON.stringify({ intent: 'c1-i1', amount: 1299 }))
  const pay = async (req: HttpRequestLike, ctx: IdempotencyContext | undefined): Promise<HttpResponseLike> => {
    const input = JSON.parse(decoder.decode(await req.body(1_024))) as { intent: string; amount: number }
    if (!ctx) return { status: 400, headers: {}, body: new Uint8Array(0) }
    let charge = 0
    if (steps === 3) {
      await ctx.step('reserve', async () => ({ reserved: input.amount }))
      charge = await ctx.step('charge', async () => deriveKey(ctx.key, 'charge').length)
      await ctx.step('email', async () => true)
    }
    const answer = { intent: input.intent, amount: input.amount, tenant: ctx.scope, charge, by: 'app-1', token: ctx.token }
    return { status: 201, headers: { 'content-type': 'application/json' }, body: encoder.encode(JSON.stringify(answer, null, 1)) }
  }
  const ledger = new Ledger({ store: new MemoryStore(), lease: 2_000, wait: 1_000, ttl: 3_600_000 })
  const engine = createEngine({ ledger, scope: (req) => String(req.headers['x-tenant']) })
  const prefix = `r${run++}`
  let next = 0
  const caller = async () => {
    while (next < count) {
      const req: HttpRequestLike = {
        method: 'POST',
        url: '/charges',
        headers: { 'idempotency-key': `${prefix}-${next++}`, 'x-tenant': 'tenant-1', 'content-type': 'application/json' },
        body: async () => body,
      }
      const response = await engine.handle(req, (ctx) => pay(req, ctx))
      if (response.status !== 201) throw new Error(`the floor's request answered ${response.status}`)
    }
  }
  await Promise.all(Array.from({ length: CALLERS }, caller))
  await ledger.close()
}

/** Requests per CPU-second of the floor, over `requests` requests after a warm-up of a fifth as many. */
export async function floorRequestsPerCpuSecond(requests = 20_000): Promise<number> {
  for (let done = 0; done < requests / 5; done += 1_000) await floorBatch(1_000)
  const started = process.cpuUsage()
  for (let done = 0; done < requests; done += 1_000) await floorBatch(Math.min(1_000, requests - done))
  const used = process.cpuUsage(started)
  return requests / ((used.user + used.system) / 1e6)
}
