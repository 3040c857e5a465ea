/**
 * The rules of durable steps a handler relies on (docs/steps.md): step names and arguments, a store
 * without `recordStep`, capture, now, uuid and random, the round trips a step costs, the step count and
 * size limits, and JSON results.
 */
import { randomUUID } from 'node:crypto'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { IdempotencyError } from '../errors.js'
import { ManualClock } from './clock.js'
import { fingerprintOf } from './fingerprint.js'
import { Ledger, type LedgerEvent } from './ledger.js'
import type { IntentContext } from './ledger-types.js'
import { MAX_STEP_RESULT_BYTES, MAX_STEPS_PER_RECORD } from './steps.js'

const key = () => `k-${randomUUID()}`
const FP = fingerprintOf(null)

function setup(options: { lease?: string; wait?: number | string } = {}) {
  const clock = new ManualClock()
  const store = new MemoryStore({ clock })
  const events: LedgerEvent[] = []
  const ledger = new Ledger({
    store,
    clock,
    lease: options.lease ?? '30s',
    ttl: '1h',
    wait: options.wait ?? 0,
    onEvent: (e) => events.push(e),
  })
  return { clock, store, ledger, events }
}

/** A holder elsewhere that started step `name` (its marker is stored) and then died: its lease ends at `leaseMs`. */

async function crashedHolderWithMarker(store: MemoryStore, k: string, name: string, leaseMs = 30_000): Promise<void> {
  expect(await store.acquire('default', k, FP, leaseMs)).toMatchObject({ kind: 'acquired', token: 1 })
  expect(await store.recordStep('default', k, 1, name, null)).toBe(true)
}

/** Counts the store's `recordStep` round trips, with what each wrote. */

function countRecordSteps(store: MemoryStore): Array<[string, string | null]> {
  const calls: Array<[string, string | null]> = []
  const recordStep = store.recordStep.bind(store)
  store.recordStep = (scope, k, token, name, result) => {
    calls.push([name, result])
    return recordStep(scope, k, token, name, result)
  }
  return calls
}

/** A store that records no steps (a custom store that has not implemented `recordStep`). */

function withoutRecordStep(store: MemoryStore): MemoryStore {
  return Object.assign(store, { recordStep: undefined })
}

/** A fake telemetry that records what the ledger tells it. */

async function rejection(promise: Promise<unknown>): Promise<IdempotencyError> {
  try {
    await promise
  } catch (error) {
    return error as IdempotencyError
  }
  throw new Error('expected a rejection')
}

describe('ctx.step: arguments', () => {
  it('takes names of 1–64 letters, digits, "_", ".", ":" and "-", and refuses others naming the method', async () => {
    const { ledger } = setup()
    const good = ['a', 'A-z_0.9:x', 'x'.repeat(64)]
    expect(await ledger.run({ key: key() }, async (ctx) => Promise.all(good.map((n) => ctx.step(n, () => n))))).toMatchObject({
      value: good,
    })
    for (const bad of ['', 'a b', 'x'.repeat(65), 'é', '$now:1', 42]) {
      let error: IdempotencyError | undefined
      await ledger.run({ key: key() }, async (ctx) => {
        error = await rejection(ctx.step(bad as string, () => 1))
      })
      expect(error).toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: `ctx.step name must be 1–64 characters of letters, digits, "_", ".", ":" or "-"; got ${JSON.stringify(bad)}.`,
      })
    }
  })

  it('names capture and recordStep in their name errors', async () => {
    const { ledger, clock, store } = setup()
    let captureError: IdempotencyError | undefined
    await ledger.run({ key: key() }, async (ctx) => {
      captureError = await rejection(ctx.capture('bad name', () => 1))
    })
    expect(captureError).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^ctx\.capture name must be/) })

    const k = key()
    await crashedHolderWithMarker(store, k, 'charge')
    clock.advance(30_001)
    const error = await rejection(ledger.run({ key: k }, () => 1, { reconcile: (_pending, ctx) => ctx.recordStep('bad name', 1) }))
    expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^ctx\.recordStep name must be/) })
  })

  it('refuses a step without a function, naming the step', async () => {
    const { ledger } = setup()
    let error: IdempotencyError | undefined
    await ledger.run({ key: key() }, async (ctx) => {
      error = await rejection(ctx.step('charge', 'not a function' as never))
    })
    expect(error).toBeInstanceOf(IdempotencyError)
    expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', message: 'ctx.step("charge", fn) needs a function.' })
  })

  it('hands the step a live signal', async () => {
    const { ledger } = setup()
    let signal: AbortSignal | undefined
    await ledger.run({ key: key() }, (ctx) =>
      ctx.step('charge', (step) => {
        signal = step.signal
        return null
      }),
    )
    expect(signal).toBeInstanceOf(AbortSignal)
    expect(signal?.aborted).toBe(false)
  })
})

