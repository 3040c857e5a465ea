/** A run the caller holds (Ledger.begin), the renewals its lease shares, and a run's deadline. */
import { randomUUID } from 'node:crypto'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { ManualClock } from './clock.js'
import { Ledger, type LedgerEvent } from './ledger.js'

const key = () => `k-${randomUUID()}`

/** Resolves once `clock` has `n` sleepers, so a test moves time only after the code under test waits. */
async function sleepers(clock: ManualClock, n = 1): Promise<void> {
  for (let i = 0; i < 1_000 && clock.pendingSleeps < n; i++) await new Promise((r) => setImmediate(r))
  expect(clock.pendingSleeps).toBeGreaterThanOrEqual(n)
}

function setup(options: { wait?: number } = {}) {
  const clock = new ManualClock()
  const store = new MemoryStore({ clock })
  const events: LedgerEvent[] = []
  const ledger = new Ledger({ store, clock, lease: '30s', ttl: '1h', wait: options.wait ?? 0, onEvent: (e) => events.push(e) })
  return { clock, store, ledger, events }
}

describe('Ledger.begin', () => {
  it('hands the record over; finish stores the value and a retry replays it without running anything', async () => {
    const { ledger, events } = setup()
    const k = key()
    const begun = await ledger.begin<{ id: number }>({ key: k, payload: { amount: 1 } })
    if (begun.kind !== 'acquired') throw new Error(`expected acquired, got ${begun.kind}`)
    expect(begun.context).toMatchObject({ key: k, scope: 'default', token: 1, takeover: false })
    const result = await begun.finish({ id: 7 })
    expect(result).toMatchObject({ kind: 'executed', value: { id: 7 }, outcome: 'completed' })
    const again = await ledger.begin({ key: k, payload: { amount: 1 } })
    expect(again).toMatchObject({ kind: 'replayed', value: { id: 7 } })
    expect(events.map((e) => e.type)).toEqual(['acquired', 'stored', 'replayed'])
  })

  it('fail releases the record, so the next attempt runs afresh as a takeover', async () => {
    const { ledger } = setup()
    const k = key()
    const begun = await ledger.begin({ key: k, payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    await begun.fail(new Error('handler threw'))
    const retry = await ledger.begin({ key: k, payload: 1 })
    if (retry.kind !== 'acquired') throw new Error(retry.kind)
    expect(retry.context.takeover).toBe(true)
    await retry.finish('ok')
  })

  it('refuses a second finish or fail: one run settles its record once', async () => {
    const { ledger } = setup()
    const begun = await ledger.begin({ key: key(), payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    await begun.finish('first')
    await expect(begun.finish('second')).rejects.toThrow(/already called/)
    await expect(begun.fail(new Error('late'))).rejects.toThrow(/already called/)
  })

  it('keeps renewing the lease between begin and finish, so nobody takes over a live holder', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    const begun = await ledger.begin({ key: k, payload: 1 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    for (let i = 0; i < 6; i++) {
      clock.advance(10_000) // a third of the 30 s lease: a renewal is due
      for (let j = 0; j < 5; j++) await new Promise((r) => setImmediate(r))
    }
    // 60 s after the acquire, twice the lease: still this holder's, since it was renewed.
    expect((await store.get('default', k))?.token).toBe(1)
    expect((await ledger.begin({ key: k, payload: 1 })).kind).toBe('in_progress')
    expect((await begun.finish('done')).kind).toBe('executed')
    expect(clock.pendingSleeps).toBe(0)
  })
})

describe('Ledger: renewals share one timer', () => {
  it('a hundred runs at once wait on one clock timer, and none is left once they end', async () => {
    const { ledger, clock } = setup()
    const releases: Array<() => void> = []
    const runs = Array.from({ length: 100 }, () =>
      ledger.run({ key: key(), payload: 1 }, () => new Promise<string>((resolve) => releases.push(() => resolve('ok')))),
    )
    for (let i = 0; i < 100 && releases.length < 100; i++) await new Promise((r) => setImmediate(r))
    expect(releases).toHaveLength(100)
    expect(clock.pendingSleeps).toBe(1)
    for (const release of releases) release()
    expect((await Promise.all(runs)).every((r) => r.kind === 'executed')).toBe(true)
    expect(clock.pendingSleeps).toBe(0)
  })

  it('the work may take its context apart: const { step, signal, uuid } = ctx', async () => {
    const { ledger } = setup()
    const result = await ledger.run({ key: key(), payload: 1 }, async ({ step, signal, uuid, takeover }) => {
      expect(signal.aborted).toBe(false)
      expect(takeover).toBe(false)
      return { charged: await step('charge', () => 42), id: await uuid() }
    })
    expect(result).toMatchObject({ kind: 'executed', value: { charged: 42 } })
  })
})

describe('Ledger: a run with a deadline (RunOptions.deadlineMs)', () => {
  it('takes a lease that ends by the deadline, so the record frees itself then', async () => {
    const { ledger, clock, store } = setup()
    const k = key()
    const begun = await ledger.begin({ key: k, payload: 1 }, { deadlineMs: clock.now() + 2_000 })
    if (begun.kind !== 'acquired') throw new Error(begun.kind)
    expect((await store.get('default', k))?.lockedUntilMs).toBe(clock.now() + 2_000)
    clock.advance(2_000)
    const retry = await ledger.begin({ key: k, payload: 1 })
    expect(retry).toMatchObject({ kind: 'acquired', context: { takeover: true, token: 2 } })
  })

  it('makes no renewal past the deadline: the lease is lost and the work told through its signal', async () => {
    const { ledger, clock, events } = setup()
    const k = key()
    let signal: AbortSignal | undefined
    const run = ledger.run(
      { key: k, payload: 1 },
      (ctx) => {
        signal = ctx.signal
        return new Promise<string>((resolve) => ctx.signal.addEventListener('abort', () => resolve('stopped')))
      },
      { deadlineMs: clock.now() + 5_000 },
    )
    await sleepers(clock)
    clock.advance(10_000) // the first renewal is due after the deadline
    await run
    expect(signal?.aborted).toBe(true)
    expect(events.map((e) => e.type)).toContain('lease_lost')
  })

  it('refuses a deadline that is not a time', async () => {
    const { ledger } = setup()
    await expect(ledger.run({ key: key(), payload: 1 }, () => 1, { deadlineMs: Number.NaN })).rejects.toThrow(/deadlineMs/)
  })
})
