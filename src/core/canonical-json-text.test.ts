import fc from 'fast-check'
import { canonicalJson } from './canonical-json.js'
import { canonicalJsonText, MAX_JSON_DEPTH } from './canonical-json-text.js'

/** The error a call throws, or a failure when it returns. */
function thrown(fn: () => unknown): { code?: unknown; message: string } {
  try {
    fn()
  } catch (error) {
    return error as { code?: unknown; message: string }
  }
  throw new Error('expected a throw')
}
const utf8 = (text: string): Uint8Array => new TextEncoder().encode(text)

function parses(text: string): boolean {
  try {
    JSON.parse(text)
    return true
  } catch {
    return false
  }
}

describe('canonicalJsonText: numbers by exact decimal value', () => {
  it('spells every zero as 0', () => {
    for (const zero of ['0', '-0', '0.0', '-0.000', '0e5', '0E-5', '-0e+999999999999999999999', '0.00e0']) {
      expect(canonicalJsonText(zero)).toBe('0')
    }
  })

  it('gives every spelling of one decimal the same text', () => {
    for (const spelling of ['100', '1e2', '1E2', '100.0', '1.00e+2', '1.00E+02', '10e1', '1000e-1', '0.1e3', '100.000e0']) {
      expect(canonicalJsonText(spelling)).toBe('100')
    }
    expect(canonicalJsonText('-12.50')).toBe('-12.5')
    expect(canonicalJsonText('125e-1')).toBe('12.5')
  })

  it('lays numbers out as ECMAScript Number::toString does', () => {
    expect(canonicalJsonText('1e21')).toBe('1e+21')
    expect(canonicalJsonText('100000000000000000000')).toBe('100000000000000000000')
    expect(canonicalJsonText('123456789012345678901234')).toBe('1.23456789012345678901234e+23')
    expect(canonicalJsonText('0.000001')).toBe('0.000001')
    expect(canonicalJsonText('0.0000001')).toBe('1e-7')
    expect(canonicalJsonText('-0.00000012')).toBe('-1.2e-7')
    expect(canonicalJsonText('12345678901234567890.5')).toBe('12345678901234567890.5')
    expect(canonicalJsonText('123456789012345678901.5')).toBe('123456789012345678901.5')
    expect(canonicalJsonText('1234567890123456789012.5')).toBe('1.2345678901234567890125e+21')
  })

  it('handles enormous exponents without hanging or allocating their zeros', () => {
    const started = performance.now()
    expect(canonicalJsonText('1e999999999999999999')).toBe('1e+999999999999999999')
    expect(canonicalJsonText('0.15e-999999999999999999')).toBe('1.5e-1000000000000000000')
    expect(canonicalJsonText('10e99999999999999999999999')).toBe('1e+100000000000000000000000')
    expect(canonicalJsonText('0.01e-00000000000000000000000000000001')).toBe('0.001')
    const nines = '9'.repeat(1_000_000)
    expect(canonicalJsonText(`10e${nines}`)).toBe(`1e+1${'0'.repeat(1_000_000)}`)
    expect(canonicalJsonText(`0.01e-${nines}`)).toBe(`1e-1${'0'.repeat(999_999)}1`)
    expect(canonicalJsonText(`1e${'0'.repeat(1_000_000)}7`)).toBe('10000000')
    expect(performance.now() - started).toBeLessThan(2_000)
  })

  it('writes the same text as JSON.stringify for every spelling of a double', () => {
    fc.assert(
      fc.property(fc.double({ noNaN: true, noDefaultInfinity: true }), (x) => {
        const expected = JSON.stringify(x)
        expect(canonicalJsonText(String(x))).toBe(expected)
        expect(canonicalJsonText(x.toExponential())).toBe(expected)
        expect(canonicalJsonText(x.toExponential().toUpperCase())).toBe(expected)
        expect(canonicalJson(x)).toBe(expected)
      }),
      { numRuns: 2_000 },
    )
  })
})

