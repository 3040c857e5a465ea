/**
 * The consumer helpers' engine and `maxAttempts`, with a broker simulated in memory (the helpers are
 * tested against the real brokers in test/messaging-consumers.test.ts): which failures count, what
 * happens to the messages behind a message given up on, and what is never given up on.
 */
import { describe, expect, it } from 'vitest'
import { createDispatcher, type Verdict } from './dispatcher.js'
import type { Inbox, InboxMessage } from './inbox/types.js'

/**
 * A queue that redelivers what is not acked (at its tail) until it is acked, rejected or dead-lettered.
 * With `gate`, each round first delivers a message of its own key that holds its worker until the whole
 * round is delivered: with `concurrency: 1` the round's messages of one key then wait in hand together
 * and go to the inbox as one batch, as a prefetch of many messages does while the workers are busy.
 */
function broker(
  messages: Array<{ id: string; key: string }>,
  inbox: Inbox<unknown>,
  options: { maxAttempts?: number; batchSize?: number; concurrency?: number; gate?: boolean; failedMoves?: number },
) {
  // The first `failedMoves` dead-letterings fail (the broker keeps the message and delivers it again).
  let failedMoves = options.failedMoves ?? 0
  const queue = messages.map((m) => ({ id: m.id, payload: m.key, topic: 't', headers: { key: m.key } }) as InboxMessage)
  const dead: string[] = []
  const reported: Array<{ code?: string; id: string }> = []
  const delivered = new Map<string, number>()
  let open: () => void = () => {}
  const gated: Inbox<unknown> = {
    ...inbox,
    async handle(message, effect) {
      if (!message.id.startsWith('gate-')) return inbox.handle(message, effect)
      await new Promise<void>((resolve) => {
        open = resolve
      })
      return { type: 'applied', consumer: 'c', messageId: message.id } as never
    },
  }
  const dispatcher = createDispatcher({
    inbox: options.gate ? gated : inbox,
    handler: () => {},
    concurrency: 2,
    failureHoldMs: 60_000,
    onError: (error, message) => reported.push({ code: (error as { code?: string }).code, id: message.id }),
    ...options,
  })
  const deliver = (message: InboxMessage) => {
    delivered.set(message.id, (delivered.get(message.id) ?? 0) + 1)
    dispatcher.push(message.headers?.key ?? null, message, (verdict: Verdict) => {
      if (verdict === 'retry' || verdict === 'return') queue.push(message)
      else if (verdict === 'dead' && failedMoves > 0) {
        failedMoves--
        queue.push(message)
        throw new Error('injected: the dead-letter move failed')
      } else if (verdict === 'dead') dead.push(message.id)
    })
  }
  const run = async (rounds: number) => {
    for (let round = 0; round < rounds && queue.length > 0; round++) {
      if (options.gate) deliver({ id: `gate-${round}`, payload: '', topic: 't', headers: { key: 'gate' } })
      for (const message of queue.splice(0)) deliver(message)
      open()
      await dispatcher.idle()
    }
  }
  return { run, dead, reported, delivered, queue }
}

/** An inbox whose effect fails for the IDs in `failing`, recording the order of what it applied. */
function inboxOf(failing: Set<string>, withBatch: boolean) {
  const applied: string[] = []
  const tried = new Map<string, number>()
  const apply = (message: InboxMessage) => {
    tried.set(message.id, (tried.get(message.id) ?? 0) + 1)
    if (failing.has(message.id)) throw new Error(`injected: ${message.id} always fails`)
  }
  const inbox: Inbox<unknown> = {
    consumer: 'c',
    async handle(message, effect) {
      apply(message)
      await effect(undefined, message)
      applied.push(message.id)
      return { type: 'applied', consumer: 'c', messageId: message.id } as never
    },
    ...(withBatch
      ? {
          async handleBatch(messages: InboxMessage[]) {
            // All or nothing, as a transaction: a failure throws before anything counts as applied.
            for (const message of messages) apply(message)
            applied.push(...messages.map((m) => m.id))
            return messages.map((m) => ({ status: 'applied', consumer: 'c', messageId: m.id })) as never
          },
        }
      : {}),
  }
  return { inbox, applied, tried }
}

