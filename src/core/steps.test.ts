import { MemoryStore } from '../backends/memory/memory-store.js'
import { ManualClock } from './clock.js'
import { deriveKey } from './derive-key.js'
import { Ledger } from './ledger.js'
import type { PendingStep } from './steps.js'
import type { IdempotencyStore } from './store.js'

/** An attempt that dies after `afterSteps` steps: the work throws a non-transient crash and the lease is left to end. */
class Crash extends Error {}

function setup() {
  const clock = new ManualClock()
  const store = new MemoryStore({ clock })
  const ledger = new Ledger({ store, clock, lease: '10s' })
  return { clock, store, ledger }
}

/** Kills an attempt without releasing: the store keeps the record in progress until its lease ends. */
function dropRelease(store: IdempotencyStore): () => void {
  const release = store.release.bind(store)
  store.release = async () => false
  return () => {
    store.release = release
  }
}

describe('ctx.step', () => {
  it('runs each step once across attempts: a takeover returns recorded results and runs only the rest', async () => {
    const { clock, store, ledger } = setup()
    const ran: string[] = []
    const work = (crashAfter: string | null) => async (ctx: Parameters<Parameters<typeof ledger.run>[1]>[0]) => {
      const reserved = await ctx.step('reserve', () => {
        ran.push('reserve')
        return { reservation: 'r1' }
      })
      if (crashAfter === 'reserve') throw new Crash()
      const charge = await ctx.step('charge', () => {
        ran.push('charge')
        return { charge: 'ch_1', for: reserved.reservation }
      })
      return { ...charge, takeover: ctx.takeover }
    }
    const restore = dropRelease(store)
    await expect(ledger.run({ key: 'order-1', payload: 1 }, work('reserve'))).rejects.toBeInstanceOf(Crash)
    restore()
    clock.advance(10_001)
    const second = await ledger.run({ key: 'order-1', payload: 1 }, work(null))
    expect(second).toMatchObject({ kind: 'executed', value: { charge: 'ch_1', for: 'r1', takeover: true } })
    expect(ran).toEqual(['reserve', 'charge'])
  })

  it('lets a step that threw be tried again in the same attempt, and runs it once it succeeds', async () => {
    const { ledger } = setup()
    let calls = 0
    const result = await ledger.run({ key: 'retry', payload: 1 }, async (ctx) => {
      for (let attempt = 1; ; attempt++) {
        try {
          return await ctx.step('charge', () => {
            calls++
            if (attempt < 3) throw new Error('provider busy')
            return 'ch_1'
          })
        } catch (error) {
          if (attempt >= 3) throw error
        }
      }
    })
    expect(result).toMatchObject({ kind: 'executed', value: 'ch_1' })
    expect(calls).toBe(3)
  })

  it('hands the step its derived key, the same on every attempt', async () => {
    const { ledger } = setup()
    let seen = ''
    await ledger.run({ key: 'order-2', payload: 1 }, (ctx) =>
      ctx.step('charge', (step) => {
        seen = step.key
        return null
      }),
    )
    expect(seen).toBe(deriveKey('order-2', 'charge'))
  })

  it('returns what JSON makes of the result on the first attempt as on a replayed step', async () => {
    const { ledger } = setup()
    const result = await ledger.run({ key: 'k', payload: 1 }, (ctx) => ctx.step('when', () => ({ at: new Date(0), gone: undefined })))
    expect(result).toMatchObject({ kind: 'executed', value: { at: '1970-01-01T00:00:00.000Z' } })
    expect(result.kind === 'executed' && 'gone' in (result.value as object)).toBe(false)
  })

  it('refuses a step name used twice in one attempt, a bad name, and a result over 64 KiB', async () => {
    const { ledger } = setup()
    await expect(
      ledger.run({ key: 'twice', payload: 1 }, async (ctx) => {
        await ctx.step('charge', () => 1)
        await ctx.step('charge', () => 2)
      }),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining('ran twice') })
    await expect(ledger.run({ key: 'name', payload: 1 }, (ctx) => ctx.step('$now:1', () => 1))).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
    })
    await expect(ledger.run({ key: 'big', payload: 1 }, (ctx) => ctx.step('big', () => 'x'.repeat(70_000)))).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringContaining('at most 65536'),
    })
  })

  it('fails the step with FENCED_OUT when another holder took the record over meanwhile', async () => {
    const { store, ledger } = setup()
    let second: unknown
    const result = ledger.run({ key: 'fenced', payload: 1 }, async (ctx) => {
      await ctx.step('reserve', async () => {
        // The lease ends while the step runs (as when the process stalls); another attempt takes over and finishes.
        await store.release(ctx.scope, ctx.key, ctx.token)
        second = await ledger.run({ key: 'fenced', payload: 1 }, () => 'second')
        return 1
      })
    })
    await expect(result).rejects.toMatchObject({ code: 'FENCED_OUT', message: expect.stringContaining('lost the record') })
    expect(second).toMatchObject({ kind: 'executed', value: 'second', token: 2 })
  })

  it('fails with INVALID_OPTION naming the store when the store records no steps', async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const ledger = new Ledger({ store: wrap(store), clock })
    await expect(ledger.run({ key: 'k', payload: 1 }, (ctx) => ctx.now())).rejects.toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringContaining('the memory store does not'),
    })
  })
})

