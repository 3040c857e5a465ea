import { assertKey } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'

/** The header the key travels in (IETF draft "The Idempotency-Key HTTP Header Field"). */
export const KEY_HEADER = 'idempotency-key'

/**
 * Reads the key from the header value: a bare token (`abc-123`) or an RFC 8941 sf-string
 * (`"abc-123"`, with `\"` and `\\` escapes). Returns `undefined` when the header is absent.
 * Throws `KEY_INVALID` when it is given twice, empty, too long, or has characters outside 0x20–0x7E.
 *
 * @example
 * parseKeyHeader('"order-42"') // 'order-42'
 * parseKeyHeader(['a', 'b'])   // throws IdempotencyError KEY_INVALID
 */
export function parseKeyHeader(value: string | string[] | undefined): string | undefined {
  if (value === undefined) return undefined
  if (Array.isArray(value)) {
    if (value.length === 1) return parseKeyHeader(value[0])
    throw new IdempotencyError('KEY_INVALID', 'The Idempotency-Key header was given more than once; send it exactly once.')
  }
  const text = value.trim()
  const key = text.startsWith('"') ? parseSfString(text) : text
  assertKey(key)
  return key
}

function parseSfString(text: string): string {
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

function invalid(reason: string): IdempotencyError {
  return new IdempotencyError('KEY_INVALID', `The Idempotency-Key header is not a valid RFC 8941 string: ${reason}.`)
}
