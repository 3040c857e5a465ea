import { IdempotencyError } from '../errors.js'
import { decimal } from './exact-decimal.js'

/**
 * The deepest nesting of arrays and objects (together) that idemkey fingerprints: 128 levels, the
 * top-level array or object being level 1.
 *
 * Why a limit: a body nested 30,000 deep costs a parser stack or memory per level, and no payment or
 * order API needs more than a dozen levels. Why 128: it is serde_json's recursion limit and above Ruby
 * JSON's default of 100, so a body that common servers parse with their defaults is never refused.
 * Deeper bodies are a `400` (docs/http.md, "Fingerprints"), not a fingerprint of something less than the whole body.
 */
export const MAX_JSON_DEPTH = 128

// Character codes the scanner compares against.
const TAB = 0x09
const LF = 0x0a
const CR = 0x0d
const SPACE = 0x20
const QUOTE = 0x22
const PLUS = 0x2b
const COMMA = 0x2c
const MINUS = 0x2d
const DOT = 0x2e
const ZERO = 0x30
const ONE = 0x31
const NINE = 0x39
const COLON = 0x3a
const UPPER_E = 0x45
const OPEN_BRACKET = 0x5b
const BACKSLASH = 0x5c
const CLOSE_BRACKET = 0x5d
const LOWER_E = 0x65
const OPEN_BRACE = 0x7b
const CLOSE_BRACE = 0x7d

// ignoreBOM keeps a leading U+FEFF in the text, where the scanner refuses it as JSON.parse does.
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })

/**
 * The canonical text of a JSON body, read from its bytes without ever turning a number into a double,
 * so that two bodies share a fingerprint exactly when they are the same JSON value (docs/http.md, "Fingerprints").
 *
 * Canonical means: no whitespace; object members sorted by the UTF-16 code units of their names;
 * strings written as `JSON.stringify` writes them (escapes resolved); numbers by exact decimal value,
 * laid out as ECMAScript's `Number::toString` lays out its digits, so `100`, `1e2` and `100.0` are one
 * number while `9007199254740993` and `9007199254740992` stay two. For a number a double holds
 * exactly, the text is `JSON.stringify`'s, which is also what `canonicalJson` (canonical-json.ts) writes for it.
 *
 * The grammar is RFC 8259's, the one `JSON.parse` accepts. A leading byte order mark is not JSON
 * (as for `JSON.parse`): such a body is hashed as bytes, which can only keep requests apart.
 *
 * @param text the body: bytes (decoded as strict UTF-8) or text.
 * @param maxDepth the deepest nesting accepted (default {@link MAX_JSON_DEPTH}).
 * @returns the canonical text, or `undefined` when the input is not JSON (syntax error, bytes that
 *   are not UTF-8): the caller then hashes the raw bytes.
 * @throws IdempotencyError `BODY_INVALID` when the input is JSON but cannot be fingerprinted
 *   losslessly: a member name twice in one object (I-JSON, RFC 7493: which one counts depends on
 *   the server's parser), or nesting deeper than `maxDepth`. A syntax error anywhere wins over both.
 *
 * @example
 * const canonical = canonicalJsonText(body)
 * const fingerprint = canonical === undefined ? sha256Hex('bytes\n', body) : sha256Hex('json\n', canonical)
 */
export function canonicalJsonText(text: string | Uint8Array, maxDepth: number = MAX_JSON_DEPTH): string | undefined {
  checkMaxDepth(maxDepth)
  let source: string
  if (typeof text === 'string') source = text
  else {
    try {
      source = decoder.decode(text)
    } catch {
      return undefined
    }
  }
  return scan(source, maxDepth)
}

/** Throws `INVALID_OPTION` unless `maxDepth` is a non-negative integer. */
export function checkMaxDepth(maxDepth: number): void {
  if (!Number.isInteger(maxDepth) || maxDepth < 0) {
    throw new IdempotencyError('INVALID_ARGUMENT', `maxDepth must be a whole number of levels, 0 or more; got ${String(maxDepth)}.`)
  }
}

