/**
 * The consumer helpers' engine against a broker simulated in memory, under random workloads: messages
 * of a few keys that succeed, fail a few times, always fail, or kill the process; random concurrency,
 * batch sizes, `maxAttempts`, effect durations (microtask turns) and inboxes with and without batches.
 * Consumer processes follow one another: one that dies leaves its unsettled messages to the broker,
 * which delivers them again, marked redelivered, with what came back in its original order.
 * What must hold whatever the schedule: a key's messages applied in their order, never more effects
 * at once than `concurrency`, a redelivered message isolated when attempts are counted, every message
 * either applied once or given up on (never both), one that never fails always applied, and a message
 * that kills the process given up on after at most maxAttempts + 1 runs.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { createDispatcher, type Verdict } from './dispatcher.js'
import type { Inbox, InboxMessage } from './inbox/types.js'

type Kind = 'ok' | 'flaky' | 'bad' | 'poison'

interface Spec {
  key: number
  kind: Kind
  /** Microtask turns its effect takes. */
  turns: number
  /** The round in which it is published: later rounds mix new messages with redelivered ones. */
  wave: number
}

interface Workload {
  messages: Spec[]
  concurrency: number
  batchSize: number
  maxAttempts: number | undefined
  withBatch: boolean
  recordsFailures: boolean
  isolate: boolean
  /** A new process each round (a restart), with an inbox that keeps the counts. */
  restarts: boolean
}

const spec = fc.record({
  key: fc.integer({ min: 0, max: 2 }),
  kind: fc.constantFrom<Kind>('ok', 'ok', 'ok', 'flaky', 'bad'),
  turns: fc.integer({ min: 0, max: 6 }),
  wave: fc.integer({ min: 0, max: 2 }),
})

const workload = fc
  .record({
    messages: fc.array(spec, { minLength: 1, maxLength: 12 }),
    poison: fc.option(fc.nat(), { nil: undefined }),
    concurrency: fc.integer({ min: 1, max: 4 }),
    batchSize: fc.integer({ min: 1, max: 4 }),
    maxAttempts: fc.option(fc.integer({ min: 1, max: 4 }), { nil: undefined }),
    withBatch: fc.boolean(),
    recordsFailures: fc.boolean(),
    isolate: fc.boolean(),
    restarts: fc.boolean(),
  })
  .map(({ poison, ...w }): Workload => {
    // Without maxAttempts a message that always fails is retried for ever: it fails twice instead.
    let messages =
      w.maxAttempts === undefined ? w.messages.map((m) => (m.kind === 'bad' ? { ...m, kind: 'flaky' as const } : m)) : w.messages
    // A message that kills the process only where it can be stopped: attempts counted in the inbox, redeliveries isolated.
    if (poison !== undefined && counts(w))
      messages = messages.map((m, i) => (i === poison % messages.length ? { ...m, kind: 'poison' as const } : m))
    // Published in wave order: a key's order is the order of publication.
    return { ...w, messages: [...messages].sort((a, b) => a.wave - b.wave) }
  })

/** Whether redelivered messages run isolated, their attempts counted before they run. */
function counts(w: Omit<Workload, 'messages'>): boolean {
  return w.maxAttempts !== undefined && w.recordsFailures && w.isolate
}

const frozen = () => new Promise<never>(() => {})
const turns = async (n: number) => {
  for (let i = 0; i < n; i++) await Promise.resolve()
}