describe('ctx.step: a store without recordStep', () => {
  it('fails each step method with INVALID_OPTION naming the method and the store', async () => {
    const { ledger, store } = setup()
    withoutRecordStep(store)
    const calls: Array<[string, (ctx: IntentContext) => Promise<unknown>]> = [
      ['step', (ctx) => ctx.step('charge', () => 1)],
      ['capture', (ctx) => ctx.capture('order-no', () => 1)],
      ['capture', (ctx) => ctx.now()],
      ['capture', (ctx) => ctx.uuid()],
      ['capture', (ctx) => ctx.random()],
    ]
    for (const [what, call] of calls) {
      const error = await rejection(ledger.run({ key: key() }, call))
      expect(error).toMatchObject({
        code: 'INVALID_OPTION',
        message: expect.stringMatching(new RegExp(`^ctx\\.${what} needs a store that records steps; the memory store does not\\.`)),
      })
    }
  })

  it('fails reconcile.recordStep with INVALID_OPTION naming recordStep', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    await crashedHolderWithMarker(store, k, 'charge')
    clock.advance(30_001)
    withoutRecordStep(store)
    const error = await rejection(ledger.run({ key: k }, () => 1, { reconcile: (_pending, ctx) => ctx.recordStep('charge', 1) }))
    expect(error).toMatchObject({
      code: 'INVALID_OPTION',
      message: expect.stringMatching(/^ctx\.recordStep needs a store that records steps/),
    })
  })
})

describe('ctx.capture, now, uuid and random', () => {
  it('returns a new value for each call of now(), uuid() and random(), and the same ones on a takeover', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    const work = async (ctx: IntentContext) => {
      const first = await ctx.now()
      clock.advance(5)
      const second = await ctx.now()
      return {
        now: [first, second],
        uuid: [await ctx.uuid(), await ctx.uuid()],
        random: [await ctx.random(), await ctx.random()],
        order: await ctx.capture('order-no', () => `A-${clock.now()}`),
      }
    }
    const release = store.release.bind(store)
    store.release = async () => false // the first attempt dies without releasing
    const startMs = clock.now()
    let firstAttempt: Awaited<ReturnType<typeof work>> | undefined
    await expect(
      ledger.run({ key: k }, async (ctx) => {
        firstAttempt = await work(ctx)
        throw new Error('crash after the captures')
      }),
    ).rejects.toThrow('crash after the captures')
    store.release = release
    expect(firstAttempt?.now).toEqual([startMs, startMs + 5])
    expect(new Set(firstAttempt?.uuid).size).toBe(2)
    expect(new Set(firstAttempt?.random).size).toBe(2)
    expect(firstAttempt?.order).toBe(`A-${startMs + 5}`)

    clock.advance(30_001)
    const second = await ledger.run({ key: k }, work)
    expect(second).toMatchObject({ kind: 'executed', token: 2, value: firstAttempt })
  })

  it('stores the n-th now(), uuid() and random() as $now:n, $uuid:n and $random:n, the names records in flight resume by', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    store.release = async () => false
    await expect(
      ledger.run({ key: k }, async (ctx) => {
        await ctx.now()
        await ctx.now()
        await ctx.uuid()
        await ctx.random()
        await ctx.capture('quote', () => 9.5)
        throw new Error('crash')
      }),
    ).rejects.toThrow('crash')
    clock.advance(30_001)
    const takeover = await store.acquire('default', k, FP, 30_000)
    if (takeover.kind !== 'acquired') throw new Error(`expected acquired, got ${takeover.kind}`)
    expect(takeover.steps?.map((s) => s.name).sort()).toEqual(['$capture:quote', '$now:1', '$now:2', '$random:1', '$uuid:1'])
  })
})