/** One open array or object of the scanner. Reused across the levels of one scan. */
interface Frame {
  object: boolean
  /** Arrays: the canonical text so far, from the `[`. */
  out: string
  /** Objects: the decoded names, and `"name":value` in canonical text, in input order. */
  names: string[]
  members: string[]
  /** Objects: the member whose value is being scanned. */
  name: string
  nameText: string
}

// What the last scanString/scanNumber read (one scan runs at a time: nothing in it calls out).
let scanned = ''
let scannedName = ''
let duplicate = ''

function scan(s: string, maxDepth: number): string | undefined {
  const len = s.length
  const frames: Frame[] = []
  let depth = 0
  let i = skipSpace(s, 0, len)
  let value: string
  for (;;) {
    // A value starts at i.
    const c = s.charCodeAt(i)
    if (c === QUOTE) {
      i = scanString(s, i, len, false)
      if (i < 0) return undefined
      value = scanned
    } else if (c === OPEN_BRACKET || c === OPEN_BRACE) {
      if (depth >= maxDepth)
        return refuse(s, `The JSON body nests deeper than ${maxDepth} levels, the most idemkey fingerprints. Flatten the body.`)
      let frame = frames[depth]
      if (frame === undefined) {
        frame = { object: false, out: '', names: [], members: [], name: '', nameText: '' }
        frames[depth] = frame
      }
      i = skipSpace(s, i + 1, len)
      if (c === OPEN_BRACKET) {
        if (s.charCodeAt(i) !== CLOSE_BRACKET) {
          frame.object = false
          frame.out = '['
          depth++
          continue
        }
        value = '[]'
      } else {
        if (s.charCodeAt(i) !== CLOSE_BRACE) {
          frame.object = true
          frame.names.length = 0
          frame.members.length = 0
          i = scanName(s, i, len, frame)
          if (i < 0) return undefined
          depth++
          continue
        }
        value = '{}'
      }
      i++
    } else if (c === MINUS || (c >= ZERO && c <= NINE)) {
      i = scanNumber(s, i, len)
      if (i < 0) return undefined
      value = scanned
    } else if (c === 0x74 /* t */ && s.startsWith('true', i)) {
      value = 'true'
      i += 4
    } else if (c === 0x66 /* f */ && s.startsWith('false', i)) {
      value = 'false'
      i += 5
    } else if (c === 0x6e /* n */ && s.startsWith('null', i)) {
      value = 'null'
      i += 4
    } else {
      return undefined
    }

    // A value ends just before i: hand it to the open containers, closing those that end here.
    for (;;) {
      i = skipSpace(s, i, len)
      if (depth === 0) return i === len ? value : undefined
      const frame = frames[depth - 1]!
      const d = s.charCodeAt(i)
      if (frame.object) {
        frame.names.push(frame.name)
        frame.members.push(frame.nameText + ':' + value)
        if (d === COMMA) {
          i = scanName(s, skipSpace(s, i + 1, len), len, frame)
          if (i < 0) return undefined
          break
        }
        if (d !== CLOSE_BRACE) return undefined
        const closed = closeObject(frame.names, frame.members)
        if (closed === undefined) {
          return refuse(
            s,
            `The JSON body has the member ${quoted(duplicate)} twice in one object; idemkey cannot tell which one the server will use. Send each member once.`,
          )
        }
        value = closed
      } else {
        frame.out = frame.out.length === 1 ? frame.out + value : frame.out + ',' + value
        if (d === COMMA) {
          i = skipSpace(s, i + 1, len)
          break
        }
        if (d !== CLOSE_BRACKET) return undefined
        value = frame.out + ']'
      }
      i++
      depth--
    }
  }
}

