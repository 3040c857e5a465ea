import { IdempotencyError, isIdempotencyError } from '../errors.js'
import { ManualClock } from './clock.js'
import { formatDuration, MAX_DURATION_MS, parseDuration, parseTimerDuration, runDurations } from './duration.js'
import { canonicalJson, fingerprintOf } from './fingerprint.js'
import { classifyStatus } from './outcome.js'
import { assertRecordStep, stepJson, stepsFromJson } from './steps-store.js'
import { type IdempotencyStore, isTransactionalStore } from './store.js'
import { assertFingerprint, assertKey, assertPositiveInteger, assertScope } from './validate.js'
import { Waiter } from './waiter.js'

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

  it('refuses a duration past 36500d (about 100 years), which no store can keep as an expiry, naming the option', () => {
    expect(parseDuration('36500d')).toBe(MAX_DURATION_MS)
    expect(parseDuration(MAX_DURATION_MS)).toBe(MAX_DURATION_MS)
    for (const long of [MAX_DURATION_MS + 1, 1e20, '36501d', '99999999999999999999', `${MAX_DURATION_MS + 1}`]) {
      expect(() => parseDuration(long, 'ttl')).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
      expect(() => parseDuration(long, 'ttl')).toThrow(/^ttl .* is longer than the longest duration idemkey keeps, 36500d/)
    }
  })

  it('parseTimerDuration refuses what one Node timer cannot keep (past 2^31 - 1 ms) and takes 0', () => {
    expect(parseTimerDuration(2 ** 31 - 1, 'queryTimeout')).toBe(2 ** 31 - 1)
    expect(parseTimerDuration(0, 'queryTimeout')).toBe(0)
    expect(() => parseTimerDuration('25d', 'queryTimeout')).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    expect(() => parseTimerDuration('25d', 'queryTimeout')).toThrow(/it would fire after 1 ms\. Give a shorter one\.$/)
  })

  it('runDurations reads lease, ttl and wait as the ledger takes them: lease and ttl longer than 0, wait from 0, only those given', () => {
    expect(runDurations({ lease: '30s', wait: 0 })).toEqual({ lease: 30_000, wait: 0 })
    expect(runDurations({})).toEqual({})
    expect(() => runDurations({ lease: 0 })).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: 'lease must be longer than 0, got 0ms.' }),
    )
    expect(() => runDurations({ ttl: '0s' })).toThrow('ttl must be longer than 0, got 0ms.')
    expect(() => runDurations({ wait: 'soon' })).toThrow('wait "soon" is not a duration')
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

describe('Waiter', () => {
  /** A store that only watches: `notify` plays the store's change notification. */
  function watchingStore() {
    const listeners = new Set<() => void>()
    const store = {
      watch: (_scope: string, _key: string, onChange: () => void) => {
        listeners.add(onChange)
        return () => listeners.delete(onChange)
      },
    } as unknown as IdempotencyStore
    return {
      store,
      listeners,
      notify: () => {
        for (const listener of [...listeners]) listener()
      },
    }
  }
  const settled = async (promise: Promise<unknown>) => {
    let done = false
    void promise.then(() => (done = true))
    for (let i = 0; i < 5; i++) await Promise.resolve()
    return done
  }

  it('returns at once when the record changed before it waits, and only once for that change', async () => {
    const clock = new ManualClock()
    const { store, notify } = watchingStore()
    const waiter = new Waiter(store, 's', 'k')
    notify()
    expect(await settled(waiter.wait(clock, 1_000))).toBe(true)
    // The change was used up: the next wait sleeps its full interval.
    const next = waiter.wait(clock, 1_000)
    expect(await settled(next)).toBe(false)
    clock.advance(1_000)
    expect(await settled(next)).toBe(true)
  })

  it('is woken by a notification while it sleeps, before its interval ends', async () => {
    const clock = new ManualClock()
    const { store, notify } = watchingStore()
    const waiter = new Waiter(store, 's', 'k')
    const sleeping = waiter.wait(clock, 60_000)
    expect(await settled(sleeping)).toBe(false)
    notify()
    expect(await settled(sleeping)).toBe(true)
    // The wake-up consumed the change: the next wait sleeps again.
    expect(await settled(waiter.wait(clock, 60_000))).toBe(false)
  })

  it('unsubscribes from the store on close, and waits by polling on a store that cannot watch', async () => {
    const { store, listeners } = watchingStore()
    const waiter = new Waiter(store, 's', 'k')
    expect(listeners.size).toBe(1)
    waiter.close()
    expect(listeners.size).toBe(0)

    const clock = new ManualClock()
    const polling = new Waiter({} as IdempotencyStore, 's', 'k')
    const sleeping = polling.wait(clock, 250)
    clock.advance(249)
    expect(await settled(sleeping)).toBe(false)
    clock.advance(1)
    expect(await settled(sleeping)).toBe(true)
    polling.close()
  })
})