describe('ctx.step: round trips', () => {
  it('costs one recordStep without reconcile, two with it, and one to rerun a step whose marker is stored', async () => {
    const { ledger, clock, store } = setup()
    const calls = countRecordSteps(store)
    await ledger.run({ key: key() }, (ctx) => ctx.step('charge', () => 1))
    expect(calls).toEqual([['charge', '1']])

    calls.length = 0
    await ledger.run({ key: key() }, (ctx) => ctx.step('charge', () => 1), { reconcile: () => {} })
    expect(calls).toEqual([
      ['charge', null],
      ['charge', '1'],
    ])

    const k = key()
    await crashedHolderWithMarker(store, k, 'charge')
    clock.advance(30_001)
    calls.length = 0
    const pendings: string[][] = []
    const result = await ledger.run({ key: k }, (ctx) => ctx.step('charge', () => 2), {
      reconcile: (pending) => void pendings.push(pending.map((p) => p.name)),
    })
    expect(result).toMatchObject({ kind: 'executed', value: 2, token: 2 })
    expect(pendings).toEqual([['charge']])
    expect(calls).toEqual([['charge', '2']])
  })
})

describe('ctx.step: limits', () => {
  const manySteps = (ctx: IntentContext, n: number) => async () => {
    for (let i = 1; i <= n; i++) await ctx.step(`s${i}`, () => i)
  }

  for (const reconcile of [undefined, () => {}]) {
    const how = reconcile ? 'with started markers (reconcile)' : 'without markers'
    it(`keeps ${MAX_STEPS_PER_RECORD} steps and refuses the next one, ${how}`, async () => {
      const { ledger } = setup()
      const fits = await ledger.run({ key: key() }, async (ctx) => manySteps(ctx, MAX_STEPS_PER_RECORD)(), { reconcile })
      expect(fits).toMatchObject({ kind: 'executed', outcome: 'completed' })

      const k = key()
      const error = await rejection(ledger.run({ key: k }, async (ctx) => manySteps(ctx, MAX_STEPS_PER_RECORD + 1)(), { reconcile }))
      expect(error).toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: `Step "s257" would be the 257th step or captured value of default/${k}; a record keeps at most 256. Group small steps into one.`,
      })
    })
  }

  it('counts captured values against the same limit', async () => {
    const { ledger } = setup()
    const error = await rejection(
      ledger.run({ key: key() }, async (ctx) => {
        await manySteps(ctx, MAX_STEPS_PER_RECORD)()
        await ctx.now()
      }),
    )
    expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/^Step "\$now:1" would be the 257th/) })
  })

  it('keeps a result of exactly 64 KiB of UTF-8 JSON and refuses one byte more', async () => {
    const { ledger } = setup()
    const stepOf = (value: string) => ledger.run({ key: key() }, (ctx) => ctx.step('big', () => value))
    // JSON adds the two quotes; "é" is two bytes of UTF-8.
    expect(await stepOf('x'.repeat(MAX_STEP_RESULT_BYTES - 2))).toMatchObject({ kind: 'executed', outcome: 'completed' })
    expect(await stepOf('é'.repeat((MAX_STEP_RESULT_BYTES - 2) / 2))).toMatchObject({ kind: 'executed', outcome: 'completed' })
    await expect(stepOf('x'.repeat(MAX_STEP_RESULT_BYTES - 1))).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: 'Step "big" returned 65537 bytes of JSON; a step keeps at most 65536. Store the large value yourself and return its ID.',
    })
    await expect(stepOf('é'.repeat(MAX_STEP_RESULT_BYTES / 2))).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/^Step "big" returned 65538 bytes of JSON/),
    })
  })
})

describe('ctx.step: JSON results', () => {
  it('returns and stores undefined as null', async () => {
    const { ledger } = setup()
    const result = await ledger.run({ key: key() }, async (ctx) => ({ got: await ctx.step('nothing', () => undefined) }))
    expect(result).toMatchObject({ kind: 'executed', value: { got: null } })
  })

  it('refuses a function or symbol result', async () => {
    const { ledger } = setup()
    for (const value of [() => 1, Symbol('s')]) {
      const error = await rejection(ledger.run({ key: key() }, (ctx) => ctx.step('fn', () => value)))
      expect(error).toMatchObject({
        code: 'INVALID_ARGUMENT',
        message: 'Step "fn" returned a function or symbol; return a JSON value.',
      })
    }
  })

  it('refuses a value JSON cannot encode, with the JSON error as cause', async () => {
    const { ledger } = setup()
    const cycle: { self?: unknown } = {}
    cycle.self = cycle
    for (const value of [10n, cycle]) {
      const error = await rejection(ledger.run({ key: key() }, (ctx) => ctx.step('odd', () => value)))
      expect(error).toBeInstanceOf(IdempotencyError)
      expect(error.code).toBe('INVALID_ARGUMENT')
      expect(error.message).toMatch(/^Step "odd" returned a value JSON cannot encode: .+\.$/s)
      expect(error.cause).toBeInstanceOf(TypeError)
    }
  })
})
