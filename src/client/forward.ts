import { deriveKey } from '../core/derive-key.js'
import { parseKeyHeader } from '../protocol/key-header.js'

/** Where an incoming request's headers can come from: a fetch `Request`, `Headers`, Node's `req.headers`, or anything with `headers`. */
export type IncomingHeaders =
  | Request
  | Headers
  | Record<string, string | string[] | undefined>
  | { headers: Headers | Record<string, string | string[] | undefined> }

/**
 * The root key of an incoming request: its `Idempotency-Key`, bare or as an RFC 8941 string.
 * `undefined` when it has none; throws `KEY_INVALID` when it is malformed (given twice, empty, ...).
 *
 * @example incomingKey(req.headers) // 'f3a1…' or undefined
 */
export function incomingKey(incoming: IncomingHeaders): string | undefined {
  const headers = 'headers' in incoming && typeof incoming.headers === 'object' && incoming.headers !== null ? incoming.headers : incoming
  if (headers instanceof Headers) return parseKeyHeader(headers.get('idempotency-key') ?? undefined)
  const record = headers as Record<string, string | string[] | undefined>
  const name = Object.keys(record).find((header) => header.toLowerCase() === 'idempotency-key')
  return parseKeyHeader(name === undefined ? undefined : record[name])
}

/**
 * The downstream key for `step`, derived from the `Idempotency-Key` of an incoming request with
 * {@link deriveKey}, so that a retry at the edge reaches the same downstream keys. `undefined` when
 * the request had no key (then let the downstream call make its own).
 *
 * @example
 * app.post('/orders', async (req, res) => {
 *   const charged = await idempotentFetch(paymentsUrl, { method: 'POST', body, idempotencyKey: forwardKey(req, 'charge') })
 * })
 */
export function forwardKey(incoming: IncomingHeaders, step: string): string | undefined {
  const root = incomingKey(incoming)
  return root === undefined ? undefined : deriveKey(root, step)
}
