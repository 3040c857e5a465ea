import { IdempotencyError, isIdempotencyError } from '../errors.js'
import { ManualClock } from './clock.js'
import { formatDuration, parseDuration } from './duration.js'
import { canonicalJson, fingerprintOf } from './fingerprint.js'
import { classifyStatus } from './outcome.js'

describe('parseDuration', () => {
  it('reads milliseconds and human strings into integer milliseconds', () => {
    expect(parseDuration(1500)).toBe(1500)
    expect(parseDuration('250ms')).toBe(250)
    expect(parseDuration('30s')).toBe(30_000)
    expect(parseDuration('5m')).toBe(300_000)
    expect(parseDuration('24h')).toBe(86_400_000)
    expect(parseDuration('7d')).toBe(604_800_000)
    expect(parseDuration('1h30m')).toBe(5_400_000)
    expect(parseDuration('1.5s')).toBe(1_500)
    expect(parseDuration('100')).toBe(100)
  })

  it('rejects what is not a duration with INVALID_OPTION and an example', () => {
    for (const bad of ['', 'soon', '10 s', '5x', '-1s', -5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => parseDuration(bad as string, 'lease')).toThrow(IdempotencyError)
    }
    expect(() => parseDuration('soon', 'lease')).toThrow(/lease "soon" is not a duration.*"30s"/)
  })

  it('formats durations for people', () => {
    expect(formatDuration(250)).toBe('250ms')
    expect(formatDuration(1_500)).toBe('1.5s')
    expect(formatDuration(5_400_000)).toBe('1h30m')
  })
})

describe('canonicalJson (RFC 8785)', () => {
  it('sorts keys, drops whitespace and normalizes numbers', () => {
    expect(canonicalJson({ b: 1, a: [true, null, 'x'], c: { z: 1e21, y: 0.1, x: -0 } })).toBe(
      '{"a":[true,null,"x"],"b":1,"c":{"x":0,"y":0.1,"z":1e+21}}',
    )
    expect(canonicalJson(JSON.parse('{"n": 1.0, "m": 100e-2}'))).toBe('{"m":1,"n":1}')
  })

  it('sorts keys by UTF-16 code units, as RFC 8785 says', () => {
    expect(canonicalJson({ '\u20ac': 1, '\r': 2, '\ud83d\ude00': 3, '1': 4, a: 5 })).toBe('{"\\r":2,"1":4,"a":5,"€":1,"😀":3}')
  })

  it('gives the same fingerprint to the same JSON with keys in another order', () => {
    expect(fingerprintOf({ amount: 100, currency: 'eur' })).toBe(fingerprintOf({ currency: 'eur', amount: 100 }))
    expect(fingerprintOf({ amount: 100 })).not.toBe(fingerprintOf({ amount: 101 }))
    expect(fingerprintOf({ amount: 100 })).toMatch(/^[0-9a-f]{64}$/)
  })

  it('rejects numbers JSON cannot hold', () => {
    expect(() => canonicalJson({ x: Number.NaN })).toThrow(/NaN/)
  })
})

describe('classifyStatus (SPEC §4)', () => {
  it('stores successes and final failures, releases transient ones', () => {
    expect([200, 201, 204, 301, 304].map(classifyStatus)).toEqual(Array(5).fill('completed'))
    expect([400, 403, 404, 410, 422].map(classifyStatus)).toEqual(Array(5).fill('failed'))
    expect([401, 408, 409, 425, 429, 500, 502, 503, 504, 100].map(classifyStatus)).toEqual(Array(10).fill('transient'))
  })
})

describe('errors', () => {
  it('recognizes an idemkey error from another copy of the package by name and code', () => {
    const foreign = Object.assign(new Error('x'), { name: 'IdempotencyError', code: 'KEY_INVALID' })
    expect(isIdempotencyError(foreign)).toBe(true)
    expect(isIdempotencyError(new Error('x'))).toBe(false)
    expect(new IdempotencyError('FINGERPRINT_MISMATCH', 'm').httpStatus).toBe(422)
  })
})

describe('ManualClock', () => {
  it('wakes sleepers only when time passes their deadline', async () => {
    const clock = new ManualClock(0)
    let woke = false
    const sleeping = clock.sleep(100).then(() => {
      woke = true
    })
    clock.advance(99)
    await Promise.resolve()
    expect(woke).toBe(false)
    clock.advance(1)
    await sleeping
    expect(woke).toBe(true)
  })
})