/**
 * Throws BODY_INVALID for a body that is JSON; returns undefined for one that is not (a syntax error
 * after the point where the scan stopped wins: such a body is not JSON, whatever else it is).
 * JSON.parse is iterative in V8, so it checks a 30,000-deep body without a stack overflow.
 */
function refuse(s: string, message: string): undefined {
  try {
    JSON.parse(s)
  } catch {
    return undefined
  }
  throw new IdempotencyError('BODY_INVALID', message)
}

/** A member name for a message: quoted and escaped, cut short so a megabyte name does not become a megabyte message. */
function quoted(name: string): string {
  return name.length > 64 ? JSON.stringify(name.slice(0, 64)) + '…' : JSON.stringify(name)
}

function skipSpace(s: string, i: number, len: number): number {
  while (i < len) {
    const c = s.charCodeAt(i)
    if (c !== SPACE && c !== LF && c !== CR && c !== TAB) break
    i++
  }
  return i
}

/** Reads `"name" :` at i into the frame; returns where the value starts, or -1. */
function scanName(s: string, i: number, len: number, frame: Frame): number {
  if (s.charCodeAt(i) !== QUOTE) return -1
  i = skipSpace(s, scanString(s, i, len, true), len)
  if (i < 0 || s.charCodeAt(i) !== COLON) return -1
  frame.name = scannedName
  frame.nameText = scanned
  return skipSpace(s, i + 1, len)
}

/**
 * Sorts the members of one object by name and writes it; undefined (with `duplicate` set) when a name
 * comes twice. Insertion sort for the small objects of a typical body, which allocates nothing.
 */
function closeObject(names: string[], members: string[]): string | undefined {
  const n = names.length
  if (n === 1) return '{' + members[0] + '}'
  if (n <= 16) {
    for (let a = 1; a < n; a++) {
      const name = names[a]!
      const member = members[a]!
      let b = a - 1
      while (b >= 0 && names[b]! > name) {
        names[b + 1] = names[b]!
        members[b + 1] = members[b]!
        b--
      }
      if (b >= 0 && names[b] === name) {
        duplicate = name
        return undefined
      }
      names[b + 1] = name
      members[b + 1] = member
    }
    let out = '{' + members[0]
    for (let a = 1; a < n; a++) out += ',' + members[a]
    return out + '}'
  }
  const order = Array.from({ length: n }, (_, a) => a).sort((x, y) => (names[x]! < names[y]! ? -1 : names[x]! > names[y]! ? 1 : 0))
  let out = '{' + members[order[0]!]
  for (let a = 1; a < n; a++) {
    const name = names[order[a]!]!
    if (name === names[order[a - 1]!]) {
      duplicate = name
      return undefined
    }
    out += ',' + members[order[a]!]
  }
  return out + '}'
}

/**
 * Reads the string whose opening quote is at start; returns the index after its closing quote, or -1.
 * Sets `scanned` to its canonical text and, for a member name, `scannedName` to its decoded value.
 * A string with nothing to rewrite (no escape, no lone surrogate) is its own canonical text.
 */
function scanString(s: string, start: number, len: number, name: boolean): number {
  let j = start + 1
  for (;;) {
    if (j >= len) return -1
    const c = s.charCodeAt(j)
    if (c === QUOTE) break
    if (c === BACKSLASH) return scanEscapedString(s, start, j, len, name)
    if (c < SPACE) return -1
    if (c >= 0xd800 && c <= 0xdfff) {
      const next = s.charCodeAt(j + 1)
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        j += 2
        continue
      }
      // A lone surrogate (possible in a JS string, not in strict UTF-8): JSON.stringify escapes it.
      return scanEscapedString(s, start, j, len, name)
    }
    j++
  }
  scanned = s.slice(start, j + 1)
  if (name) scannedName = s.slice(start + 1, j)
  return j + 1
}

