import { IdempotencyError, type IdempotencyErrorCode } from '../errors.js'

/** An RFC 9457 problem document, as the server sent it. idemkey's own problems also carry `code`. */
export interface ProblemDetails {
  type?: string
  title?: string
  status?: number
  detail?: string
  /** idemkey servers add the error code, e.g. `FINGERPRINT_MISMATCH`. */
  code?: string
  [extension: string]: unknown
}

/** What {@link IdempotentRequestError} carries besides its message. */
export interface IdempotentRequestErrorDetails {
  /** HTTP status of the last response; `undefined` when the last attempt got no response. */
  status?: number
  /** The last response's problem+json body, parsed, when it had one. */
  problem?: ProblemDetails
  /** The idempotency key every attempt of the call sent. */
  key: string
  /** Attempts made, the first included. */
  attempts: number
  /** The last response (its body unread), when there was one. */
  response?: Response
  /** The last network error or timeout, when the last attempt got no response. */
  cause?: unknown
}

/**
 * Thrown by an idempotent fetch when the server refused the request for good, or when retries ran out.
 *
 * - `REQUEST_REJECTED`: a final 4xx (400, 401, 403, 404, 422 for another reason, ...); not retried.
 * - `FINGERPRINT_MISMATCH`: a 422 whose problem says the key was used before with another request:
 *   the caller reused a key for a changed intent, and needs a new key.
 * - `RETRIES_EXHAUSTED`: network errors, timeouts or retryable statuses until `maxAttempts` or
 *   `maxElapsed` ran out. Retrying later with the same `key` is safe.
 *
 * @example
 * try { await post(url, init) }
 * catch (err) { if (err instanceof IdempotentRequestError && err.code === 'RETRIES_EXHAUSTED') queueForLater(err.key) }
 */
export class IdempotentRequestError extends IdempotencyError {
  readonly status: number | undefined
  readonly problem: ProblemDetails | undefined
  readonly key: string
  readonly attempts: number
  readonly response: Response | undefined

  constructor(code: IdempotencyErrorCode, message: string, details: IdempotentRequestErrorDetails) {
    super(code, message, details.cause === undefined ? undefined : { cause: details.cause })
    this.status = details.status
    this.problem = details.problem
    this.key = details.key
    this.attempts = details.attempts
    this.response = details.response
  }
}

/**
 * Reads a problem+json (or any JSON object) body without consuming the response the caller gets.
 *
 * @example const problem = await readProblem(response) // { type, title, status, detail }
 */
export async function readProblem(response: Response): Promise<ProblemDetails | undefined> {
  const type = response.headers.get('content-type') ?? ''
  if (!/[/+]json\b/i.test(type)) return undefined
  try {
    const parsed = (await response.clone().json()) as unknown
    return typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) ? (parsed as ProblemDetails) : undefined
  } catch {
    return undefined
  }
}

/** A 422 is a key reuse only when the server says so; a plain validation 422 is just a rejection. */
export function rejectionCode(status: number, problem: ProblemDetails | undefined): IdempotencyErrorCode {
  if (status !== 422) return 'REQUEST_REJECTED'
  const saysMismatch = problem?.code === 'FINGERPRINT_MISMATCH' || /fingerprint-mismatch$/.test(String(problem?.type ?? ''))
  return saysMismatch ? 'FINGERPRINT_MISMATCH' : 'REQUEST_REJECTED'
}