describe('canonicalJsonText: strings, objects and arrays', () => {
  it('resolves escapes and writes strings as JSON.stringify does', () => {
    expect(canonicalJsonText('"\\u0041\\/\\n\\u00e9\\u20AC\\ud83d\\ude00\\u2028\\u007f\\u001F"')).toBe(
      JSON.stringify('A/\né€😀\u2028\u007f\u001f'),
    )
    expect(canonicalJsonText('"\\ud800"')).toBe('"\\ud800"')
    expect(canonicalJsonText('"\ud800x"')).toBe('"\\ud800x"')
    expect(canonicalJsonText('"\udc00"')).toBe('"\\udc00"')
    expect(canonicalJsonText('"😀"')).toBe('"😀"')
  })

  it('sorts members by UTF-16 code units and drops whitespace', () => {
    expect(canonicalJsonText(' {\n"b" : 1 ,\t"a":[ true , null ,"x" ],"\\u20ac":1,"\\r":2,"😀":3,"1":4}\r\n')).toBe(
      '{"\\r":2,"1":4,"a":[true,null,"x"],"b":1,"€":1,"😀":3}',
    )
    expect(canonicalJsonText('{"\uff61":1,"\ud83d\ude00":2}')).toBe('{"😀":2,"｡":1}')
  })

  it('compares member names after escapes are resolved', () => {
    expect(thrown(() => canonicalJsonText('{"a":1,"\\u0061":2}'))).toMatchObject({
      code: 'BODY_INVALID',
      message: expect.stringContaining('"a" twice'),
    })
    expect(thrown(() => canonicalJsonText('[{"x":{"k":1,"j":2,"k":3}}]')).message).toContain('"k" twice')
    expect(canonicalJsonText('{"a":{"a":1},"b":{"a":2}}')).toBe('{"a":{"a":1},"b":{"a":2}}')
  })

  it('finds duplicates in large objects too', () => {
    const members = Array.from({ length: 500 }, (_, i) => `"k${i}":${i}`)
    expect(canonicalJsonText(`{${members.join(',')}}`)).toBe(
      JSON.stringify(Object.fromEntries(Array.from({ length: 500 }, (_, i) => [`k${i}`, i]).sort())),
    )
    expect(thrown(() => canonicalJsonText(`{${members.join(',')},"k250":0}`)).message).toContain('"k250" twice')
  })

  it('accepts nesting up to the limit and refuses one level more', () => {
    expect(MAX_JSON_DEPTH).toBe(128)
    const nest = (depth: number) => `${'['.repeat(depth)}${']'.repeat(depth)}`
    expect(canonicalJsonText(nest(128))).toBe(nest(128))
    expect(thrown(() => canonicalJsonText(nest(129))).code).toBe('BODY_INVALID')
    expect(canonicalJsonText('{"a":[{}]}', 3)).toBe('{"a":[{}]}')
    expect(thrown(() => canonicalJsonText('{"a":[{}]}', 2)).message).toContain('deeper than 2 levels')
    expect(canonicalJsonText('1', 0)).toBe('1')
  })

  it('lets a syntax error win over depth and duplicates: that body is not JSON', () => {
    expect(canonicalJsonText('['.repeat(30_000))).toBeUndefined()
    expect(canonicalJsonText('{"a":1,"a":2')).toBeUndefined()
    expect(canonicalJsonText('{"a":1,"a":2}}')).toBeUndefined()
  })
})