describe('isTransactionalStore', () => {
  it('needs both transaction and completeInTransaction', () => {
    const fn = async () => true
    expect(isTransactionalStore({ transaction: fn, completeInTransaction: fn } as unknown as IdempotencyStore)).toBe(true)
    expect(isTransactionalStore({ transaction: fn } as unknown as IdempotencyStore)).toBe(false)
    expect(isTransactionalStore({ completeInTransaction: fn } as unknown as IdempotencyStore)).toBe(false)
    expect(isTransactionalStore({ transaction: 'yes', completeInTransaction: fn } as unknown as IdempotencyStore)).toBe(false)
  })
})

describe('the store-side argument checks', () => {
  const refusal = (fn: () => void) => {
    try {
      fn()
    } catch (error) {
      return isIdempotencyError(error) ? `${error.code}: ${error.message}` : String(error)
    }
    return 'accepted'
  }

  it('a key is 1-255 printable ASCII characters, and the message says which rule it broke', () => {
    expect(refusal(() => assertKey('k'.repeat(255)))).toBe('accepted')
    expect(refusal(() => assertKey(' ~'))).toBe('accepted')
    expect(refusal(() => assertKey(''))).toMatch(/^KEY_INVALID: .*; got a string of 0 characters\. Use a UUID/)
    expect(refusal(() => assertKey('k'.repeat(256)))).toMatch(/got a string of 256 characters\. Use a UUID/)
    expect(refusal(() => assertKey('clé'))).toMatch(/got a string of 3 characters with a character outside that range\./)
    expect(refusal(() => assertKey(null))).toMatch(/got null\./)
    expect(refusal(() => assertKey(42))).toMatch(/got number\./)
  })

  it('a scope is 1-255 characters of any printable text, without control characters', () => {
    expect(refusal(() => assertScope('tenant-é'.padEnd(255, 'x')))).toBe('accepted')
    expect(refusal(() => assertScope('x'.repeat(256)))).toMatch(/^SCOPE_INVALID: .*got a string of 256 characters\. A tenant/)
    expect(refusal(() => assertScope(''))).toMatch(/^SCOPE_INVALID/)
    expect(refusal(() => assertScope('a\nb'))).toMatch(/^SCOPE_INVALID/)
    expect(refusal(() => assertScope(undefined))).toMatch(/got undefined\./)
  })

  it('a fingerprint is 64 lowercase hex digits', () => {
    expect(refusal(() => assertFingerprint('a0'.repeat(32)))).toBe('accepted')
    for (const bad of ['A0'.repeat(32), 'a'.repeat(63), 'a'.repeat(65), 'g'.repeat(64), 64]) {
      expect(refusal(() => assertFingerprint(bad))).toMatch(/^FINGERPRINT_INVALID: .*Use fingerprintOf/)
    }
  })

  it('tokens and limits are positive safe integers', () => {
    expect(refusal(() => assertPositiveInteger(1, 'token'))).toBe('accepted')
    expect(refusal(() => assertPositiveInteger(Number.MAX_SAFE_INTEGER, 'token'))).toBe('accepted')
    for (const bad of [0, -1, 1.5, Number.NaN, 2 ** 53, '1']) {
      expect(refusal(() => assertPositiveInteger(bad, 'token'))).toBe(
        `INVALID_ARGUMENT: token must be a positive integer, got ${String(bad)}.`,
      )
    }
  })

  it('recordStep takes a step name of 1-128 printable ASCII characters without " and \\, and a result that is text or null', () => {
    const step = (token: unknown, name: unknown, result: unknown) =>
      refusal(() => assertRecordStep('s', 'k', token as number, name, result))
    expect(step(1, 'charge', '{"id":1}')).toBe('accepted')
    expect(step(1, 'n'.repeat(128), null)).toBe('accepted')
    expect(step(0, 'charge', null)).toMatch(/^INVALID_ARGUMENT: token must be/)
    for (const name of ['', 'n'.repeat(129), 'a"b', 'a\\b', 'é', 7]) {
      expect(step(1, name, null)).toMatch(/^INVALID_ARGUMENT: recordStep needs a step name/)
    }
    expect(step(1, 'charge', { id: 1 })).toBe(
      'INVALID_ARGUMENT: recordStep needs the result as JSON text, or null for a started marker; got object.',
    )
    expect(refusal(() => assertRecordStep('s', '', 1, 'charge', null))).toMatch(/^KEY_INVALID/)
  })

  it('steps are kept as one JSON object: results as {"r": text}, started markers as {}', () => {
    expect(stepJson(null)).toBe('{}')
    expect(stepJson('{"id":1}')).toBe('{"r":"{\\"id\\":1}"}')
    for (const none of [null, undefined, '', '{}']) expect(stepsFromJson(none)).toBeUndefined()
    const text = `{"charge":${stepJson('{"id":1}')},"email":${stepJson(null)}}`
    const expected = [
      { name: 'charge', result: '{"id":1}' },
      { name: 'email', result: null },
    ]
    expect(stepsFromJson(text)).toEqual(expected)
    // A driver that parsed the JSON column already hands over the object.
    expect(stepsFromJson(JSON.parse(text))).toEqual(expected)
    expect(stepsFromJson({ odd: null } as never)).toEqual([{ name: 'odd', result: null }])
  })
})
