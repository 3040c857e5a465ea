/**
 * The canonical text of an already parsed JSON value (canonical-json-text.ts reads it from bytes).
 */
import { types } from 'node:util'
import { IdempotencyError } from '../errors.js'
import { checkMaxDepth, MAX_JSON_DEPTH } from './canonical-json-text.js'
import { bigintText } from './exact-decimal.js'

/** One open array or object of canonicalJson. */
interface ValueFrame {
  array: ArrayLike<unknown> | undefined
  object: Record<string, unknown> | undefined
  /** Objects: own enumerable names, sorted. */
  names: string[]
  /** The next element or member to visit. */
  index: number
  out: string
}

const NO_NAMES: string[] = []

/**
 * The canonical text of an already parsed JSON value: the same text `canonicalJsonText` writes
 * for the JSON text of that value, so a body fingerprints the same whether the framework parsed it
 * (losslessly) or idemkey read its bytes. RFC 8785 in layout, extended to numbers no double holds.
 *
 * Values are read as `JSON.stringify` reads them (`toJSON` first, so a Date is its ISO string and a
 * Buffer its `{type, data}`; `undefined`, functions and symbols are dropped from objects and `null`
 * in arrays), with two changes that keep different values apart: a `bigint` is the number it is
 * (`9007199254740993n` is `9007199254740993`, not an error), and an object whose contents JSON would
 * silently drop (Map, Set, Promise, RegExp, Error, typed arrays and their kin) is refused rather than
 * written as `{}`, which would give every Map one fingerprint.
 *
 * @param value the parsed payload.
 * @param maxDepth the deepest nesting accepted (default {@link MAX_JSON_DEPTH}).
 * @throws IdempotencyError `INVALID_ARGUMENT` for what JSON has no text for: a non-finite number, a
 *   top-level `undefined` (or function, symbol), a value of the kinds above, or nesting deeper than
 *   `maxDepth` (a cycle ends there too).
 *
 * @example
 * canonicalJson({ currency: 'eur', amount: 12_000n, at: new Date(0) })
 * // '{"amount":12000,"at":"1970-01-01T00:00:00.000Z","currency":"eur"}'
 */
export function canonicalJson(value: unknown, maxDepth: number = MAX_JSON_DEPTH): string {
  checkMaxDepth(maxDepth)
  if (maxDepth > 0) {
    const flat = flatObjectText(value)
    if (flat !== undefined) return flat
  }
  const frames: ValueFrame[] = []
  let depth = 0
  let v = value
  let key: string | number = ''
  for (;;) {
    // Resolve v to its text, or open it as a container.
    let text: string | undefined
    let opened = false
    if (typeof v === 'object' && v !== null) {
      const toJSON = (v as { toJSON?: unknown }).toJSON
      if (typeof toJSON === 'function') v = toJSON.call(v, String(key))
    }
    switch (typeof v) {
      case 'string':
        text = JSON.stringify(v)
        break
      case 'number':
        text = numberText(v)
        break
      case 'boolean':
        text = v ? 'true' : 'false'
        break
      case 'bigint':
        text = bigintText(v)
        break
      case 'object': {
        if (v === null) {
          text = 'null'
          break
        }
        if (Array.isArray(v)) {
          if (depth >= maxDepth) throw tooDeep(maxDepth)
          frames[depth++] = { array: v, object: undefined, names: NO_NAMES, index: 0, out: '[' }
          opened = true
          break
        }
        const proto = Object.getPrototypeOf(v)
        if (proto !== Object.prototype && proto !== null) {
          const boxed = unboxed(v)
          if (boxed !== undefined) {
            text = boxed
            break
          }
        }
        if (depth >= maxDepth) throw tooDeep(maxDepth)
        const object = v as Record<string, unknown>
        frames[depth++] = { array: undefined, object, names: Object.keys(object).sort(), index: 0, out: '{' }
        opened = true
        break
      }
      default:
        // undefined, functions and symbols: dropped from objects, null in arrays, as JSON.stringify does.
        text = undefined
    }

    // Hand the text to the open container and find the next value to resolve, closing finished containers.
    for (;;) {
      if (opened) opened = false
      else {
        if (depth === 0) {
          if (text === undefined) {
            throw new IdempotencyError(
              'INVALID_ARGUMENT',
              `Cannot fingerprint ${describe(value)} as JSON: JSON has no text for it. Pass the payload itself, or null for none.`,
            )
          }
          return text
        }
        const parent = frames[depth - 1]!
        if (parent.array !== undefined) parent.out += (parent.index > 1 ? ',' : '') + (text ?? 'null')
        else if (text !== undefined)
          parent.out += (parent.out.length > 1 ? ',' : '') + JSON.stringify(parent.names[parent.index - 1]) + ':' + text
      }
      const frame = frames[depth - 1]!
      if (frame.array !== undefined) {
        if (frame.index < frame.array.length) {
          key = frame.index
          v = frame.array[frame.index++]
          break
        }
        text = frame.out + ']'
      } else {
        const names = frame.names
        const object = frame.object!
        let found = false
        while (frame.index < names.length) {
          const name = names[frame.index++]!
          const item = object[name]
          if (item !== undefined && typeof item !== 'function' && typeof item !== 'symbol') {
            key = name
            v = item
            found = true
            break
          }
        }
        if (found) break
        text = frame.out + '}'
      }
      depth--
    }
  }
}