describe('canonicalJsonText: what is not JSON', () => {
  it('returns undefined exactly where JSON.parse throws', () => {
    const invalid = [
      '',
      ' ',
      '{"a":}',
      '01',
      '-01',
      '[1,]',
      '{"a":1,}',
      'tru',
      'nul',
      'True',
      '"\x01"',
      '"\\x41"',
      '"\\u12G4"',
      '1.',
      '.5',
      '-',
    ]
    const moreInvalid = [
      '1e',
      '1e+',
      '+1',
      'NaN',
      'Infinity',
      '[1 2]',
      '{"a" 1}',
      '{a:1}',
      "'a'",
      '"a',
      '// c\n1',
      '1 /* c */',
      '\u00a01',
      '1 2',
    ]
    for (const text of [...invalid, ...moreInvalid, '\ufeff{}', '[', '{', ']']) {
      expect(parses(text)).toBe(false)
      expect(canonicalJsonText(text)).toBeUndefined()
    }
  })

  it('returns undefined for bytes that are not UTF-8, and for a leading BOM', () => {
    expect(canonicalJsonText(new Uint8Array([0x22, 0xff, 0x22]))).toBeUndefined()
    expect(canonicalJsonText(new Uint8Array([0x22, 0xed, 0xa0, 0x80, 0x22]))).toBeUndefined() // an encoded surrogate
    expect(canonicalJsonText(new Uint8Array([0xef, 0xbb, 0xbf, 0x7b, 0x7d]))).toBeUndefined()
    expect(canonicalJsonText(utf8(' {"b":"é","a":1} '))).toBe('{"a":1,"b":"é"}')
  })

  it('agrees with JSON.parse on what is JSON, for random and mutated texts', () => {
    const alphabet = [
      ...'{}[],:"\\ \t\n0123456789.eE+-truefalsn/u'.split(''),
      'ab',
      '\x01',
      '\ud800',
      '\ufeff',
      '\u00a0',
      '"a":',
      '\\u00e9',
    ]
    const mutation = fc.tuple(fc.nat(), fc.constantFrom('delete', 'insert', 'replace'), fc.constantFrom(...alphabet))
    const mutated = fc
      .tuple(
        fc.jsonValue().map((v) => JSON.stringify(v, null, 1)),
        fc.array(mutation, { maxLength: 3 }),
      )
      .map(([text, changes]) => {
        let out = text
        for (const [at, kind, piece] of changes) {
          const i = at % (out.length + 1)
          out = out.slice(0, i) + (kind === 'delete' ? '' : piece) + out.slice(kind === 'insert' ? i : i + 1)
        }
        return out
      })
    const random = fc.array(fc.constantFrom(...alphabet), { maxLength: 12 }).map((parts) => parts.join(''))
    fc.assert(
      fc.property(fc.oneof(mutated, random), (text) => {
        let result: string | undefined
        try {
          result = canonicalJsonText(text)
        } catch (error) {
          expect((error as { code: unknown }).code).toBe('BODY_INVALID')
          expect(parses(text)).toBe(true)
          return
        }
        expect(result === undefined).toBe(!parses(text))
      }),
      { numRuns: 3_000 },
    )
  })

  it('agrees with a strict UTF-8 decoder and JSON.parse on random bytes', () => {
    const strict = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })
    const bytes = fc.oneof(
      fc.uint8Array({ maxLength: 8 }),
      fc.tuple(fc.jsonValue({ stringUnit: 'binary' }), fc.uint8Array({ maxLength: 2 }), fc.nat()).map(([v, junk, at]) => {
        const text = utf8(JSON.stringify(v))
        const i = at % (text.length + 1)
        return new Uint8Array([...text.subarray(0, i), ...junk, ...text.subarray(i)])
      }),
    )
    fc.assert(
      fc.property(bytes, (input) => {
        let valid: boolean
        try {
          valid = parses(strict.decode(input))
        } catch {
          valid = false
        }
        expect(canonicalJsonText(input) !== undefined).toBe(valid)
      }),
      { numRuns: 2_000 },
    )
  })
})

// A reference model of JSON values: numbers as exact (negative, digits, exponent) with digits free of
// trailing zeros, objects as name → value with order ignored. Two texts mean the same JSON value
// exactly when their models are equal.
type Model =
  | { t: 'lit'; v: 'true' | 'false' | 'null' }
  | { t: 'str'; v: string }
  | { t: 'num'; negative: boolean; digits: bigint; exp: bigint }
  | { t: 'arr'; items: Model[] }
  | { t: 'obj'; members: Array<[string, Model]> }

function number(negative: boolean, digits: bigint, exp: bigint): Model {
  if (digits === 0n) return { t: 'num', negative: false, digits: 0n, exp: 0n }
  let d = digits
  let e = exp
  while (d % 10n === 0n) {
    d /= 10n
    e += 1n
  }
  return { t: 'num', negative, digits: d, exp: e }
}

