import fc from 'fast-check'
import { createUuidv7Generator, uuidv7 } from './uuid.js'

const LAYOUT = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

function timestampOf(id: string): number {
  return Number.parseInt(id.replaceAll('-', '').slice(0, 12), 16)
}

describe('uuidv7', () => {
  it('lays out 48 bits of Unix milliseconds, version 7 and the RFC 9562 variant', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 48 - 1 }), (ms) => {
        const id = createUuidv7Generator()(ms)
        expect(id).toMatch(LAYOUT)
        expect(timestampOf(id)).toBe(ms)
      }),
    )
    expect(createUuidv7Generator()(1_700_000_000_000).slice(0, 13)).toBe('018bcfe5-6800')
  })

  it('sorts by creation time across milliseconds', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 47 }), fc.integer({ min: 1, max: 2 ** 40 }), (a, gap) => {
        const next = createUuidv7Generator()
        expect(next(a) < next(a + gap)).toBe(true)
      }),
    )
  })

  it('keeps strict order and uniqueness for a burst within one millisecond, moving the timestamp on when the counter overflows', () => {
    const next = createUuidv7Generator()
    const ids = Array.from({ length: 10_000 }, () => next(1_700_000_000_000))
    expect([...ids].sort()).toEqual(ids)
    expect(new Set(ids).size).toBe(ids.length)
    expect(timestampOf(ids[0] as string)).toBe(1_700_000_000_000)
    expect(timestampOf(ids.at(-1) as string)).toBeGreaterThan(1_700_000_000_000) // 10,000 > 4,096 counter values
  })

  it('keeps the order through a small clock step back, and restarts from the clock after a large one', () => {
    const next = createUuidv7Generator()
    const a = next(1_700_000_000_500)
    const b = next(1_700_000_000_100)
    expect(a < b).toBe(true)
    expect(timestampOf(next(1_600_000_000_000))).toBe(1_600_000_000_000)
  })

  it('makes a fresh key at every call of the shared generator', () => {
    const ids = new Set(Array.from({ length: 1_000 }, () => uuidv7()))
    expect(ids.size).toBe(1_000)
    for (const id of ids) expect(id).toMatch(LAYOUT)
  })

  it('refuses a time it cannot encode', () => {
    expect(() => uuidv7(-1)).toThrow(RangeError)
    expect(() => uuidv7(2 ** 48)).toThrow(/2\^48/)
  })
})