/**
 * The common payload, a plain object of strings, finite numbers, booleans and nulls, written in one
 * pass; `undefined` for anything else (nested values, bigints, `toJSON`, other prototypes), which the
 * general walk above handles. Its text is the general walk's, byte for byte.
 */
function flatObjectText(value: unknown): string | undefined {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return undefined
  const proto = Object.getPrototypeOf(value)
  if (proto !== Object.prototype && proto !== null) return undefined
  const object = value as Record<string, unknown>
  if (typeof object.toJSON === 'function') return undefined
  const names = Object.keys(object).sort()
  let out = '{'
  for (let i = 0; i < names.length; i++) {
    const name = names[i] as string
    const item = object[name]
    let text: string
    switch (typeof item) {
      case 'string':
        text = JSON.stringify(item)
        break
      case 'number':
        if (!Number.isFinite(item)) return undefined
        text = '' + item
        break
      case 'boolean':
        text = item ? 'true' : 'false'
        break
      case 'undefined':
      case 'function':
      case 'symbol':
        continue
      default:
        if (item !== null) return undefined
        text = 'null'
    }
    out += (out.length > 1 ? ',' : '') + JSON.stringify(name) + ':' + text
  }
  return out + '}'
}

function numberText(value: number): string {
  if (Number.isFinite(value)) return '' + value // String(-0) is '0', like JSON.stringify
  throw new IdempotencyError(
    'INVALID_ARGUMENT',
    `Cannot fingerprint ${value}: JSON has no such number. If a body parser turned a huge number such as 1e400 into ${value}, give idemkey the raw body instead of the parsed one.`,
  )
}

function tooDeep(maxDepth: number): IdempotencyError {
  return new IdempotencyError(
    'INVALID_ARGUMENT',
    `Cannot fingerprint a value nested deeper than ${maxDepth} levels, or circular (it contains itself). Flatten the payload, or break the cycle.`,
  )
}

/**
 * The text of a boxed primitive (`new Number(1)`, `Object(1n)`), which JSON.stringify unboxes; throws for
 * an object whose contents live where JSON cannot see them; undefined for an ordinary object.
 */
function unboxed(v: object): string | undefined {
  if (types.isBoxedPrimitive(v) && !types.isSymbolObject(v)) {
    const primitive = v.valueOf() as string | number | boolean | bigint
    switch (typeof primitive) {
      case 'string':
        return JSON.stringify(primitive)
      case 'number':
        return numberText(primitive)
      case 'bigint':
        return bigintText(primitive)
      default:
        return primitive ? 'true' : 'false'
    }
  }
  if (
    types.isMap(v) ||
    types.isSet(v) ||
    types.isWeakMap(v) ||
    types.isWeakSet(v) ||
    types.isPromise(v) ||
    types.isRegExp(v) ||
    types.isNativeError(v) ||
    types.isAnyArrayBuffer(v) ||
    types.isArrayBufferView(v) ||
    types.isSymbolObject(v) ||
    types.isMapIterator(v) ||
    types.isSetIterator(v) ||
    types.isGeneratorObject(v) ||
    types.isKeyObject(v) ||
    types.isCryptoKey(v) ||
    v instanceof WeakRef
  ) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `Cannot fingerprint ${describe(v)} as JSON: JSON would drop its contents. Convert it to plain JSON first (an object, array, string or number).`,
    )
  }
  return undefined
}

/** 'a Map', 'an Error', 'undefined', 'a function': for messages. */
function describe(value: unknown): string {
  if (value === undefined || value === null) return String(value)
  if (typeof value !== 'object') return `a ${typeof value}`
  const name = Object.prototype.toString.call(value).slice(8, -1)
  return `${/^[AEIO]/.test(name) ? 'an' : 'a'} ${name}`
}
