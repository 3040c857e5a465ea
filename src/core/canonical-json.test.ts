import fc from 'fast-check'
import { canonicalJson } from './canonical-json.js'
import { canonicalJsonText } from './canonical-json-text.js'

/** The error a call throws, or a failure when it returns. */
function thrown(fn: () => unknown): { code?: unknown; message: string } {
  try {
    fn()
  } catch (error) {
    return error as { code?: unknown; message: string }
  }
  throw new Error('expected a throw')
}

describe('the issue: different requests share a fingerprint', () => {
  // Each pair below is merged by JSON.parse (the old path), which the first assertion pins.
  it('keeps integers beyond 2^53 apart', () => {
    const [a, b] = ['{"account":9007199254740993}', '{"account":9007199254740992}']
    expect(JSON.stringify(JSON.parse(a))).toBe(JSON.stringify(JSON.parse(b)))
    expect(canonicalJsonText(a)).toBe('{"account":9007199254740993}')
    expect(canonicalJsonText(b)).toBe('{"account":9007199254740992}')
  })

  it('keeps an over-precise decimal apart from its nearest double', () => {
    expect(JSON.parse('0.10000000000000001')).toBe(JSON.parse('0.1'))
    expect(canonicalJsonText('0.10000000000000001')).toBe('0.10000000000000001')
    expect(canonicalJsonText('0.1')).toBe('0.1')
  })

  it('refuses duplicate member names instead of keeping the last one', () => {
    expect(JSON.stringify(JSON.parse('{"amount":1,"amount":1000}'))).toBe('{"amount":1000}')
    expect(thrown(() => canonicalJsonText('{"amount":1,"amount":1000}'))).toMatchObject({
      code: 'BODY_INVALID',
      message:
        'The JSON body has the member "amount" twice in one object; idemkey cannot tell which one the server will use. Send each member once.',
    })
    expect(canonicalJsonText('{"amount":1000}')).toBe('{"amount":1000}')
  })

  it('fingerprints BigInt values from lossless parsers as the numbers they are', () => {
    expect(canonicalJson({ account: 9007199254740993n })).toBe('{"account":9007199254740993}')
    expect(canonicalJson({ account: 9007199254740993n })).not.toBe(canonicalJson({ account: 9007199254740992n }))
    expect(canonicalJson(100n)).toBe(canonicalJsonText('1e2'))
    expect(canonicalJson(-(10n ** 30n))).toBe('-1e+30')
  })

  it('refuses Infinity with a message that points at the body parser', () => {
    expect(thrown(() => canonicalJson({ amount: Number.POSITIVE_INFINITY }))).toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/Infinity.*raw body/s),
    })
    expect(thrown(() => canonicalJson(Number.NaN))).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining('NaN') })
  })

  it('answers BODY_INVALID for text nested 30,000 deep, quickly and without a stack overflow', () => {
    const deep = `${'{"a":'.repeat(30_000)}1${'}'.repeat(30_000)}`
    const started = performance.now()
    expect(thrown(() => canonicalJsonText(deep))).toMatchObject({
      code: 'BODY_INVALID',
      message: 'The JSON body nests deeper than 128 levels, the most idemkey fingerprints. Flatten the body.',
    })
    expect(thrown(() => canonicalJsonText(`${'['.repeat(30_000)}${']'.repeat(30_000)}`))).toMatchObject({ code: 'BODY_INVALID' })
    expect(performance.now() - started).toBeLessThan(1_000)
  })

  it('refuses a value nested 30,000 deep, or circular, without a stack overflow', () => {
    let deep: unknown = 1
    for (let i = 0; i < 30_000; i++) deep = { a: deep }
    expect(thrown(() => canonicalJson(deep))).toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringMatching(/deeper than 128.*circular/),
    })
    const circular: Record<string, unknown> = {}
    circular.self = circular
    expect(thrown(() => canonicalJson(circular))).toMatchObject({ code: 'INVALID_ARGUMENT' })
  })

  it('refuses a Map instead of fingerprinting every Map as {}', () => {
    expect(thrown(() => canonicalJson(new Map([['amount', 1]])))).toMatchObject({
      code: 'INVALID_ARGUMENT',
      message: expect.stringContaining('a Map'),
    })
    expect(thrown(() => canonicalJson({ items: new Set([1]) })).message).toContain('a Set')
  })
})

