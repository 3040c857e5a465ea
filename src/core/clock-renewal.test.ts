import { randomUUID } from 'node:crypto'
import { getEventListeners } from 'node:events'
import { drive, turn } from '../../test/helpers/manual-clock.js'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { isIdempotencyError } from '../errors.js'
import { ManualClock, systemClock } from './clock.js'
import { Ledger, type LedgerEvent } from './ledger.js'
import type { LedgerTelemetry } from './ledger-types.js'

const key = () => `k-${randomUUID()}`
const realDelay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

async function turns(n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await turn()
}

/** Where a promise stands after the pending microtasks and one turn of the event loop have run. */
async function stateOf(promise: Promise<unknown>): Promise<{ state: 'pending' | 'resolved' | 'rejected'; value: unknown }> {
  const seen: { state: 'pending' | 'resolved' | 'rejected'; value: unknown } = { state: 'pending', value: undefined }
  promise.then(
    (value) => Object.assign(seen, { state: 'resolved', value }),
    (error: unknown) => Object.assign(seen, { state: 'rejected', value: error }),
  )
  await turn()
  return seen
}

const abortListeners = (signal: AbortSignal) => getEventListeners(signal, 'abort').length

describe('systemClock', () => {
  it('timer calls back once its time has passed, not before', async () => {
    const fired: string[] = []
    systemClock.timer(80, () => fired.push('due'))
    await realDelay(20)
    expect(fired).toEqual([])
    await realDelay(120)
    expect(fired).toEqual(['due'])
  })

  it('timer returns a cancel that keeps the callback from ever running', async () => {
    const fired: string[] = []
    const cancel = systemClock.timer(20, () => fired.push('cancelled'))
    cancel()
    await realDelay(60)
    expect(fired).toEqual([])
  })

  it('sleep resolves after the time asked for', async () => {
    const startedMs = Date.now()
    await systemClock.sleep(60)
    expect(Date.now() - startedMs).toBeGreaterThanOrEqual(50)
  })

  it('sleep on an already aborted signal rejects at once with the signal reason', async () => {
    const controller = new AbortController()
    const reason = new Error('shutting down')
    controller.abort(reason)
    expect(await stateOf(systemClock.sleep(50, controller.signal))).toEqual({ state: 'rejected', value: reason })
  })

  it('sleep rejects with the signal reason when aborted meanwhile, and leaves no listener on the signal', async () => {
    const controller = new AbortController()
    const reason = new Error('client went away')
    const sleeping = systemClock.sleep(200, controller.signal)
    expect(abortListeners(controller.signal)).toBe(1)
    controller.abort(reason)
    expect(await stateOf(sleeping)).toEqual({ state: 'rejected', value: reason })
    expect(abortListeners(controller.signal)).toBe(0)
  })

  it('sleep that ends leaves no listener on a long-lived signal', async () => {
    const controller = new AbortController()
    await systemClock.sleep(5, controller.signal)
    await systemClock.sleep(5, controller.signal)
    expect(abortListeners(controller.signal)).toBe(0)
  })
})