/** The slow path of scanString from j on: decodes the escapes, then writes the string as JSON.stringify does. */
function scanEscapedString(s: string, start: number, j: number, len: number, name: boolean): number {
  let decoded = ''
  let run = start + 1
  for (;;) {
    if (j >= len) return -1
    const c = s.charCodeAt(j)
    if (c === QUOTE) break
    if (c < SPACE) return -1
    if (c !== BACKSLASH) {
      j++
      continue
    }
    decoded += s.slice(run, j)
    switch (s.charCodeAt(j + 1)) {
      case QUOTE:
        decoded += '"'
        break
      case BACKSLASH:
        decoded += '\\'
        break
      case 0x2f:
        decoded += '/'
        break
      case 0x62:
        decoded += '\b'
        break
      case 0x66:
        decoded += '\f'
        break
      case 0x6e:
        decoded += '\n'
        break
      case 0x72:
        decoded += '\r'
        break
      case 0x74:
        decoded += '\t'
        break
      case 0x75: {
        const unit =
          (hexDigit(s.charCodeAt(j + 2)) << 12) |
          (hexDigit(s.charCodeAt(j + 3)) << 8) |
          (hexDigit(s.charCodeAt(j + 4)) << 4) |
          hexDigit(s.charCodeAt(j + 5))
        if (unit < 0) return -1
        decoded += String.fromCharCode(unit)
        j += 4
        break
      }
      default:
        return -1
    }
    j += 2
    run = j
  }
  decoded += s.slice(run, j)
  scanned = JSON.stringify(decoded)
  if (name) scannedName = decoded
  return j + 1
}

/** 0–15, or a negative number (which turns the whole `\u` unit negative) for a non-hex character. */
function hexDigit(c: number): number {
  if (c >= ZERO && c <= NINE) return c - ZERO
  const lower = c | 0x20
  if (lower >= 0x61 && lower <= 0x66) return lower - 0x61 + 10
  return -0x10000
}

function isDigit(c: number): boolean {
  return c >= ZERO && c <= NINE
}

/** Reads the number at i (RFC 8259 grammar); sets `scanned` to its canonical text; returns its end, or -1. */
function scanNumber(s: string, i: number, len: number): number {
  let j = i
  const negative = s.charCodeAt(j) === MINUS
  if (negative) j++
  const intStart = j
  const first = s.charCodeAt(j)
  if (first === ZERO) j++
  else if (first >= ONE && first <= NINE) {
    j++
    while (j < len && isDigit(s.charCodeAt(j))) j++
  } else return -1
  const intEnd = j
  let fracStart = j
  if (s.charCodeAt(j) === DOT) {
    j++
    fracStart = j
    while (j < len && isDigit(s.charCodeAt(j))) j++
    if (j === fracStart) return -1
  }
  const fracEnd = j
  const e = s.charCodeAt(j)
  if (e !== LOWER_E && e !== UPPER_E) {
    // Fast paths for the spellings that already are canonical: 42, -7, 12.5, 0.25.
    const intDigits = intEnd - intStart
    if (intDigits <= 21) {
      if (fracStart === fracEnd) {
        scanned = negative && first === ZERO ? '0' : s.slice(i, j)
        return j
      }
      if (s.charCodeAt(fracEnd - 1) !== ZERO) {
        if (first !== ZERO) {
          scanned = s.slice(i, j)
          return j
        }
        let z = fracStart
        while (s.charCodeAt(z) === ZERO) z++
        if (z - fracStart <= 5) {
          scanned = s.slice(i, j)
          return j
        }
      }
    }
    scanned = decimal(negative, s, intStart, intEnd, fracStart, fracEnd, false, '')
    return j
  }
  j++
  const sign = s.charCodeAt(j)
  if (sign === PLUS || sign === MINUS) j++
  let expStart = j
  while (j < len && isDigit(s.charCodeAt(j))) j++
  if (j === expStart) return -1
  while (expStart < j - 1 && s.charCodeAt(expStart) === ZERO) expStart++
  scanned = decimal(negative, s, intStart, intEnd, fracStart, fracEnd, sign === MINUS, s.slice(expStart, j))
  return j
}