describe('canonicalJson: parsed values', () => {
  it('writes the same text as the text path for the same JSON value', () => {
    const unit = fc.oneof(
      fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }),
      fc.integer({ min: 0xd800, max: 0xdfff }).map((c) => String.fromCharCode(c)),
      fc.constantFrom('"', '\\', '\u0000', '\u001f', '\u2028', '\u007f', '/'),
    )
    fc.assert(
      fc.property(fc.jsonValue({ stringUnit: unit }), (value) => {
        expect(canonicalJsonText(JSON.stringify(value))).toBe(canonicalJson(value))
      }),
      { numRuns: 2_000 },
    )
  })

  it('writes a flat object (the common payload, written in one pass) as the general walk writes it nested', () => {
    const primitive = fc.oneof(
      fc.string({ unit: 'binary' }),
      fc.double(),
      fc.constantFrom(-0, 0, 1e21, 5e-324, Number.MAX_VALUE, true, false, null, undefined, Number.NaN, Number.POSITIVE_INFINITY),
      fc.constant(() => 1),
      fc.constant(Symbol('s')),
    )
    const name = fc.oneof(fc.string({ unit: 'binary' }), fc.constantFrom('__proto__', 'toString', '', '1', '01', 'a"b'))
    fc.assert(
      fc.property(fc.dictionary(name, primitive, { maxKeys: 8 }), fc.boolean(), (entries, bare) => {
        const object = bare ? Object.assign(Object.create(null), entries) : entries
        let flat: string | Error
        let nested: string | Error
        try {
          flat = canonicalJson(object)
        } catch (error) {
          flat = error as Error
        }
        try {
          // Inside an array the object goes through the general walk.
          nested = canonicalJson([object]).slice(1, -1)
        } catch (error) {
          nested = error as Error
        }
        if (typeof flat === 'string') expect(flat).toBe(nested)
        else expect(nested).toBeInstanceOf(Error)
      }),
      { numRuns: 3_000 },
    )
  })

  it('keeps the existing callers output: sorted keys, normalised numbers', () => {
    expect(canonicalJson({ b: 1, a: [true, null, 'x'], c: { z: 1e21, y: 0.1, x: -0 } })).toBe(
      '{"a":[true,null,"x"],"b":1,"c":{"x":0,"y":0.1,"z":1e+21}}',
    )
  })

  it('follows JSON.stringify for toJSON, undefined, functions, symbols and holes', () => {
    const date = new Date(Date.UTC(2024, 0, 2, 3, 4, 5))
    expect(canonicalJson({ at: date })).toBe('{"at":"2024-01-02T03:04:05.000Z"}')
    expect(canonicalJson(Buffer.from([1, 2]))).toBe('{"data":[1,2],"type":"Buffer"}')
    expect(canonicalJson({ a: undefined, b: () => 1, c: Symbol('c'), d: 1 })).toBe('{"d":1}')
    // biome-ignore lint/suspicious/noSparseArray: a hole is the case under test
    expect(canonicalJson([undefined, () => 1, Symbol('s'), , 2])).toBe('[null,null,null,null,2]')
    expect(canonicalJson({ skip: { toJSON: () => undefined }, keep: { toJSON: (key: string) => key } })).toBe('{"keep":"keep"}')
    expect(canonicalJson([{ toJSON: (key: string) => key }])).toBe('["0"]')
    expect(canonicalJson([Object(1n), Object('s'), Object(false), Object(2)])).toBe('[1,"s",false,2]')
    class Money {
      constructor(
        readonly currency: string,
        readonly amount: bigint,
      ) {}
    }
    expect(canonicalJson(new Money('eur', 12_000n))).toBe('{"amount":12000,"currency":"eur"}')
    expect(canonicalJson(Object.assign(Object.create(null), { b: 2, a: 1 }))).toBe('{"a":1,"b":2}')
  })

  it('refuses a top-level value that JSON has no text for', () => {
    for (const value of [undefined, () => 1, Symbol('s'), { toJSON: () => undefined }]) {
      expect(thrown(() => canonicalJson(value)).code).toBe('INVALID_ARGUMENT')
    }
  })

  it('names each type JSON cannot carry faithfully', () => {
    const cases: Array<[unknown, string]> = [
      [new Map(), 'a Map'],
      [new Set(), 'a Set'],
      [new WeakMap(), 'a WeakMap'],
      [new WeakSet(), 'a WeakSet'],
      [Promise.resolve(1), 'a Promise'],
      [/x/, 'a RegExp'],
      [new Error('boom'), 'an Error'],
      [new ArrayBuffer(2), 'an ArrayBuffer'],
      [new Uint8Array(2), 'a Uint8Array'],
      [new DataView(new ArrayBuffer(2)), 'a DataView'],
      [Object(Symbol('s')), 'a Symbol'],
      [new Map().keys(), 'a Map Iterator'],
    ]
    for (const [value, name] of cases) {
      const error = thrown(() => canonicalJson({ field: [value] }))
      expect(error.code).toBe('INVALID_ARGUMENT')
      expect(error.message).toContain(name)
    }
  })

  it('accepts nesting up to the limit and refuses one level more', () => {
    const nest = (depth: number): unknown => {
      let value: unknown = []
      for (let i = 1; i < depth; i++) value = [value]
      return value
    }
    expect(canonicalJson(nest(128))).toBe(`${'['.repeat(128)}${']'.repeat(128)}`)
    expect(thrown(() => canonicalJson(nest(129))).code).toBe('INVALID_ARGUMENT')
    expect(thrown(() => canonicalJson({ a: [{}] }, 2)).message).toContain('deeper than 2 levels')
    expect(thrown(() => canonicalJson({}, -1)).code).toBe('INVALID_ARGUMENT')
  })
})
