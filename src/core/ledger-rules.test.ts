/**
 * The rules of the Ledger that a caller relies on and that other suites leave loose: option validation
 * and its messages, per-run overrides, the default JSON encoding, the exact fields of the events,
 * reconciliation on takeover, telemetry hand-off and steps inside a transaction (docs/ledger.md).
 */
import { randomUUID } from 'node:crypto'
import { drive, turn } from '../../test/helpers/manual-clock.js'
import { TxMemoryStore } from '../../test/helpers/tx-memory-store.js'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { IdempotencyError } from '../errors.js'
import { ManualClock } from './clock.js'
import { fingerprintOf } from './fingerprint.js'
import { Ledger, type LedgerEvent, type LedgerTelemetry, RETRY_AFTER_MAX_MS, retryAfter } from './ledger.js'
import type { PendingStep } from './steps.js'

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

function recordingTelemetry() {
  const ends: Array<string | undefined> = []
  const events: string[] = []
  let works = 0
  const telemetry: LedgerTelemetry = {
    startRun: () => ({
      storeCall: (_operation, call) => call(),
      work: (fn) => {
        works++
        return fn()
      },
      event: (event) => events.push(event.type),
      end: (kind) => ends.push(kind),
    }),
  }
  return { telemetry, ends, events, works: () => works }
}

async function rejection(promise: Promise<unknown>): Promise<IdempotencyError> {
  try {
    await promise
  } catch (error) {
    return error as IdempotencyError
  }
  throw new Error('expected a rejection')
}