/** An injective key for a model: equal models, equal keys. */
function modelKey(m: Model): string {
  switch (m.t) {
    case 'lit':
    case 'str':
      return JSON.stringify([m.t, m.v])
    case 'num':
      return JSON.stringify(['num', m.negative, String(m.digits), String(m.exp)])
    case 'arr':
      return JSON.stringify(['arr', m.items.map(modelKey)])
    case 'obj':
      return JSON.stringify(['obj', m.members.map(([k, v]) => [k, modelKey(v)]).sort(([a], [b]) => (a! < b! ? -1 : a! > b! ? 1 : 0))])
  }
}

/** Models from a small domain, so that two independent draws are often equal or nearly so. */
const digitsOf = (wide: boolean) => (wide ? fc.bigInt({ min: 0n, max: 10n ** 30n }) : fc.bigInt({ min: 0n, max: 12n }))
const exponentOf = (wide: boolean) =>
  wide ? fc.oneof(fc.bigInt({ min: -30n, max: 30n }), fc.bigInt({ min: -(10n ** 22n), max: 10n ** 22n })) : fc.bigInt({ min: -3n, max: 3n })

function models(wide: boolean): fc.Arbitrary<Model> {
  const digits = digitsOf(wide)
  const exp = exponentOf(wide)
  const text = fc.string({
    unit: fc.constantFrom('a', 'é', '"', '\\', '/', '\u0000', '\n', '\ud800', '\udc00', '😀', '\u2028'),
    maxLength: 2,
  })
  const { model } = fc.letrec<{ model: Model }>((tie) => ({
    model: fc.oneof(
      { depthSize: 'small', withCrossShrink: true },
      fc.constantFrom<Model>({ t: 'lit', v: 'true' }, { t: 'lit', v: 'false' }, { t: 'lit', v: 'null' }),
      text.map((v): Model => ({ t: 'str', v })),
      fc.tuple(fc.boolean(), digits, exp).map(([negative, d, e]) => number(negative, d, e)),
      fc.array(tie('model'), { maxLength: 3 }).map((items): Model => ({ t: 'arr', items })),
      fc.uniqueArray(fc.tuple(text, tie('model')), { maxLength: 3, selector: ([k]) => k }).map((members): Model => ({ t: 'obj', members })),
    ),
  }))
  return model
}

/**
 * Two models that differ in one number by the least step (one unit in the last of 30 digits, a power of
 * ten, a sign) or not at all: where a lossy canonical form would merge them.
 */
function neighbours(wide: boolean): fc.Arbitrary<[Model, Model]> {
  const change = fc.constantFrom('same', 'digits+1', 'digits-1', 'exp+1', 'exp-1', '-exp', '-sign')
  return fc.tuple(models(wide), fc.boolean(), digitsOf(wide), exponentOf(wide), change).map(([m, negative, d, e, how]): [Model, Model] => {
    const a = number(negative, d, e)
    const b =
      how === 'digits+1'
        ? number(negative, d + 1n, e)
        : how === 'digits-1'
          ? number(negative, d === 0n ? 1n : d - 1n, e)
          : how === 'exp+1'
            ? number(negative, d, e + 1n)
            : how === 'exp-1'
              ? number(negative, d, e - 1n)
              : how === '-exp'
                ? number(negative, d, -e)
                : how === '-sign'
                  ? number(!negative, d, e)
                  : a
    return [
      { t: 'arr', items: [m, a] },
      { t: 'arr', items: [m, b] },
    ]
  })
}

const SHORT: Record<string, string> = {
  '"': '\\"',
  '\\': '\\\\',
  '\b': '\\b',
  '\f': '\\f',
  '\n': '\\n',
  '\r': '\\r',
  '\t': '\\t',
  '/': '\\/',
}

/** A seeded choice of a whole number from 0 to max (mulberry32): cheaper than fc.gen for hundreds of choices per text. */
function chooser(seed: number): (max: number) => number {
  let state = seed >>> 0
  return (max) => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * (max + 1))
  }
}