/** The store's methods bound, as a plain object (so one can be left out). */
function wrap(store: MemoryStore): IdempotencyStore {
  return {
    name: store.name,
    serverClock: store.serverClock,
    acquire: store.acquire.bind(store),
    renew: store.renew.bind(store),
    complete: store.complete.bind(store),
    release: store.release.bind(store),
    get: store.get.bind(store),
    list: store.list.bind(store),
    purgeExpired: store.purgeExpired.bind(store),
    evict: store.evict.bind(store),
    close: store.close.bind(store),
  }
}

describe('captured values', () => {
  it('returns the same now, uuid, random and capture on every attempt, by call order', async () => {
    const { clock, store, ledger } = setup()
    const seen: unknown[][] = []
    const work = (crash: boolean) => async (ctx: Parameters<Parameters<typeof ledger.run>[1]>[0]) => {
      const values = [
        await ctx.now(),
        await ctx.uuid(),
        await ctx.random(),
        await ctx.now(),
        await ctx.capture('order-id', () => `o-${Math.random()}`),
      ]
      seen.push(values)
      if (crash) throw new Crash()
      return values
    }
    const restore = dropRelease(store)
    await expect(ledger.run({ key: 'cap', payload: 1 }, work(true))).rejects.toBeInstanceOf(Crash)
    restore()
    const firstNow = seen[0]?.[0]
    clock.advance(60_000)
    await ledger.run({ key: 'cap', payload: 1 }, work(false))
    expect(seen[1]).toEqual(seen[0])
    expect(firstNow).toBe(clock.now() - 60_000)
    expect(seen[0]?.[1]).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
    expect(typeof seen[0]?.[2]).toBe('number')
  })
})

