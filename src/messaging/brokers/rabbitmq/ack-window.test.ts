import type { ConsumeMessage } from 'amqplib'
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { AckWindow } from './ack-window.js'

/** What a channel was told, in order: `ack 7+` is a multiple ack up to tag 7. */
function recorder() {
  const calls: string[] = []
  const channel = {
    ack(msg: ConsumeMessage, allUpTo?: boolean) {
      calls.push(`ack ${msg.fields.deliveryTag}${allUpTo ? '+' : ''}`)
    },
    nack(msg: ConsumeMessage, allUpTo?: boolean, requeue?: boolean) {
      calls.push(`${requeue ? 'requeue' : 'reject'} ${msg.fields.deliveryTag}${allUpTo ? '+' : ''}`)
    },
  }
  return { calls, channel }
}

const message = (tag: number) => ({ fields: { deliveryTag: tag } }) as ConsumeMessage

describe('AckWindow', () => {
  it('acks a run of messages settled in any order with one multiple ack, once the first of them is done', () => {
    const { calls, channel } = recorder()
    const acks = new AckWindow(channel)
    const [a, b, c] = [1, 2, 3].map((tag) => acks.delivered(message(tag))) as [never, never, never]
    acks.ack(c)
    acks.ack(b)
    acks.flush()
    expect(calls).toEqual([]) // tag 1 still running: a multiple ack would cover it
    acks.ack(a)
    acks.flush()
    expect(calls).toEqual(['ack 3+'])
    expect(acks.unsettled).toBe(0)
  })

  it('flushes by itself on the next turn of the event loop', async () => {
    const { calls, channel } = recorder()
    const acks = new AckWindow(channel)
    acks.ack(acks.delivered(message(1)))
    acks.ack(acks.delivered(message(2)))
    expect(calls).toEqual([])
    await new Promise((resolve) => setImmediate(resolve))
    expect(calls).toEqual(['ack 2+'])
  })

  it('never lets a multiple ack cover a message waiting to be requeued: the acks behind it go one by one', () => {
    const { calls, channel } = recorder()
    const acks = new AckWindow(channel)
    const [a, b, c, d] = [1, 2, 3, 4].map((tag) => acks.delivered(message(tag))) as [never, never, never, never]
    acks.ack(a)
    acks.holdForRequeue(b)
    acks.ack(c)
    acks.ack(d)
    acks.flush()
    expect(calls).toEqual(['ack 1+', 'ack 3', 'ack 4'])
    acks.requeue(b)
    expect(calls).toEqual(['ack 1+', 'ack 3', 'ack 4', 'requeue 2'])
    expect(acks.unsettled).toBe(0)
  })

  it('sends the acks gathered in front of a reject before the reject itself', () => {
    const { calls, channel } = recorder()
    const acks = new AckWindow(channel)
    const [a, b] = [1, 2].map((tag) => acks.delivered(message(tag))) as [never, never]
    acks.ack(a)
    acks.reject(b)
    expect(calls).toEqual(['ack 1+', 'reject 2'])
  })

  it('settles every message exactly once, and no multiple ack covers a message not acked, whatever the order', () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom('ack', 'reject', 'requeue'), { minLength: 1, maxLength: 40 }),
        fc.array(fc.nat(), { minLength: 1, maxLength: 80 }),
        (verdicts, picks) => {
          const { calls, channel } = recorder()
          const acks = new AckWindow(channel)
          const entries = verdicts.map((_, i) => acks.delivered(message(i + 1)))
          // Settle in an order the picks choose, flushing at random points.
          const open = entries.map((_, i) => i)
          const held: number[] = []
          let p = 0
          while (open.length > 0 || held.length > 0) {
            const pick = picks[p++ % picks.length] as number
            if (held.length > 0 && (open.length === 0 || pick % 3 === 0)) {
              acks.requeue(entries[held.shift() as number] as never)
            } else {
              const i = open.splice(pick % open.length, 1)[0] as number
              const verdict = verdicts[i]
              if (verdict === 'ack') acks.ack(entries[i] as never)
              else if (verdict === 'reject') acks.reject(entries[i] as never)
              else {
                acks.holdForRequeue(entries[i] as never)
                held.push(i)
              }
            }
            if (pick % 2 === 0) acks.flush()
          }
          acks.flush()
          // Replay the calls as the broker would: each tag settled once, as its verdict says.
          const settled = new Map<number, string>()
          for (const call of calls) {
            const [kind, tagText] = call.split(' ') as [string, string]
            const tag = Number.parseInt(tagText, 10)
            const covered = tagText.endsWith('+') ? verdicts.map((_, i) => i + 1).filter((t) => t <= tag && !settled.has(t)) : [tag]
            for (const t of covered) {
              expect(settled.has(t)).toBe(false)
              settled.set(t, kind)
            }
          }
          expect(settled.size).toBe(verdicts.length)
          for (const [i, verdict] of verdicts.entries()) expect(settled.get(i + 1)).toBe(verdict)
        },
      ),
      { numRuns: 500 },
    )
  })
})