/** One of the many texts of a model: whitespace, member order, escapes and number spelling chosen by the seed. */
function spell(m: Model, seed: number): string {
  const pick = chooser(seed)
  const ws = () => ['', '', ' ', '\t', '\n', '\r', ' \n  '][pick(6)]!
  const str = (s: string) => {
    let out = '"'
    for (const ch of s.split('')) {
      const code = ch.charCodeAt(0)
      const must = ch === '"' || ch === '\\' || code < 0x20
      const way = pick(must ? 1 : 3)
      const hex = code.toString(16).padStart(4, '0')
      if (way === 0 && SHORT[ch] !== undefined) out += SHORT[ch]
      else if (way <= 1) out += `\\u${pick(1) ? hex.toUpperCase() : hex}`
      else out += ch
    }
    return `${out}"`
  }
  const num = (negative: boolean, digits: bigint, exp: bigint) => {
    let int: string
    let frac: string
    let e: bigint
    if (digits === 0n) {
      int = '0'
      frac = '0'.repeat(pick(2))
      e = BigInt(pick(10) - 5)
      negative = pick(1) === 1
    } else {
      const zeros = pick(3)
      const all = digits.toString() + '0'.repeat(zeros)
      const point = pick(all.length + 3) // digits after the decimal point
      e = exp - BigInt(zeros) + BigInt(point)
      int = point >= all.length ? '0' : all.slice(0, all.length - point)
      frac = point >= all.length ? '0'.repeat(point - all.length) + all : all.slice(all.length - point)
    }
    let out = (negative ? '-' : '') + int + (frac === '' ? '' : `.${frac}`)
    if (e !== 0n || pick(1)) {
      const sign = e < 0n ? '-' : pick(1) ? '+' : ''
      out += `${pick(1) ? 'e' : 'E'}${sign}${'0'.repeat(pick(2))}${e < 0n ? -e : e}`
    }
    return out
  }
  const value = (v: Model): string => {
    switch (v.t) {
      case 'lit':
        return v.v
      case 'str':
        return str(v.v)
      case 'num':
        return num(v.negative, v.digits, v.exp)
      case 'arr':
        return `[${ws()}${v.items.map((item) => `${value(item)}${ws()}`).join(`,${ws()}`)}]`
      case 'obj': {
        const members = [...v.members]
        for (let i = members.length - 1; i > 0; i--) {
          const j = pick(i)
          ;[members[i], members[j]] = [members[j]!, members[i]!]
        }
        return `{${ws()}${members.map(([k, item]) => `${str(k)}${ws()}:${ws()}${value(item)}${ws()}`).join(`,${ws()}`)}}`
      }
    }
  }
  return `${ws()}${value(m)}${ws()}`
}

describe('canonicalJsonText: one value, one text (property-based, against a reference model)', () => {
  it('gives the same value spelled differently the same text', () => {
    fc.assert(
      fc.property(fc.oneof(models(false), models(true)), fc.integer(), fc.integer(), (m, seed1, seed2) => {
        expect(canonicalJsonText(spell(m, seed1))).toBe(canonicalJsonText(spell(m, seed2)))
      }),
      { numRuns: 2_000 },
    )
  })

  it('gives distinct values distinct texts, and equal values equal texts', () => {
    for (const wide of [false, true]) {
      fc.assert(
        fc.property(
          fc.oneof(fc.tuple(models(wide), models(wide)), neighbours(wide)),
          fc.integer(),
          fc.integer(),
          ([a, b], seed1, seed2) => {
            const same = modelKey(a) === modelKey(b)
            expect(canonicalJsonText(spell(a, seed1)) === canonicalJsonText(spell(b, seed2))).toBe(same)
          },
        ),
        { numRuns: 2_000 },
      )
    }
  })

  it('reads a canonical text back as itself', () => {
    fc.assert(
      fc.property(models(true), fc.integer(), (m, seed) => {
        const canonical = canonicalJsonText(spell(m, seed))!
        expect(canonicalJsonText(canonical)).toBe(canonical)
      }),
    )
  })
})
