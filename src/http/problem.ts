import { HTTP_STATUS_BY_CODE, type IdempotencyErrorCode } from '../errors.js'
import { KEY_HEADER_NAME } from './key-header.js'
import type { HttpResponseLike } from './types.js'

/** The default base of problem `type` URIs: each error has a section in docs/errors.md. */
export const DEFAULT_PROBLEM_BASE = 'https://idemkey.dev/docs/errors#'

const TITLES: Partial<Record<IdempotencyErrorCode, string>> = {
  KEY_INVALID: 'Invalid Idempotency-Key',
  KEY_MISSING: 'Idempotency-Key required',
  FINGERPRINT_MISMATCH: 'Idempotency-Key reused with another request',
  IN_PROGRESS: 'Request with this Idempotency-Key is in progress',
  STORE_UNAVAILABLE: 'Idempotency store unavailable',
  STORE_SCHEMA: 'Idempotency store not set up',
  BODY_TOO_LARGE: 'Request body too large',
  BODY_INVALID: 'Request body cannot be fingerprinted',
  INVALID_OPTION: 'Idempotency layer misconfigured',
  SCOPE_INVALID: 'Invalid idempotency scope',
  FENCED_OUT: 'Request superseded by another attempt',
}

const encoder = new TextEncoder()

/**
 * An RFC 9457 problem+json response for an error the layer itself answers. It never carries a stored
 * body of another request. `keyHeader` is how the title names the key's header, when it is not
 * `Idempotency-Key`.
 *
 * @example
 * problem('IN_PROGRESS', 'Still running; retry in 2 s.', DEFAULT_PROBLEM_BASE, { 'retry-after': '2' })
 */
export function problem(
  code: IdempotencyErrorCode,
  detail: string,
  base = DEFAULT_PROBLEM_BASE,
  extraHeaders: Record<string, string> = {},
  keyHeader = KEY_HEADER_NAME,
): HttpResponseLike {
  const status = HTTP_STATUS_BY_CODE[code] ?? 500
  const title = TITLES[code] ?? code
  const body = {
    type: `${base}${code.toLowerCase().replaceAll('_', '-')}`,
    title: keyHeader === KEY_HEADER_NAME ? title : title.replace(KEY_HEADER_NAME, keyHeader),
    status,
    detail,
    code,
  }
  return {
    status,
    headers: { 'content-type': 'application/problem+json', 'cache-control': 'no-store', ...extraHeaders },
    body: encoder.encode(JSON.stringify(body)),
  }
}
