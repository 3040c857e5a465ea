import { createHmac } from 'node:crypto'
import { IdempotencyError } from '../errors.js'
import { assertKey } from './validate.js'

const PREFIX = 'dk1_'
const DOMAIN = 'idemkey/derive-key/v1'

/**
 * The key of a downstream call, derived from the root intent's key and a step name, so a retry at
 * the edge lands on the same downstream keys (docs/client.md).
 *
 * Construction: `dk1_` + base64url(HMAC-SHA256(key = rootKey, message = "idemkey/derive-key/v1" NUL step)),
 * 47 characters. HMAC makes it collision-resistant across (root, step) pairs and one-way: a derived
 * key does not reveal the root key.
 *
 * @example
 * await fetch(paymentsUrl, { method: 'POST', headers: { 'Idempotency-Key': deriveKey(rootKey, 'charge') } })
 */
export function deriveKey(rootKey: string, step: string): string {
  assertKey(rootKey)
  if (typeof step !== 'string' || step.length === 0) {
    throw new IdempotencyError('INVALID_ARGUMENT', `deriveKey needs a non-empty step name (e.g. "charge"), got ${JSON.stringify(step)}.`)
  }
  return PREFIX + createHmac('sha256', rootKey).update(`${DOMAIN}\0${step}`).digest('base64url')
}