describe('reconcile', () => {
  it('is given the steps that started without a result, and a step it records does not run again', async () => {
    const { clock, store, ledger } = setup()
    const charged: string[] = []
    const calls: PendingStep[][] = []
    const reconcile = async (pending: PendingStep[], ctx: { recordStep(name: string, value: unknown): Promise<void> }) => {
      calls.push(pending)
      // The provider has the charge under the step's derived key: record what it says.
      for (const step of pending) if (charged.includes(step.key)) await ctx.recordStep(step.name, { charge: 'found', key: step.key })
    }
    const work = (crash: boolean) => async (ctx: Parameters<Parameters<typeof ledger.run>[1]>[0]) =>
      ctx.step('charge', (step) => {
        charged.push(step.key)
        if (crash) throw new Crash() // the charge happened; the process died before recording it
        return { charge: 'new' }
      })
    const restore = dropRelease(store)
    await expect(ledger.run({ key: 'rec', payload: 1 }, work(true), { reconcile })).rejects.toBeInstanceOf(Crash)
    restore()
    clock.advance(10_001)
    const result = await ledger.run({ key: 'rec', payload: 1 }, work(false), { reconcile })
    expect(calls).toEqual([[{ name: 'charge', key: deriveKey('rec', 'charge') }]])
    expect(result).toMatchObject({ kind: 'executed', value: { charge: 'found' } })
    expect(charged).toHaveLength(1)
  })

  it('leaves a step it does not record to run again, with the same derived key', async () => {
    const { clock, store, ledger } = setup()
    const keys: string[] = []
    const reconcile = vi.fn()
    const work = (crash: boolean) => async (ctx: Parameters<Parameters<typeof ledger.run>[1]>[0]) =>
      ctx.step('email', (step) => {
        keys.push(step.key)
        if (crash) throw new Crash()
        return 'sent'
      })
    const restore = dropRelease(store)
    await expect(ledger.run({ key: 'again', payload: 1 }, work(true), { reconcile })).rejects.toBeInstanceOf(Crash)
    restore()
    clock.advance(10_001)
    expect(await ledger.run({ key: 'again', payload: 1 }, work(false), { reconcile })).toMatchObject({ value: 'sent' })
    expect(reconcile).toHaveBeenCalledTimes(1)
    expect(keys).toEqual([deriveKey('again', 'email'), deriveKey('again', 'email')])
  })

  it('is not called on a first attempt, nor when no step is pending', async () => {
    const { ledger } = setup()
    const reconcile = vi.fn()
    await ledger.run({ key: 'first', payload: 1 }, (ctx) => ctx.step('a', () => 1), { reconcile })
    expect(reconcile).not.toHaveBeenCalled()
  })
})

describe('store round trips', () => {
  /** A MemoryStore that counts calls per method. */
  function counted() {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const calls: Record<string, number> = {}
    for (const method of ['acquire', 'renew', 'complete', 'release', 'get', 'list', 'recordStep'] as const) {
      const original = (store[method] as (...args: unknown[]) => Promise<unknown>).bind(store)
      ;(store as unknown as Record<string, unknown>)[method] = (...args: unknown[]) => {
        calls[method] = (calls[method] ?? 0) + 1
        return original(...args)
      }
    }
    return { clock, store, calls, ledger: new Ledger({ store, clock, lease: '10s' }) }
  }
  const checkout = async (ctx: Parameters<Parameters<Ledger['run']>[1]>[0]) => {
    await ctx.step('reserve', () => 1)
    await ctx.step('charge', () => 2)
    await ctx.step('email', () => 3)
    return 'done'
  }

  it('costs one recordStep per step run, and nothing for a recorded step on a takeover', async () => {
    const { clock, store, calls, ledger } = counted()
    await ledger.run({ key: 'k', payload: 1 }, checkout)
    expect(calls).toEqual({ acquire: 1, recordStep: 3, complete: 1 })

    const restore = dropRelease(store)
    await expect(
      ledger.run({ key: 'k2', payload: 1 }, async (ctx) => {
        await ctx.step('reserve', () => 1)
        await ctx.step('charge', () => 2)
        throw new Crash()
      }),
    ).rejects.toBeInstanceOf(Crash)
    restore()
    clock.advance(10_001)
    for (const key of Object.keys(calls)) delete calls[key]
    await ledger.run({ key: 'k2', payload: 1 }, checkout)
    // The takeover's acquire brought the two recorded steps back: only email is recorded.
    expect(calls).toEqual({ acquire: 1, recordStep: 1, complete: 1 })
  })

  it('costs two with reconcile: the started marker, then the result', async () => {
    const { calls, ledger } = counted()
    await ledger.run({ key: 'k', payload: 1 }, checkout, { reconcile: () => {} })
    expect(calls).toEqual({ acquire: 1, recordStep: 6, complete: 1 })
  })
})