describe('consumer maxAttempts', () => {
  for (const withBatch of [false, true]) {
    it(`counts only the attempts that ran: the messages returned unapplied behind a failing one are never given up on (${withBatch ? 'batches' : 'one at a time'})`, async () => {
      // More messages of key a than a batch holds: some wait behind the batch that holds a1.
      const messages = ['a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'b1', 'b2'].map((id) => ({ id, key: id[0] as string }))
      const { inbox, applied, tried } = inboxOf(new Set(['a1', 'a2']), withBatch)
      const sim = broker(messages, inbox, { maxAttempts: 3, batchSize: withBatch ? 4 : 1, concurrency: withBatch ? 1 : 2, gate: withBatch })
      await sim.run(30)
      expect(sim.dead).toEqual(['a1', 'a2'])
      expect(sim.reported.filter((r) => r.code === 'RETRIES_EXHAUSTED').map((r) => r.id)).toEqual(['a1', 'a2'])
      // a2 went back unapplied behind a1 before it ever ran: those deliveries were not its attempts.
      // Three deliveries that ran each; in batches each ran twice (in the failing batch, then alone).
      expect(tried.get('a1')).toBe(withBatch ? 6 : 3)
      expect(tried.get('a2')).toBe(withBatch ? 6 : 3)
      // The rest went back with them each time (more deliveries than maxAttempts), and are applied in order.
      expect(applied.filter((id) => id.startsWith('a'))).toEqual(['a3', 'a4', 'a5', 'a6'])
      expect(applied.filter((id) => id.startsWith('b'))).toEqual(['b1', 'b2'])
      expect(sim.delivered.get('a3')).toBeGreaterThan(3)
      expect(sim.queue).toEqual([])
    })
  }

  it('gives up on the failure that reaches maxAttempts, and a message that succeeds in time is applied', async () => {
    const failing = new Set(['x'])
    const { inbox, applied, tried } = inboxOf(failing, false)
    const flaky: Inbox<unknown> = {
      ...inbox,
      async handle(message, effect) {
        if (message.id === 'y' && (tried.get('y') ?? 0) >= 2) failing.delete('y')
        else if (message.id === 'y') failing.add('y')
        return inbox.handle(message, effect)
      },
    }
    const sim = broker(
      [
        { id: 'x', key: 'x' },
        { id: 'y', key: 'y' },
      ],
      flaky,
      { maxAttempts: 3 },
    )
    await sim.run(10)
    expect(tried.get('x')).toBe(3)
    expect(sim.dead).toEqual(['x'])
    expect(tried.get('y')).toBe(3)
    expect(applied).toEqual(['y'])
  })

  it('a message whose dead-lettering failed comes back given up on: its next failure dead-letters it, the count does not start over', async () => {
    const { inbox, tried } = inboxOf(new Set(['x']), false)
    const sim = broker([{ id: 'x', key: 'x' }], inbox, { maxAttempts: 3, failedMoves: 2 })
    await sim.run(20)
    expect(sim.dead).toEqual(['x'])
    // Three failures to give it up, then one per failed move: not three more each time.
    expect(tried.get('x')).toBe(3 + 2)
    expect(sim.reported.filter((r) => r.code === 'RETRIES_EXHAUSTED')).toHaveLength(3)
  })

  /** `inbox` with its failed attempts recorded in `recorded`, as a database shared by the consumer's processes. */
  const recording = (inbox: Inbox<unknown>, recorded: Map<string, number>, broken = false): Inbox<unknown> => ({
    ...inbox,
    async recordFailure(message) {
      if (broken) throw new Error('injected: the failures table is not there')
      const failed = (recorded.get(message.id) ?? 0) + 1
      recorded.set(message.id, failed)
      return failed
    },
    async forgetFailures(messageId) {
      recorded.delete(messageId)
    },
  })

  it("counts with the inbox's recorded failures: a restarted process (or another one) goes on from them, and a message given up on is forgotten", async () => {
    const { inbox, tried } = inboxOf(new Set(['x']), false)
    const recorded = new Map<string, number>()
    // The first process fails x twice, then stops (its count in memory goes with it).
    await broker([{ id: 'x', key: 'x' }], recording(inbox, recorded), { maxAttempts: 3 }).run(2)
    expect(tried.get('x')).toBe(2)
    expect(recorded.get('x')).toBe(2)
    // The broker delivers x to the next process: its first failure is the third.
    const next = broker([{ id: 'x', key: 'x' }], recording(inbox, recorded), { maxAttempts: 3 })
    await next.run(10)
    expect(tried.get('x')).toBe(3)
    expect(next.dead).toEqual(['x'])
    expect(next.reported.filter((r) => r.code === 'RETRIES_EXHAUSTED')).toHaveLength(1)
    // Moved back after a fix, it starts afresh.
    expect(recorded.has('x')).toBe(false)
  })

  it("forgets a message's recorded failures once it is applied after failing", async () => {
    const failing = new Set(['y'])
    const { inbox } = inboxOf(failing, false)
    const recorded = new Map<string, number>()
    const counting = recording(inbox, recorded)
    // y fails once; the next delivery applies it.
    const healing: Inbox<unknown> = {
      ...counting,
      async recordFailure(message) {
        failing.delete(message.id)
        return (counting.recordFailure as (message: InboxMessage) => Promise<number>)(message)
      },
    }
    const sim = broker([{ id: 'y', key: 'y' }], healing, { maxAttempts: 3 })
    await sim.run(2)
    expect(sim.queue).toEqual([])
    expect(recorded.has('y')).toBe(false)
  })

  it('counts in the process when the inbox cannot record a failure, and reports why', async () => {
    const { inbox, tried } = inboxOf(new Set(['x']), false)
    const sim = broker([{ id: 'x', key: 'x' }], recording(inbox, new Map(), true), { maxAttempts: 3 })
    await sim.run(10)
    expect(tried.get('x')).toBe(3)
    expect(sim.dead).toEqual(['x'])
    // Each failed attempt reports its effect's error, then why it could not be recorded.
    expect(sim.reported.filter((r) => r.code === undefined)).toHaveLength(6)
  })

  it('a message given up on before it runs (delivered too often) is dead-lettered and reported, and ends the hold on its key', async () => {
    const { inbox, applied } = inboxOf(new Set(['a1']), false)
    const reported: string[] = []
    const settled: Array<[string, Verdict]> = []
    const dispatcher = createDispatcher({
      inbox,
      handler: () => {},
      failureHoldMs: 60_000,
      onError: (error, message) => reported.push(`${message.id}: ${(error as { code?: string }).code}`),
    })
    const message = (id: string): InboxMessage => ({ id, payload: 'a', topic: 't', headers: { key: 'a' } })
    const give = (id: string) => dispatcher.push('a', message(id), (verdict: Verdict) => void settled.push([id, verdict]))
    give('a1')
    await dispatcher.idle()
    // a1 failed: key a is held until a1 comes back, so a2 goes back unapplied.
    give('a2')
    await dispatcher.idle()
    expect(settled).toEqual([
      ['a1', 'retry'],
      ['a2', 'return'],
    ])
    dispatcher.giveUp('a', message('a1'), (verdict: Verdict) => void settled.push(['a1', verdict]), 'was delivered 9 times')
    give('a2')
    await dispatcher.idle()
    expect(settled.slice(2)).toEqual([
      ['a1', 'dead'],
      ['a2', 'ack'],
    ])
    expect(applied).toEqual(['a2'])
    expect(reported).toEqual(['a1: undefined', 'a1: RETRIES_EXHAUSTED'])
  })

  /**
   * Consumer processes one after another on a queue that redelivers, as RabbitMQ does, every unsettled
   * message of a process that died, marked redelivered. `poison`'s effect kills the process: its
   * handle never returns, and the next process takes over. Runs until the queue is empty or `processes`.
   */
  async function crashLoop(poison: string, ids: string[], recorded: Map<string, number>, processes: number, concurrency = 4) {
    const applied: string[] = []
    const ran = new Map<string, number>()
    const dead: string[] = []
    const reported: string[] = []
    /** How many effects were running each time the poison started. */
    const besidePoison: number[] = []
    let queue = ids.map((id) => ({ id, redelivered: false }))
    let started = 0
    for (; started < processes && queue.length > 0; started++) {
      let running = 0
      let gone = false
      let crash: () => void = () => {}
      const crashed = new Promise<void>((resolve) => {
        crash = () => {
          gone = true
          resolve()
        }
      })
      // A dead process runs nothing more: what it was running never commits.
      const frozen = () => new Promise<never>(() => {})
      const inbox: Inbox<unknown> = {
        consumer: 'c',
        async handle(message, effect) {
          if (gone) return frozen()
          // The inbox's own check: an ID applied before (its ack lost with the process) is a duplicate.
          if (applied.includes(message.id)) return { type: 'duplicate', consumer: 'c', messageId: message.id } as never
          ran.set(message.id, (ran.get(message.id) ?? 0) + 1)
          running++
          if (message.id === poison) {
            besidePoison.push(running - 1)
            crash()
            return frozen()
          }
          await new Promise((resolve) => setTimeout(resolve, 1))
          if (gone) return frozen()
          await effect(undefined, message)
          running--
          applied.push(message.id)
          return { type: 'applied', consumer: 'c', messageId: message.id } as never
        },
      }
      const dispatcher = createDispatcher({
        inbox: recording(inbox, recorded),
        handler: () => {},
        concurrency,
        batchSize: 1,
        maxAttempts: 3,
        onError: (error, message) => reported.push(`${message.id}: ${(error as { code?: string }).code}`),
      })
      const unsettled = new Set(queue.map((m) => m.id))
      for (const message of queue) {
        dispatcher.push(
          null,
          { id: message.id, payload: '', topic: 't' },
          (verdict: Verdict) => {
            unsettled.delete(message.id)
            if (verdict === 'dead') dead.push(message.id)
            else if (verdict !== 'ack') throw new Error(`unexpected verdict ${verdict}`)
          },
          message.redelivered,
        )
      }
      await Promise.race([dispatcher.idle(), crashed])
      // The process is gone: what it had not settled comes back, redelivered, in queue order.
      queue = queue.filter((m) => unsettled.has(m.id)).map((m) => ({ id: m.id, redelivered: true }))
    }
    return { applied, ran, dead, reported, besidePoison, processes: started, left: queue.map((m) => m.id) }
  }

  it('gives up on a message whose effect kills the process, after maxAttempts + 1 runs: a redelivered message is counted before it runs, and runs alone', async () => {
    const ids = Array.from({ length: 12 }, (_, i) => `m${i}`)
    const recorded = new Map<string, number>()
    const loop = await crashLoop('m5', ids, recorded, 10)
    expect(loop.left).toEqual([])
    expect(loop.dead).toEqual(['m5'])
    // The first run (not redelivered) is not counted; three counted runs, then the fourth delivery is over maxAttempts.
    expect(loop.ran.get('m5')).toBe(4)
    expect(loop.processes).toBe(5)
    expect(loop.reported).toEqual(['m5: RETRIES_EXHAUSTED'])
    // Every other message applied exactly once, none blamed for the crashes: those cut short beside the
    // poison's first run ran once more, the rest once.
    expect([...loop.applied].sort()).toEqual(ids.filter((id) => id !== 'm5').sort())
    const innocents = ids.filter((id) => id !== 'm5').map((id) => loop.ran.get(id) as number)
    expect(innocents.every((runs) => runs === 1 || runs === 2)).toBe(true)
    expect(innocents.filter((runs) => runs === 2)).toHaveLength(loop.besidePoison[0] as number)
    // Redelivered, it ran with nothing beside it; first delivered, among others.
    expect(loop.besidePoison.slice(1)).toEqual([0, 0, 0])
    expect(loop.besidePoison[0]).toBeGreaterThan(0)
    // Applied or given up on, nothing is left recorded.
    expect(recorded.size).toBe(0)
  })

  it('a redelivered message that succeeds forgets the attempt recorded before it ran, and one that fails is not counted twice', async () => {
    const failing = new Set(['x'])
    const { inbox, tried } = inboxOf(failing, false)
    const recorded = new Map<string, number>()
    const dispatcher = createDispatcher({ inbox: recording(inbox, recorded), handler: () => {}, maxAttempts: 3 })
    const verdicts: Verdict[] = []
    const give = (redelivered: boolean) =>
      dispatcher.push('x', { id: 'x', payload: '', topic: 't' }, (verdict: Verdict) => void verdicts.push(verdict), redelivered)
    give(false)
    await dispatcher.idle()
    give(true)
    await dispatcher.idle()
    // Two runs, two failures, two attempts recorded: the second counted before it ran, not again after.
    expect(verdicts).toEqual(['retry', 'retry'])
    expect(recorded.get('x')).toBe(2)
    failing.delete('x')
    give(true)
    await dispatcher.idle()
    expect(verdicts).toEqual(['retry', 'retry', 'ack'])
    expect(tried.get('x')).toBe(3)
    expect(recorded.has('x')).toBe(false)
  })

  it("a redelivered message waiting behind a new one of its key does not join that one's batch: it runs after it, alone", async () => {
    const batches: string[][] = []
    let running = 0
    const beside: string[] = []
    const inbox: Inbox<unknown> = {
      consumer: 'c',
      async handle(message) {
        batches.push([message.id])
        running++
        if (message.id === 'y' && running > 1) beside.push('y')
        await new Promise((resolve) => setTimeout(resolve, 2))
        running--
        return { type: 'applied', consumer: 'c', messageId: message.id } as never
      },
      async handleBatch(messages: readonly InboxMessage[]) {
        batches.push(messages.map((m) => m.id))
        running++
        await new Promise((resolve) => setTimeout(resolve, 2))
        running--
        return messages.map((m) => ({ status: 'applied', consumer: 'c', messageId: m.id })) as never
      },
      recordFailure: async () => 1,
      forgetFailures: async () => {},
    }
    const dispatcher = createDispatcher({ inbox, handler: () => {}, concurrency: 1, batchSize: 4, maxAttempts: 3 })
    const give = (id: string, key: string, redelivered = false) =>
      dispatcher.push(key, { id, payload: '', topic: 't' }, () => {}, redelivered)
    // While g holds the only worker: x (new) of key k, then y (delivered again: another consumer died
    // running it) of the same key, then z; they wait together, as a batch would take them.
    give('g', 'gate')
    give('x', 'k')
    give('y', 'k', true)
    give('z', 'k')
    give('w', 'other')
    await dispatcher.idle()
    expect(batches.find((batch) => batch.includes('x'))).not.toContain('y')
    expect(batches).toContainEqual(['y'])
    expect(beside).toEqual([])
    // The key's order holds: x, then y, then z.
    const order = batches.flat().filter((id) => id !== 'w' && id !== 'g')
    expect(order).toEqual(['x', 'y', 'z'])
  })

  it('a redelivered message runs the same as any other without maxAttempts or without an inbox that records failures', async () => {
    for (const options of [
      { recordsFailures: true, maxAttempts: undefined },
      { recordsFailures: false, maxAttempts: 3 },
    ]) {
      let running = 0
      let most = 0
      const inbox: Inbox<unknown> = {
        consumer: 'c',
        async handle(message) {
          running++
          most = Math.max(most, running)
          await new Promise((resolve) => setTimeout(resolve, 5))
          running--
          return { type: 'applied', consumer: 'c', messageId: message.id } as never
        },
      }
      const recorded = new Map<string, number>()
      const dispatcher = createDispatcher({
        inbox: options.recordsFailures ? recording(inbox, recorded) : inbox,
        handler: () => {},
        concurrency: 4,
        batchSize: 1,
        maxAttempts: options.maxAttempts,
      })
      for (let i = 0; i < 4; i++) dispatcher.push(null, { id: `r${i}`, payload: '', topic: 't' }, () => {}, true)
      await dispatcher.idle()
      expect(most).toBe(4)
      expect(recorded.size).toBe(0)
    }
  })

  it('without maxAttempts retries for ever, as before', async () => {
    const { inbox, tried } = inboxOf(new Set(['x']), false)
    const sim = broker([{ id: 'x', key: 'x' }], inbox, {})
    await sim.run(12)
    expect(tried.get('x')).toBe(12)
    expect(sim.dead).toEqual([])
    expect(sim.queue.map((m) => m.id)).toEqual(['x'])
  })

  it('refuses a maxAttempts that is not a positive integer', () => {
    const inbox = { consumer: 'c' } as Inbox<unknown>
    for (const bad of [0, 1.5, -1, Number.NaN]) {
      expect(() => createDispatcher({ inbox, handler: () => {}, maxAttempts: bad })).toThrow('maxAttempts must be a positive integer')
    }
  })
})
