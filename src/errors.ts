/**
 * Every error idemkey raises is an {@link IdempotencyError} with a machine-readable `code`.
 * Expected ledger outcomes (replay, mismatch, in progress) are *results*, not errors; these are
 * for bad input, a lost lease and an unreachable store.
 */

/** What went wrong, as a stable string you can switch on. */
export type IdempotencyErrorCode =
  | 'KEY_INVALID'
  | 'KEY_MISSING'
  | 'SCOPE_INVALID'
  | 'FINGERPRINT_INVALID'
  | 'FINGERPRINT_MISMATCH'
  | 'IN_PROGRESS'
  | 'FENCED_OUT'
  | 'STORE_UNAVAILABLE'
  | 'STORE_SCHEMA'
  | 'BODY_TOO_LARGE'
  /** A request body that cannot be fingerprinted losslessly: duplicate JSON member names, nesting too deep. */
  | 'BODY_INVALID'
  | 'INVALID_OPTION'
  | 'INVALID_ARGUMENT'
  /** The server refused the request with a final 4xx (client side). */
  | 'REQUEST_REJECTED'
  /** The client gave up (attempts or total time ran out on transient failures), or a consumer helper gave up on a message after `maxAttempts` failures. */
  | 'RETRIES_EXHAUSTED'

/** The HTTP status the HTTP layer answers for each code. */
export const HTTP_STATUS_BY_CODE: Readonly<Record<IdempotencyErrorCode, number>> = {
  KEY_INVALID: 400,
  KEY_MISSING: 400,
  SCOPE_INVALID: 400,
  FINGERPRINT_INVALID: 500,
  FINGERPRINT_MISMATCH: 422,
  IN_PROGRESS: 409,
  FENCED_OUT: 409,
  STORE_UNAVAILABLE: 503,
  STORE_SCHEMA: 503,
  BODY_TOO_LARGE: 413,
  BODY_INVALID: 400,
  INVALID_OPTION: 500,
  INVALID_ARGUMENT: 500,
  REQUEST_REJECTED: 400,
  RETRIES_EXHAUSTED: 503,
}

/**
 * The one error class of idemkey.
 *
 * @example
 * try { await ledger.run(intent, fn) }
 * catch (err) { if (isIdempotencyError(err) && err.code === 'STORE_UNAVAILABLE') retryLater() }
 */
export class IdempotencyError extends Error {
  override name = 'IdempotencyError' as const
  readonly code: IdempotencyErrorCode

  constructor(code: IdempotencyErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options)
    this.code = code
  }

  /** The HTTP status this error maps to (see {@link HTTP_STATUS_BY_CODE}). */
  get httpStatus(): number {
    return HTTP_STATUS_BY_CODE[this.code]
  }
}

/** Another holder owns the record; carries when its lease ends. */
export class InProgressError extends IdempotencyError {
  readonly lockedUntilMs: number
  readonly retryAfterMs: number
  constructor(message: string, lockedUntilMs: number, retryAfterMs: number) {
    super('IN_PROGRESS', message)
    this.lockedUntilMs = lockedUntilMs
    this.retryAfterMs = retryAfterMs
  }
}

/**
 * True for any idemkey error, also one thrown by another loaded copy of the package
 * (two versions in one node_modules tree), which `instanceof` would miss.
 */
export function isIdempotencyError(value: unknown): value is IdempotencyError {
  if (value instanceof IdempotencyError) return true
  return (
    typeof value === 'object' &&
    value !== null &&
    (value as { name?: unknown }).name === 'IdempotencyError' &&
    typeof (value as { code?: unknown }).code === 'string'
  )
}

/**
 * Wraps a driver's error as `STORE_UNAVAILABLE`, keeping it as `cause`; `reason` says what happened when
 * the driver's own message does not. Idempotency errors pass through.
 */
export function storeUnavailable(storeName: string, operation: string, cause: unknown, reason?: string): IdempotencyError {
  if (isIdempotencyError(cause)) return cause
  reason ??= cause instanceof Error ? cause.message : String(cause)
  return new IdempotencyError(
    'STORE_UNAVAILABLE',
    `${storeName}: ${operation} failed: ${reason}. Check that the store is running and reachable; the operation was not recorded, so it is safe to retry.`,
    { cause },
  )
}