describe('new Ledger: option validation', () => {
  it('refuses a missing options object or a store without acquire, with INVALID_OPTION', () => {
    for (const options of [undefined, null, {}, { store: {} }, { store: { acquire: 'no' } }]) {
      let thrown: unknown
      try {
        new Ledger(options as never)
      } catch (error) {
        thrown = error
      }
      expect(thrown).toBeInstanceOf(IdempotencyError)
      expect(thrown).toMatchObject({ code: 'INVALID_OPTION', message: expect.stringMatching(/needs a store/) })
    }
  })

  it('names the option in each duration error', () => {
    const store = new MemoryStore()
    const cases: Array<[object, string]> = [
      [{ lease: 0 }, 'lease must be longer than 0, got 0ms.'],
      [{ ttl: 'x' }, 'ttl "x" is not a duration'],
      [{ ttl: 0 }, 'ttl must be longer than 0, got 0ms.'],
      [{ wait: 'x' }, 'wait "x" is not a duration'],
      [{ storeTimeout: 'x' }, 'storeTimeout "x" is not a duration'],
      [{ storeTimeout: 0 }, 'storeTimeout must be longer than 0, got 0ms.'],
    ]
    for (const [options, message] of cases) {
      expect(() => new Ledger({ store, ...options })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
      expect(() => new Ledger({ store, ...options })).toThrow(message)
    }
  })

  it('closes its store on close()', async () => {
    const store = new MemoryStore()
    let closed = 0
    store.close = async () => {
      closed++
    }
    await new Ledger({ store }).close()
    expect(closed).toBe(1)
  })
})

describe('Ledger.run: intent and per-run options validation', () => {
  it('answers KEY_INVALID, not a TypeError, for a missing intent', async () => {
    const { ledger } = setup()
    const error = await rejection(ledger.run(undefined as never, () => 1))
    expect(error).toBeInstanceOf(IdempotencyError)
    expect(error.code).toBe('KEY_INVALID')
  })

  it('refuses an invalid fingerprint itself, before any store call', async () => {
    const { ledger, store } = setup()
    let acquires = 0
    const acquire = store.acquire.bind(store)
    store.acquire = (...args) => {
      acquires++
      return acquire(...args)
    }
    for (const fingerprint of ['nope', 'A'.repeat(64)]) {
      await expect(ledger.run({ key: key(), fingerprint }, () => 1)).rejects.toMatchObject({ code: 'FINGERPRINT_INVALID' })
    }
    expect(acquires).toBe(0)
    // A valid one given by the caller is used as it is.
    expect(await ledger.run({ key: key(), fingerprint: 'a'.repeat(64) }, () => 1)).toMatchObject({ kind: 'executed' })
    expect(acquires).toBe(1)
  })

  it('names the per-run option in each duration error', async () => {
    const { ledger } = setup()
    const cases: Array<[object, string]> = [
      [{ lease: 'x' }, 'lease "x" is not a duration'],
      [{ lease: 0 }, 'lease must be longer than 0, got 0ms.'],
      [{ ttl: 'x' }, 'ttl "x" is not a duration'],
      [{ ttl: 0 }, 'ttl must be longer than 0, got 0ms.'],
      [{ wait: 'x' }, 'wait "x" is not a duration'],
    ]
    for (const [options, message] of cases) {
      const error = await rejection(ledger.run({ key: key() }, () => 1, options))
      expect(error.code).toBe('INVALID_OPTION')
      expect(error.message).toContain(message)
    }
  })

  it('refuses a deadline that is not a finite time with INVALID_OPTION', async () => {
    const { ledger } = setup()
    const error = await rejection(ledger.run({ key: key() }, () => 1, { deadlineMs: Number.NaN }))
    expect(error).toMatchObject({ code: 'INVALID_OPTION', message: 'deadlineMs must be a time in epoch ms, got NaN.' })
  })
})

describe('Ledger.run: per-run lease and ttl', () => {
  it("takes the run's own lease instead of the ledger's", async () => {
    const { ledger, clock } = setup({ lease: '30s' })
    const k = key()
    const startMs = clock.now()
    let finish: () => void = () => {}
    const holder = ledger.run({ key: k }, () => new Promise<string>((resolve) => (finish = () => resolve('done'))), { lease: '5s' })
    await turn()
    expect(await ledger.run({ key: k }, () => 'dup')).toEqual({
      kind: 'in_progress',
      lockedUntilMs: startMs + 5_000,
      retryAfterMs: 2_000,
    })
    finish()
    await holder
  })

  it("keeps the outcome for the run's own ttl instead of the ledger's", async () => {
    const { ledger, clock } = setup()
    const k = key()
    expect(await ledger.run({ key: k }, () => 'first', { ttl: '1s' })).toMatchObject({ kind: 'executed' })
    clock.advance(999)
    expect(await ledger.run({ key: k }, () => 'second')).toMatchObject({ kind: 'replayed', value: 'first' })
    clock.advance(2)
    expect(await ledger.run({ key: k }, () => 'third')).toMatchObject({ kind: 'executed', value: 'third' })
  })
})

describe('Ledger.run: default JSON encoding', () => {
  it('stores a value as JSON with status 200 and a JSON content type', async () => {
    const { ledger } = setup()
    const k = key()
    const result = await ledger.run({ key: k }, () => ({ id: 7 }))
    if (result.kind !== 'executed') throw new Error(`expected executed, got ${result.kind}`)
    expect(result.response.status).toBe(200)
    expect(result.response.headers).toEqual({ 'content-type': 'application/json' })
    expect(new TextDecoder().decode(result.response.body)).toBe('{"id":7}')
    const replay = await ledger.run({ key: k }, () => ({ id: 8 }))
    if (replay.kind !== 'replayed') throw new Error(`expected replayed, got ${replay.kind}`)
    expect(replay.value).toEqual({ id: 7 })
    expect(replay.record.response?.headers).toEqual({ 'content-type': 'application/json' })
  })

  it('stores undefined as null, which a replay decodes', async () => {
    const { ledger } = setup()
    const k = key()
    const result = await ledger.run({ key: k }, () => undefined)
    if (result.kind !== 'executed') throw new Error(`expected executed, got ${result.kind}`)
    expect(new TextDecoder().decode(result.response.body)).toBe('null')
    expect(await ledger.run({ key: k }, () => 'again')).toMatchObject({ kind: 'replayed', value: null })
  })
})

describe('Ledger.run: waiting, in_progress and retry-after', () => {
  it('reports each wait and the final in_progress with their exact fields, waiting no longer than `wait`', async () => {
    const { ledger, clock, store, events } = setup({ wait: 30 })
    const k = key()
    const startMs = clock.now()
    await store.acquire('default', k, FP, 30_000) // a holder elsewhere
    const lockedUntilMs = startMs + 30_000
    const result = await drive(
      clock,
      ledger.run({ key: k }, () => 'dup'),
    )
    // Polls at 0 and 20 ms, then sleeps only the 10 ms left of the 30 ms wait.
    expect(clock.now()).toBe(startMs + 30)
    expect(result).toEqual({ kind: 'in_progress', lockedUntilMs, retryAfterMs: 2_000 })
    expect(events).toEqual([
      { type: 'waiting', scope: 'default', key: k, lockedUntilMs, durationMs: 0 },
      { type: 'waiting', scope: 'default', key: k, lockedUntilMs, durationMs: 20 },
      { type: 'in_progress', scope: 'default', key: k, lockedUntilMs, waitedMs: 30, durationMs: 30 },
    ])
  })

  it('stops watching the record once it answers', async () => {
    const { ledger, clock, store } = setup({ wait: 50 })
    let watching = 0
    const watch = store.watch.bind(store)
    store.watch = (scope, k, onChange) => {
      watching++
      const unsubscribe = watch(scope, k, onChange)
      return () => {
        watching--
        unsubscribe()
      }
    }
    const k = key()
    await store.acquire('default', k, FP, 30_000)
    expect(
      await drive(
        clock,
        ledger.run({ key: k }, () => 'dup'),
      ),
    ).toMatchObject({ kind: 'in_progress' })
    expect(watching).toBe(0)
  })

  it('hints a retry after whole seconds, never past a lease that ends 1 s or more away', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    await store.acquire('default', k, FP, 1_500)
    expect(await ledger.run({ key: k }, () => 'dup')).toEqual({
      kind: 'in_progress',
      lockedUntilMs: clock.now() + 1_500,
      retryAfterMs: 1_000,
    })
    const nowMs = 1_000_000
    expect(retryAfter(nowMs + 25_000, nowMs)).toBe(RETRY_AFTER_MAX_MS)
    expect(retryAfter(nowMs + 2_999, nowMs)).toBe(2_000)
    expect(retryAfter(nowMs + 1_999, nowMs)).toBe(1_000)
    expect(retryAfter(nowMs + 200, nowMs)).toBe(1_000)
    expect(retryAfter(nowMs - 5_000, nowMs)).toBe(1_000)
  })
})