describe('ManualClock', () => {
  it('advance refuses a negative or non-numeric step with a RangeError that names it', () => {
    const clock = new ManualClock(0)
    expect(() => clock.advance(-1)).toThrow(RangeError)
    expect(() => clock.advance(-1)).toThrow('ManualClock.advance takes a non-negative number, got -1')
    expect(() => clock.advance(Number.NaN)).toThrow(/non-negative number, got NaN/)
    expect(clock.now()).toBe(0)
  })

  it('advance(0) is allowed and fires what is due right now', () => {
    const clock = new ManualClock(0)
    const fired: string[] = []
    clock.timer(0, () => fired.push('now'))
    clock.advance(0)
    expect(fired).toEqual(['now'])
    expect(clock.now()).toBe(0)
  })

  it('timer fires once time reaches its delay, not a millisecond earlier', () => {
    const clock = new ManualClock(0)
    const fired: string[] = []
    clock.timer(100, () => fired.push('due'))
    clock.advance(99)
    expect(fired).toEqual([])
    expect(clock.pendingSleeps).toBe(1)
    clock.advance(1)
    expect(fired).toEqual(['due'])
    expect(clock.pendingSleeps).toBe(0)
  })

  it('sleep of zero or less resolves without any time passing', async () => {
    const clock = new ManualClock(0)
    expect(await stateOf(clock.sleep(0))).toEqual({ state: 'resolved', value: undefined })
    expect(await stateOf(clock.sleep(-5))).toEqual({ state: 'resolved', value: undefined })
    expect(clock.pendingSleeps).toBe(0)
  })

  it('sleep on an already aborted signal rejects at once with its reason, even for no time', async () => {
    const clock = new ManualClock(0)
    const controller = new AbortController()
    const reason = new Error('stop')
    controller.abort(reason)
    expect(await stateOf(clock.sleep(100, controller.signal))).toEqual({ state: 'rejected', value: reason })
    expect(await stateOf(clock.sleep(0, controller.signal))).toEqual({ state: 'rejected', value: reason })
    expect(clock.pendingSleeps).toBe(0)
  })

  it('aborting one sleep rejects it with the reason and no longer counts it, while the others still wake', async () => {
    const clock = new ManualClock(0)
    const controller = new AbortController()
    const reason = new Error('cancelled')
    const aborted = clock.sleep(100, controller.signal)
    const other = clock.sleep(100)
    expect(clock.pendingSleeps).toBe(2)
    controller.abort(reason)
    expect(await stateOf(aborted)).toEqual({ state: 'rejected', value: reason })
    expect(clock.pendingSleeps).toBe(1)
    expect((await stateOf(other)).state).toBe('pending')
    clock.advance(100)
    expect(await stateOf(other)).toEqual({ state: 'resolved', value: undefined })
    expect(clock.pendingSleeps).toBe(0)
  })

  it('leaves no listener on the signal once a sleep has woken or been aborted', async () => {
    const clock = new ManualClock(0)
    const longLived = new AbortController()
    const woken = clock.sleep(10, longLived.signal)
    expect(abortListeners(longLived.signal)).toBe(1)
    clock.advance(10)
    await woken
    expect(abortListeners(longLived.signal)).toBe(0)

    const aborting = new AbortController()
    const aborted = clock.sleep(10, aborting.signal)
    aborting.abort(new Error('stop'))
    await expect(aborted).rejects.toThrow('stop')
    expect(abortListeners(aborting.signal)).toBe(0)
  })
})

function setup(options: { telemetry?: LedgerTelemetry } = {}) {
  const clock = new ManualClock()
  const store = new MemoryStore({ clock })
  const events: LedgerEvent[] = []
  const ledger = new Ledger({ store, clock, lease: '30s', ttl: '1h', wait: 0, onEvent: (e) => events.push(e), ...options })
  return { clock, store, ledger, events }
}

/** A store call held open until the test settles it. */
function deferred<T>() {
  let resolve: (value: T | Promise<T>) => void = () => {}
  let reject: (error: unknown) => void = () => {}
  const promise = new Promise<T>((res, rej) => {
    resolve = res
    reject = rej
  })
  return { promise, resolve, reject }
}