async function simulate(w: Workload) {
  const ids = w.messages.map((m, i) => `k${m.key}-${i}-${m.kind}`)
  const specOf = new Map(ids.map((id, i) => [id, w.messages[i] as Spec]))
  /** Applied, in commit order (what the database holds). */
  const applied: string[] = []
  const ran = new Map<string, number>()
  const dead: string[] = []
  const recorded = new Map<string, number>()
  /** Messages whose count a dying process meant to forget: what purge() is for. */
  const forgetsLost = new Set<string>()
  const violations: string[] = []

  /** A consumer process: its dispatcher and inbox, until its poison message kills it. */
  function startProcess() {
    const proc = { gone: false, crashed: undefined as unknown as Promise<void>, redelivered: new Set<string>() }
    let crash: () => void = () => {}
    proc.crashed = new Promise<void>((resolve) => {
      crash = () => {
        proc.gone = true
        resolve()
      }
    })
    let running = 0
    let isolatedRunning: string | undefined
    /** Runs one message's effect inside its "transaction"; throws as its kind says. */
    const effect = async (message: InboxMessage): Promise<void> => {
      if (proc.gone) return frozen()
      const spec = specOf.get(message.id) as Spec
      const runs = (ran.get(message.id) ?? 0) + 1
      ran.set(message.id, runs)
      const isolated = counts(w) && proc.redelivered.has(message.id)
      if (isolated && running > 0) violations.push(`isolated ${message.id} started beside ${running} running effect(s)`)
      if (isolatedRunning !== undefined) violations.push(`${message.id} started beside isolated ${isolatedRunning}`)
      if (isolated) isolatedRunning = message.id
      running++
      if (running > w.concurrency) violations.push(`${running} effects at once, over concurrency ${w.concurrency}`)
      try {
        if (spec.kind === 'poison') {
          crash()
          return frozen()
        }
        await turns(spec.turns)
        if (proc.gone) return frozen()
        if (spec.kind === 'bad' || (spec.kind === 'flaky' && runs <= 2)) throw new Error(`injected: ${message.id} fails`)
      } finally {
        running--
        if (isolated) isolatedRunning = undefined
      }
    }
    const base: Inbox<unknown> = {
      consumer: 'c',
      async handle(message, fn) {
        if (applied.includes(message.id)) return { type: 'duplicate', consumer: 'c', messageId: message.id } as never
        await effect(message)
        await fn(undefined, message)
        if (proc.gone) return frozen()
        applied.push(message.id)
        return { type: 'applied', consumer: 'c', messageId: message.id } as never
      },
      ...(w.withBatch
        ? {
            async handleBatch(messages: readonly InboxMessage[]) {
              // One transaction: everything or nothing is applied.
              const fresh = messages.filter((m) => !applied.includes(m.id))
              for (const message of fresh) await effect(message)
              if (proc.gone) return frozen()
              applied.push(...fresh.map((m) => m.id))
              return messages.map((m) => ({ status: fresh.includes(m) ? 'applied' : 'duplicate', consumer: 'c', messageId: m.id })) as never
            },
          }
        : {}),
    }
    const inbox: Inbox<unknown> = w.recordsFailures
      ? {
          ...base,
          async recordFailure(message) {
            await Promise.resolve()
            if (proc.gone) return frozen()
            const n = (recorded.get(message.id) ?? 0) + 1
            recorded.set(message.id, n)
            return n
          },
          async forgetFailures(messageId) {
            // A process that died after settling the message never forgets its count: left to purge().
            if (proc.gone) forgetsLost.add(messageId)
            else recorded.delete(messageId)
          },
        }
      : base
    const dispatcher = createDispatcher({
      inbox,
      handler: () => {},
      concurrency: w.concurrency,
      batchSize: w.batchSize,
      maxAttempts: w.maxAttempts,
      isolateRedelivered: w.isolate,
      failureHoldMs: 60_000,
    })
    return { proc, dispatcher }
  }

  let queue: Array<{ id: string; redelivered: boolean }> = []
  const published = (round: number) => ids.filter((id) => (specOf.get(id) as Spec).wave === round).map((id) => ({ id, redelivered: false }))
  let current: ReturnType<typeof startProcess> | undefined
  let processes = 0
  for (let round = 0; round < 60 && (queue.length > 0 || round <= 2); round++) {
    // What came back first, in its original order, then what is published now.
    queue = [...queue, ...published(round)]
    if (queue.length === 0) continue
    // A new process after a crash; after every round too when the inbox keeps the counts (a restart).
    if (!current || current.proc.gone || (w.recordsFailures && w.restarts)) {
      current = startProcess()
      processes++
    }
    const { proc, dispatcher } = current
    // What comes back to the broker, by position in this round's deliveries.
    const delivered = queue
    const back = new Set<number>()
    const unsettled = new Set(delivered.map((_, i) => i))
    for (const [i, m] of delivered.entries()) {
      if (m.redelivered) proc.redelivered.add(m.id)
      dispatcher.push(
        `k${(specOf.get(m.id) as Spec).key}`,
        { id: m.id, payload: '', topic: 't' },
        (verdict: Verdict) => {
          // A dead process settles nothing: the broker has its messages back.
          if (proc.gone) throw new Error('the process is gone')
          unsettled.delete(i)
          if (verdict === 'retry' || verdict === 'return') back.add(i)
          else if (verdict === 'dead') dead.push(m.id)
        },
        m.redelivered,
      )
    }
    // Effects take microtask turns only: a round that does not end within a second has stalled.
    let timer: NodeJS.Timeout | undefined
    const stalled = new Promise<'stalled'>((resolve) => {
      timer = setTimeout(() => resolve('stalled'), 1_000)
    })
    const ended = await Promise.race([dispatcher.idle(), proc.crashed, stalled])
    clearTimeout(timer)
    if (ended === 'stalled') {
      violations.push(`round ${round} stalled with ${unsettled.size} message(s) unsettled`)
      break
    }
    queue = delivered.filter((_, i) => back.has(i) || unsettled.has(i)).map((m) => ({ id: m.id, redelivered: true }))
  }
  return { ids, specOf, applied, ran, dead, recorded, forgetsLost, violations, processes, left: queue.map((m) => m.id) }
}

describe('consumer dispatcher, random workloads with crashes', () => {
  it('keeps order, concurrency, isolation and give-up rules whatever the schedule', async () => {
    await fc.assert(
      fc.asyncProperty(workload, async (w) => {
        const r = await simulate(w)
        expect(r.violations).toEqual([])
        // Every message settled for good: applied once or given up on, never both.
        expect(r.left).toEqual([])
        expect(new Set(r.applied).size).toBe(r.applied.length)
        for (const id of r.ids) {
          const kind = (r.specOf.get(id) as Spec).kind
          const isApplied = r.applied.includes(id)
          const isDead = r.dead.includes(id)
          expect(isApplied && isDead).toBe(false)
          if (kind === 'ok') expect(isApplied).toBe(true)
          if (kind === 'bad' || kind === 'poison') expect(isApplied).toBe(false)
          if (kind === 'bad') expect(isDead).toBe(w.maxAttempts !== undefined)
          if (kind === 'poison') {
            expect(isDead).toBe(true)
            expect(r.ran.get(id)).toBeLessThanOrEqual((w.maxAttempts as number) + 1)
          }
        }
        // A key's messages applied in their order.
        for (const key of [0, 1, 2]) {
          const mine = r.applied.filter((id) => id.startsWith(`k${key}-`))
          expect(mine).toEqual(r.ids.filter((id) => mine.includes(id)))
        }
        // Nothing is left counted when redeliveries are isolated: each message settled for good forgets
        // its attempts, but for one whose process died between settling it and forgetting (left to
        // purge(), as is a message applied after failing in another process when they are not isolated).
        if (counts(w)) expect([...r.recorded.keys()].filter((id) => !r.forgetsLost.has(id))).toEqual([])
      }),
      { numRuns: 1_000 },
    )
  })
})