describe('Ledger: reconcile on takeover', () => {
  it('runs a takeover without reconcile even when the earlier attempt left a started marker', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    await crashedHolderWithMarker(store, k, 'charge')
    clock.advance(30_001)
    let charges = 0
    const result = await ledger.run({ key: k }, (ctx) => ctx.step('charge', () => ++charges))
    expect(result).toMatchObject({ kind: 'executed', value: 1, token: 2, outcome: 'completed' })
    expect(charges).toBe(1)
  })

  it('does not call reconcile on a takeover with nothing pending', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    await store.acquire('default', k, FP, 30_000) // died before any step
    clock.advance(30_001)
    const calls: PendingStep[][] = []
    const result = await ledger.run({ key: k }, (ctx) => ctx.takeover, { reconcile: (pending) => void calls.push(pending) })
    expect(result).toMatchObject({ kind: 'executed', value: true, token: 2 })
    expect(calls).toEqual([])
  })

  it('begin: a reconcile that throws releases the record and rejects with its error', async () => {
    const { ledger, clock, store, events } = setup()
    const k = key()
    await crashedHolderWithMarker(store, k, 'charge')
    clock.advance(30_001)
    const lookupDown = new Error('lookup down')
    await expect(
      ledger.begin(
        { key: k },
        {
          reconcile: () => {
            throw lookupDown
          },
        },
      ),
    ).rejects.toBe(lookupDown)
    expect(events.filter((e) => e.type === 'released')).toMatchObject([{ key: k, token: 2 }])
    // Released, not left to its lease: the next attempt takes over at once.
    expect(await ledger.run({ key: k }, () => 'next')).toMatchObject({ kind: 'executed', token: 3 })
  })

  it('begin: reconcile records a pending step so the work does not run it again', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    await crashedHolderWithMarker(store, k, 'charge')
    clock.advance(30_001)
    const begun = await ledger.begin<string>(
      { key: k },
      { reconcile: (pending, ctx) => ctx.recordStep(pending[0]?.name ?? 'none', { id: 'found' }) },
    )
    if (begun.kind !== 'acquired') throw new Error(`expected acquired, got ${begun.kind}`)
    const found = await begun.context.step('charge', () => ({ id: 'ran again' }))
    expect(found).toEqual({ id: 'found' })
    expect(await begun.finish(found.id)).toMatchObject({ kind: 'executed', value: 'found', token: 2 })
  })
})