describe('Renewal: a run with a deadline', () => {
  it('renews the lease while the deadline is still ahead', async () => {
    const { ledger, clock, store, events } = setup()
    const k = key()
    const startMs = clock.now()
    const begun = await ledger.begin({ key: k, payload: 1 }, { deadlineMs: startMs + 100_000 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    clock.advance(10_000) // the first renewal is due, 90 s before the deadline
    await turns()
    expect((await store.get('default', k))?.lockedUntilMs).toBe(startMs + 40_000)
    expect(begun.context.signal.aborted).toBe(false)
    expect(events.map((e) => e.type)).not.toContain('lease_lost')
    expect(await begun.finish('done')).toMatchObject({ kind: 'executed', outcome: 'completed' })
  })

  it('at the deadline exactly makes no renewal: the lease is lost, reported, and the work told why', async () => {
    const { ledger, clock, store, events } = setup()
    const k = key()
    let renewals = 0
    const renew = store.renew.bind(store)
    store.renew = (...args) => {
      renewals++
      return renew(...args)
    }
    const begun = await ledger.begin({ key: k, payload: 1 }, { deadlineMs: clock.now() + 10_000 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    clock.advance(10_000) // the first renewal falls on the deadline itself
    await turns()
    expect(renewals).toBe(0)
    expect(events.filter((e) => e.type === 'lease_lost')).toEqual([
      { type: 'lease_lost', scope: 'default', key: k, token: 1, durationMs: 10_000 },
    ])
    const { signal } = begun.context
    expect(signal.aborted).toBe(true)
    expect(isIdempotencyError(signal.reason) && signal.reason.code).toBe('FENCED_OUT')
    expect((signal.reason as Error).message).toBe(
      `Lost the lease on key "${k}" (token 1): another holder may run it now. Stop work that has not committed.`,
    )
    await begun.fail(new Error('stopped'))
  })

  it('gives up an outcome the store cannot take before the deadline, not at the end of the lease', async () => {
    const { ledger, clock, store, events } = setup()
    const startMs = clock.now()
    let lastAttemptMs = 0
    store.complete = async () => {
      lastAttemptMs = clock.now()
      throw new Error('connect ECONNREFUSED')
    }
    const running = ledger.run({ key: key(), payload: 1 }, () => 'ran', { deadlineMs: startMs + 5_000 })
    expect(await drive(clock, running, 100)).toMatchObject({ kind: 'executed', outcome: 'unrecorded' })
    // Deadline 5 s (lease 30 s): retried until a margin before the deadline, then given up.
    expect(lastAttemptMs - startMs).toBeGreaterThan(3_000)
    expect(clock.now() - startMs).toBeLessThan(5_000)
    expect(events.map((e) => e.type)).toContain('unrecorded')
  })
})

describe('Renewal: failed renewals', () => {
  it('reports a failed renewal as a store_error of the renew operation and keeps the lease while it lasts', async () => {
    const { ledger, clock, store, events } = setup()
    store.renew = async () => {
      throw new Error('connection reset')
    }
    const k = key()
    const begun = await ledger.begin({ key: k, payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    clock.advance(10_000)
    await turns()
    expect(events.filter((e) => e.type === 'store_error')).toMatchObject([{ type: 'store_error', key: k, operation: 'renew' }])
    expect(begun.context.signal.aborted).toBe(false)
    expect(await begun.finish('done')).toMatchObject({ kind: 'executed', outcome: 'completed' })
  })

  it('a renewal that fails while the run finishes schedules no further renewal', async () => {
    const { ledger, clock, store } = setup()
    const pending = deferred<boolean>()
    let renewals = 0
    store.renew = () => {
      renewals++
      return pending.promise
    }
    const begun = await ledger.begin({ key: key(), payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    clock.advance(10_000)
    await turns()
    expect(renewals).toBe(1)
    const finishing = begun.finish('done')
    await turns()
    pending.reject(new Error('connection reset'))
    expect(await finishing).toMatchObject({ kind: 'executed', outcome: 'completed' })
    expect(clock.pendingSleeps).toBe(0)
    clock.advance(60_000)
    await turns()
    expect(renewals).toBe(1)
  })
})

describe('Held: finish and fail', () => {
  it('finish waits for a renewal in flight before it completes the record', async () => {
    const { ledger, clock, store } = setup()
    const calls: string[] = []
    const renew = store.renew.bind(store)
    const pending = deferred<boolean>()
    store.renew = (...args) => {
      calls.push('renew started')
      return pending.promise.then(async () => {
        const renewed = await renew(...args)
        calls.push('renew ended')
        return renewed
      })
    }
    const complete = store.complete.bind(store)
    store.complete = (...args) => {
      calls.push('complete')
      return complete(...args)
    }
    const k = key()
    const begun = await ledger.begin({ key: k, payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    clock.advance(10_000)
    await turns()
    const finishing = begun.finish('done')
    await turns()
    expect(calls).toEqual(['renew started'])
    pending.resolve(true)
    expect(await finishing).toMatchObject({ kind: 'executed', value: 'done', outcome: 'completed' })
    expect(calls).toEqual(['renew started', 'renew ended', 'complete'])
    expect((await store.get('default', k))?.status).toBe('completed')
  })

  it('refuses a second finish with INVALID_ARGUMENT and says to call exactly one of finish or fail', async () => {
    const { ledger } = setup()
    const begun = await ledger.begin({ key: key(), payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    await begun.finish('first')
    await expect(begun.finish('second')).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: 'finish() or fail() was already called for this run: call exactly one of them, once.',
    })
  })
})

describe('Held: the run telemetry ends exactly once', () => {
  function recording() {
    const ends: Array<{ kind: string | undefined; error: unknown }> = []
    const telemetry: LedgerTelemetry = {
      startRun: () => ({
        storeCall: (_operation, call) => call(),
        work: (fn) => fn(),
        event: () => {},
        end: (kind, error) => {
          ends.push({ kind, error })
        },
      }),
    }
    return { telemetry, ends }
  }

  it('run(): ends once with the result kind', async () => {
    const { telemetry, ends } = recording()
    const { ledger } = setup({ telemetry })
    await ledger.run({ key: key(), payload: 1 }, () => 'ok')
    expect(ends).toEqual([{ kind: 'executed', error: undefined }])
  })

  it('run() whose work throws: ends once with the error', async () => {
    const { telemetry, ends } = recording()
    const { ledger } = setup({ telemetry })
    const boom = new Error('work failed')
    await expect(
      ledger.run({ key: key(), payload: 1 }, () => {
        throw boom
      }),
    ).rejects.toBe(boom)
    expect(ends).toEqual([{ kind: undefined, error: boom }])
  })

  it('run() whose outcome cannot be encoded: rejects with INVALID_ARGUMENT caused by that error and ends once with it', async () => {
    const { telemetry, ends } = recording()
    const { ledger } = setup({ telemetry })
    const boom = new Error('cannot encode')
    const encode = () => {
      throw boom
    }
    const error = await ledger.run({ key: key(), payload: 1 }, () => 'ok', { encode }).catch((e: unknown) => e)
    expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', cause: boom })
    expect(ends).toEqual([{ kind: undefined, error }])
  })

  it('begin(): nothing ends at begin; finish ends it with the result kind', async () => {
    const { telemetry, ends } = recording()
    const { ledger } = setup({ telemetry })
    const begun = await ledger.begin({ key: key(), payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    expect(ends).toEqual([])
    await begun.finish('done')
    expect(ends).toEqual([{ kind: 'executed', error: undefined }])
  })

  it('begin(): fail ends it with the error', async () => {
    const { telemetry, ends } = recording()
    const { ledger } = setup({ telemetry })
    const begun = await ledger.begin({ key: key(), payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    const boom = new Error('handler threw')
    await begun.fail(boom)
    expect(ends).toEqual([{ kind: undefined, error: boom }])
  })

  it('begin(): a finish whose outcome cannot be encoded rejects with INVALID_ARGUMENT caused by that error and ends with it', async () => {
    const { telemetry, ends } = recording()
    const { ledger } = setup({ telemetry })
    const boom = new Error('cannot encode')
    const begun = await ledger.begin<string>(
      { key: key(), payload: 1 },
      {
        encode: () => {
          throw boom
        },
      },
    )
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    const error = await begun.finish('done').catch((e: unknown) => e)
    expect(error).toMatchObject({ code: 'INVALID_ARGUMENT', cause: boom })
    expect(ends).toEqual([{ kind: undefined, error }])
  })
})
