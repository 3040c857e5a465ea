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

/** A promise the test resolves when it chooses (`open()`): where a holder stalls, or an answer waits. */
function gate(): { passed: Promise<void>; open: () => void } {
  let open: () => void = () => {}
  const passed = new Promise<void>((resolve) => {
    open = resolve
  })
  return { passed, open }
}

/** `store` with its `method` wrapped by `wrap` (given the real method, already bound); the rest as it is. */
function around<S extends object>(
  store: S,
  method: string,
  wrap: (real: (...args: unknown[]) => Promise<unknown>) => (...args: unknown[]) => Promise<unknown>,
): S {
  return new Proxy(store, {
    get(target, property) {
      const value = Reflect.get(target, property, target)
      const bound = typeof value === 'function' ? value.bind(target) : value
      return property === method ? wrap(bound) : bound
    },
  })
}

describe('a holder that lost its lease (found by the simulator, seed 308)', () => {
  it('starts no new step once a renewal told it the lease is gone: the step throws FENCED_OUT and does not run', async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const zombie = new Ledger({ store, clock, lease: 3_000 })
    const other = new Ledger({ store, clock, lease: 3_000 })
    const key = `k-${randomUUID()}`
    const ran: string[] = []
    const { passed: paused, open: resume } = gate()
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
    const { passed: stalled, open: resume } = gate()
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

/** `store` with the answers of `method` that `when` picks held back until `open()`: the call reaches the store, its answer waits. */
function holdAnswers(store: MemoryStore, method: 'recordStep' | 'renew', when: (args: unknown[]) => boolean) {
  const { passed, open } = gate()
  const held = around(store, method, (real) => async (...args) => {
    const answer = await real(...args)
    if (when(args)) await passed
    return answer
  })
  return { held, open }
}

describe('a step whose lease is lost while its started marker is written (found by the simulator, seed 4207)', () => {
  it('does not run: the marker reached the store, the lease was taken over, and its answer came back after the refused renewal', async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    // The marker (a step recorded with no result: the run has reconcile) reaches the store; its answer is held.
    const { held, open } = holdAnswers(store, 'recordStep', (args) => args[4] === null)
    const zombie = new Ledger({ store: held, clock, lease: 3_000 })
    const other = new Ledger({ store, clock, lease: 3_000 })
    const key = `k-${randomUUID()}`
    const ran: string[] = []
    const first = zombie.run(
      { key, payload: { n: 1 } },
      async (ctx) => {
        await ctx.step('charge', () => ran.push('charge #1'))
        return 'first'
      },
      { reconcile: () => {} },
    )
    await flush()
    await store.renew('default', key, 1, 1) // the store's view: this lease ends in 1 ms
    clock.advance(10)
    const second = await other.run({ key, payload: { n: 1 } }, async (ctx) => {
      await ctx.step('charge', () => ran.push(`charge #${ctx.token}`))
      return 'second'
    })
    expect(second).toMatchObject({ kind: 'executed', value: 'second' })
    clock.advance(1_000) // the first holder's renewal is due: the store refuses it
    await flush()
    open() // only now does the marker's answer arrive
    await expect(first).rejects.toMatchObject({ code: 'FENCED_OUT' })
    expect(ran).toEqual(['charge #2'])
  })
})

describe('a renewal granted while the run finishes (found by the simulator, seed 5791)', () => {
  it("extends the lease the outcome's retries count to: complete is retried past the old lease's end, and stored", async () => {
    const clock = new ManualClock()
    const startedAtMs = clock.now()
    const memory = new MemoryStore({ clock })
    // The renewal due at 1 s reaches the store and is granted (the lease now ends at 4 s); its answer is held
    // until the work has returned, so the run's finish waits for it.
    const { held, open } = holdAnswers(memory, 'renew', () => true)
    let completeFailsUntilMs = startedAtMs
    const store = around(held, 'complete', (real) => async (...args) => {
      if (clock.now() < completeFailsUntilMs) throw new Error('connection reset')
      return real(...args)
    })
    const events: string[] = []
    const ledger = new Ledger({ store, clock, lease: 3_000, onEvent: (event) => events.push(event.type) })
    const key = `k-${randomUUID()}`
    const { passed: working, open: finish } = gate()
    const run = ledger.run({ key, payload: { n: 1 } }, async () => {
      await working
      return 'done'
    })
    await flush()
    clock.advance(1_000) // the renewal fires; the store grants it
    await flush()
    // The store is unreachable for complete until 3.2 s: past the first lease's end (3 s, give-up at 2.7 s),
    // inside the renewed one (4 s, give-up at 3.7 s).
    completeFailsUntilMs = startedAtMs + 3_200
    finish()
    await flush()
    open()
    let settled = false
    void run.finally(() => {
      settled = true
    })
    for (let i = 0; i < 400 && !settled; i++) {
      clock.advance(10)
      await flush()
    }
    await expect(run).resolves.toMatchObject({ kind: 'executed', outcome: 'completed' })
    expect(events).not.toContain('unrecorded')
    expect((await memory.get('default', key))?.status).toBe('completed')
  })
})

describe('fail() after a finish() that threw, as the documented try/catch calls it (found by the simulator, seed 2)', () => {
  const bigintFee = { id: 'ch_1', fee: 12n } // a value JSON cannot hold, as a driver returns a money column

  it('leaves the record held, so a retry does not run the work again at once, and rethrows nothing of its own', async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const ledger = new Ledger({ store, clock, lease: 3_000, wait: 0 })
    const key = `k-${randomUUID()}`
    const begun = await ledger.begin<typeof bigintFee>({ key, payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    let caught: unknown
    try {
      await begun.finish(bigintFee)
    } catch (error) {
      caught = error
      await begun.fail(error) // docs/ledger.md's pattern: must not replace finish's error with its own
    }
    expect(caught).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining('could not be recorded') })
    expect((caught as Error).message).toContain(key)
    expect((await store.get('default', key))?.status).toBe('in_progress')
    const retry = await ledger.begin({ key, payload: 1 })
    expect(retry.kind).toBe('in_progress')
    clock.advance(3_001)
    const later = await ledger.begin({ key, payload: 1 })
    expect(later).toMatchObject({ kind: 'acquired', context: { takeover: true } })
  })

  it('still refuses a fail() after a finish() that stored, and one while finish() is under way', async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const ledger = new Ledger({ store, clock, lease: 3_000 })
    const key = `k-${randomUUID()}`
    const begun = await ledger.begin<string>({ key, payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    const finishing = begun.finish('done')
    await expect(begun.fail(new Error('ack timeout'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /already called/ })
    expect(await finishing).toMatchObject({ outcome: 'completed' })
    await expect(begun.fail(new Error('late'))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: /already called/ })
    expect((await store.get('default', key))?.status).toBe('completed')
  })
})
