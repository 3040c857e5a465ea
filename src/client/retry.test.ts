import fc from 'fast-check'
import { abortableSleep, backoffMs, isRetryableStatus, retryAfterMs } from './retry.js'

describe('isRetryableStatus', () => {
  it('retries every 5xx and 408, 409, 425, 429, and never another 4xx such as 422', () => {
    for (let status = 200; status < 600; status++) {
      const expected = status >= 500 || [408, 409, 425, 429].includes(status)
      expect([status, isRetryableStatus(status)]).toEqual([status, expected])
    }
  })
})

describe('backoffMs', () => {
  it('waits a random time below a cap that doubles per attempt up to the maximum (full jitter)', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 40 }),
        fc.integer({ min: 1, max: 5_000 }),
        fc.integer({ min: 1, max: 60_000 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (attempt, base, max, r) => {
          const delay = backoffMs(attempt, base, max, () => r)
          const cap = Math.min(max, base * 2 ** (attempt - 1))
          expect(delay).toBeGreaterThanOrEqual(0)
          expect(delay).toBeLessThan(cap)
          expect(delay).toBe(Math.floor(r * cap))
        },
      ),
    )
    expect([1, 2, 3, 4, 5].map((attempt) => backoffMs(attempt, 100, 1_000, () => 0.999))).toEqual([99, 199, 399, 799, 999])
  })
})

describe('retryAfterMs', () => {
  it('reads delay-seconds', () => {
    expect(retryAfterMs('0', 0)).toBe(0)
    expect(retryAfterMs(' 120 ', 0)).toBe(120_000)
  })

  it('reads an HTTP date against the given clock, and a past date as 0', () => {
    const now = Date.parse('Wed, 21 Oct 2015 07:28:00 GMT')
    expect(retryAfterMs('Wed, 21 Oct 2015 07:28:10 GMT', now)).toBe(10_000)
    expect(retryAfterMs('Wed, 21 Oct 2015 07:27:00 GMT', now)).toBe(0)
  })

  it('ignores an absent or unreadable value', () => {
    expect(retryAfterMs(null, 0)).toBeUndefined()
    expect(retryAfterMs(undefined, 0)).toBeUndefined()
    for (const junk of ['soon', '', '-1', '1.5', 'NaN']) expect(retryAfterMs(junk, 0)).toBeUndefined()
  })
})

describe('abortableSleep', () => {
  it('rejects with the signal reason when aborted, before or during the wait', async () => {
    const before = new AbortController()
    before.abort(new Error('before'))
    await expect(abortableSleep(10, before.signal)).rejects.toThrow('before')
    const during = new AbortController()
    const pending = abortableSleep(60_000, during.signal)
    during.abort(new Error('during'))
    await expect(pending).rejects.toThrow('during')
    await expect(abortableSleep(1)).resolves.toBeUndefined()
  })
})
