import { assertKey } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'

/** The header the key travels in by default (IETF draft "The Idempotency-Key HTTP Header Field"), lower-cased. */
export const KEY_HEADER = 'idempotency-key'

/** How the default header is spelled in messages. */
export const KEY_HEADER_NAME = 'Idempotency-Key'

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/

/** Whether `name` can be an HTTP header's name (an RFC 9110 token): one that requests can carry. */
export function isHeaderName(name: string): boolean {
  return TOKEN.test(name)
}

/**
 * Checks a configured key header name (an RFC 9110 token, e.g. `X-Idempotency-Key`) and returns it as
 * given, for messages, and lower-cased, for look-ups in Node's header records.
 */
export function keyHeaderName(name: string | undefined): { name: string; lower: string } {
  if (name === undefined) return { name: KEY_HEADER_NAME, lower: KEY_HEADER }
  if (typeof name !== 'string' || !isHeaderName(name)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `keyHeader must be an HTTP header name such as 'X-Idempotency-Key'; got ${JSON.stringify(name)}.`,
    )
  }
  return { name, lower: name.toLowerCase() }
}

/**
 * Reads the key from the header value: a bare token (`abc-123`) or an RFC 8941 sf-string
 * (`"abc-123"`, with `\"` and `\\` escapes). Returns `undefined` when the header is absent.
 * Throws `KEY_INVALID` when it is given twice, empty, too long, or has characters outside 0x20–0x7E;
 * the message names the header as `headerName`.
 *
 * @example
 * parseKeyHeader('"order-42"') // 'order-42'
 * parseKeyHeader(['a', 'b'])   // throws IdempotencyError KEY_INVALID
 */
export function parseKeyHeader(value: string | string[] | undefined, headerName = KEY_HEADER_NAME): string | undefined {
  if (value === undefined) return undefined
  if (Array.isArray(value)) {
    if (value.length === 1) return parseKeyHeader(value[0], headerName)
    throw new IdempotencyError('KEY_INVALID', `The ${headerName} header was given more than once; send it exactly once.`)
  }
  const text = value.trim()
  const key = text.startsWith('"') ? parseSfString(text, headerName) : text
  assertKey(key)
  return key
}

function parseSfString(text: string, headerName: string): string {
  const invalid = (reason: string) =>
    new IdempotencyError('KEY_INVALID', `The ${headerName} header is not a valid RFC 8941 string: ${reason}.`)
  let out = ''
  for (let i = 1; i < text.length; i++) {
    const ch = text[i] as string
    if (ch === '\\') {
      const next = text[++i]
      if (next !== '"' && next !== '\\') throw invalid('a backslash in a quoted key escapes only " or \\')
      out += next
    } else if (ch === '"') {
      if (i !== text.length - 1) throw invalid('text after the closing quote (a list of keys is not allowed)')
      return out
    } else {
      const code = ch.charCodeAt(0)
      if (code < 0x20 || code > 0x7e) throw invalid('a character outside 0x20-0x7E')
      out += ch
    }
  }
  throw invalid('no closing quote')
}
