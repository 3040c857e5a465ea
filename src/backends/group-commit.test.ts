import { describe, expect, it } from 'vitest'
import { type BatchKind, GroupCommit } from './group-commit.js'

/** A kind whose single and batch paths answer `input * 10`, and record what they were sent. */
function kind(overrides: Partial<BatchKind<number, number>> = {}) {
  const sent: Array<number | number[]> = []
  const base: BatchKind<number, number> = {
    one: (input) => {
      sent.push(input)
      return new Promise((resolve) => setTimeout(() => resolve(input * 10), 5))
    },
    many: async (inputs) => {
      sent.push([...inputs])
      return inputs.map((input) => ({ value: input * 10 }))
    },
    identity: (input) => String(input),
    distinct: false,
    gaveUp: () => new Error('gave up'),
    alone: () => false,
  }
  return { kind: { ...base, ...overrides }, sent }
}

describe('GroupCommit', () => {
  it('sends a lone caller at once, and the callers that came while it was in flight as one batch', async () => {
    const { kind: k, sent } = kind()
    const group = new GroupCommit(k)
    expect(await Promise.all([1, 2, 3, 4].map((n) => group.run(n)))).toEqual([10, 20, 30, 40])
    expect(sent).toEqual([1, [2, 3, 4]])
  })

  it('stays usable when the single path throws instead of rejecting: that caller fails, later callers are answered', async () => {
    let throwing = true
    const { kind: k } = kind()
    const one = k.one
    const group = new GroupCommit<number, number>({
      ...k,
      one: (input) => {
        if (throwing) throw new Error('a driver that throws')
        return one(input)
      },
    })
    await expect(group.run(1)).rejects.toThrow('a driver that throws')
    throwing = false
    expect(await group.run(2)).toBe(20)
    await group.idle()
  })

  it('answers a lone queued caller whose single path throws, and goes on', async () => {
    const { kind: k } = kind()
    const one = k.one
    const group = new GroupCommit<number, number>({
      ...k,
      one: (input) => {
        if (input === 2) throw new Error('thrown for 2')
        return one(input)
      },
    })
    const first = group.run(1)
    const second = group.run(2) // queued behind 1, then sent alone
    expect(await first).toBe(10)
    await expect(second).rejects.toThrow('thrown for 2')
    expect(await group.run(3)).toBe(30)
  })
})