describe('Ledger: telemetry', () => {
  it('begin ends the run telemetry at finish, not when it hands the record over', async () => {
    const clock = new ManualClock()
    const { telemetry, ends } = recordingTelemetry()
    const ledger = new Ledger({ store: new MemoryStore({ clock }), clock, telemetry })
    const begun = await ledger.begin<number>({ key: key() })
    if (begun.kind !== 'acquired') throw new Error(`expected acquired, got ${begun.kind}`)
    expect(ends).toEqual([])
    await begun.finish(1)
    expect(ends).toEqual(['executed'])
  })

  it("still calls the run's own onEvent when telemetry sees the events", async () => {
    const clock = new ManualClock()
    const { telemetry, events: seenByTelemetry } = recordingTelemetry()
    const ledger = new Ledger({ store: new MemoryStore({ clock }), clock, telemetry })
    const heard: string[] = []
    await ledger.run({ key: key() }, () => 1, { onEvent: (e) => heard.push(e.type) })
    expect(heard).toEqual(['acquired', 'stored'])
    expect(seenByTelemetry).toEqual(['acquired', 'stored'])
  })

  it('runInTransaction runs the work through telemetry and returns its value', async () => {
    const { telemetry, ends, works } = recordingTelemetry()
    const ledger = new Ledger({ store: new TxMemoryStore(), telemetry })
    const result = await ledger.runInTransaction({ key: key() }, ({ tx }) => {
      tx.push('write')
      return { charged: true }
    })
    expect(result).toMatchObject({ kind: 'executed', value: { charged: true }, outcome: 'completed' })
    expect(works()).toBe(1)
    expect(ends).toEqual(['executed'])
  })
})

/** A transactional store that records steps in the transaction, visibly. */

class TxStepsStore extends TxMemoryStore {
  recordStepInTransaction(tx: string[], scope: string, k: string, token: number, name: string, result: string | null): Promise<boolean> {
    tx.push(`step ${name}=${result}`)
    return this.recordStep(scope, k, token, name, result)
  }
}

describe('Ledger.runInTransaction: events and steps', () => {
  it('reports stored with its fields', async () => {
    const events: LedgerEvent[] = []
    const ledger = new Ledger({ store: new TxMemoryStore(), clock: new ManualClock(), onEvent: (e) => events.push(e) })
    const k = key()
    await ledger.runInTransaction({ key: k }, () => 'ok')
    expect(events.at(-1)).toEqual({ type: 'stored', scope: 'default', key: k, token: 1, status: 'completed', durationMs: 0 })
  })

  it('reports fenced_out with its fields when another holder took the record over', async () => {
    const store = new TxMemoryStore()
    const events: LedgerEvent[] = []
    const ledger = new Ledger({ store, clock: new ManualClock(), onEvent: (e) => events.push(e) })
    const k = key()
    const result = await ledger.runInTransaction({ key: k }, async ({ token }) => {
      await store.release('default', k, token)
      await store.acquire('default', k, FP, 30_000)
      return 'late'
    })
    expect(result).toMatchObject({ kind: 'executed', outcome: 'fenced_out', value: 'late' })
    expect(events.at(-1)).toEqual({ type: 'fenced_out', scope: 'default', key: k, token: 1, durationMs: 0 })
  })

  it("records steps in the run's transaction when the store can", async () => {
    const store = new TxStepsStore()
    const ledger = new Ledger({ store })
    const result = await ledger.runInTransaction({ key: key() }, async (ctx) => {
      const charge = await ctx.step('charge', () => ({ id: 'ch_1' }))
      ctx.tx.push(`order paid by ${charge.id}`)
      return charge.id
    })
    expect(result).toMatchObject({ kind: 'executed', value: 'ch_1', outcome: 'completed' })
    expect(store.committed).toEqual(['step charge={"id":"ch_1"}', 'order paid by ch_1'])
  })

  it('records steps through the store on its own when it cannot record them in the transaction', async () => {
    const store = new TxMemoryStore()
    const ledger = new Ledger({ store })
    const result = await ledger.runInTransaction({ key: key() }, (ctx) => ctx.step('charge', () => 'ch_1'))
    expect(result).toMatchObject({ kind: 'executed', value: 'ch_1', outcome: 'completed' })
  })
})
