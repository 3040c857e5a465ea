/**
 * `idemkey/client`: the client's half of the contract (docs/client.md). One key per intent, retries with
 * that key, and keys for downstream calls derived from it. No dependency beyond the platform.
 */
export { deriveKey } from '../core/derive-key.js'
export { IdempotentRequestError, type IdempotentRequestErrorDetails, type ProblemDetails, readProblem } from './errors.js'
export { forwardKey, type IncomingHeaders, incomingKey } from './forward.js'
export {
  createIdempotentFetch,
  type FetchLike,
  IDEMPOTENT_FETCH_DEFAULTS,
  type IdempotencyInfo,
  type IdempotentFetch,
  type IdempotentFetchOptions,
  type IdempotentRequestInit,
  idempotencyInfo,
  idempotentFetch,
  type ResponseEvent,
  type RetryEvent,
} from './idempotent-fetch.js'
export { abortableSleep, backoffMs, isRetryableStatus, RETRYABLE_STATUSES, retryAfterMs } from './retry.js'
export { createUuidv7Generator, type Uuidv7Generator, uuidv7 } from './uuid.js'
