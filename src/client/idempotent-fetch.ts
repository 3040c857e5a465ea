import { type Duration, parseDuration, parsePositiveDuration } from '../core/duration.js'
import { longTimeout } from '../core/long-timer.js'
import { assertFunctions, assertKey, nameList } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'
import { IdempotentRequestError, readProblem, rejectionCode } from './errors.js'
import { methodOf, type ReplayableRequest, toReplayable } from './request.js'
import { abortableSleep, backoffMs, isRetryableStatus, retryAfterMs } from './retry.js'
import { uuidv7 } from './uuid.js'

/** Any function with fetch's shape: the platform's, undici's, or a test double. */
export type FetchLike = (input: string | URL | Request, init?: RequestInit) => Promise<Response>

/** An idempotent fetch: fetch's own signature, plus an optional `idempotencyKey` on init. */
export type IdempotentFetch = (input: string | URL | Request, init?: IdempotentRequestInit) => Promise<Response>

/** What a call did: the key it used, how many attempts it took, whether the server replayed. */
export interface IdempotencyInfo {
  /** The key every attempt of the call sent as `Idempotency-Key`. */
  key: string
  /** Attempts made, the first included. */
  attempts: number
  /** The server answered from its ledger (`Idempotent-Replayed: true`): the operation ran before. */
  replayed: boolean
}

/** Passed to {@link IdempotentFetchOptions.onRetry}, before the client waits and tries again. */
export interface RetryEvent {
  key: string
  method: string
  url: string
  /** The attempt that just failed (1-based). */
  attempt: number
  /** How long the client waits before the next attempt. */
  delayMs: number
  /** Since the call started, by the client's clock. */
  elapsedMs: number
  /** The retryable response (5xx, 408, 409, 425, 429), when the attempt got one. Its body is discarded once the hook returns. */
  response?: Response
  /** The network error or timeout, when the attempt got no response. */
  error?: unknown
}

/** Passed to {@link IdempotentFetchOptions.onResponse}, for every response an attempt receives. */
export interface ResponseEvent extends IdempotencyInfo {
  method: string
  url: string
  response: Response
  /** Since the call started, by the client's clock. */
  elapsedMs: number
}

/** Options of {@link createIdempotentFetch}. Durations take milliseconds or strings such as `250ms`, `30s`. */
export interface IdempotentFetchOptions {
  /** The fetch to wrap, looked up at each call when not given. @default globalThis.fetch */
  fetch?: FetchLike
  /** Methods that get a key and are retried; others pass straight through. @default ['POST', 'PATCH'] */
  methods?: string[]
  /** Makes the key of a new intent. @default uuidv7 */
  generateKey?: () => string
  /**
   * Attempts in all, the first included. The default lets the waits between attempts (full jitter below
   * caps of 0.5, 1, 2, 4, 8, then 10 s) outlast a server restart of several seconds, and leaves attempts
   * for the server's waits after it. @default 12
   */
  maxAttempts?: number
  /**
   * Total time of a call; no attempt starts, and no wait is begun, that would end after it. The default
   * outlasts a server that holds every attempt for its default wait (10 s) with a `Retry-After` of 2 s
   * between them. @default '60s'
   */
  maxElapsed?: Duration
  /** Cap of the first backoff; it doubles at each retry, and the wait is random below it (full jitter). @default '500ms' */
  baseDelay?: Duration
  /** Largest backoff cap. A server's `Retry-After` is honoured even when longer, within `maxElapsed`. @default '10s' */
  maxDelay?: Duration
  /**
   * An attempt with no response headers after this is aborted and retried with the same key. Keep it
   * longer than the server's wait for an in-flight duplicate (10 s by default), so an attempt hears the
   * server's answer instead of giving up on it. @default '15s'
   */
  attemptTimeout?: Duration
  /** Throw {@link IdempotentRequestError} on a final 4xx and when retries run out on a response; `false` returns that Response instead. @default true */
  throwOnError?: boolean
  /** Called before each retry (logs, metrics). A throw from it is ignored. */
  onRetry?: (event: RetryEvent) => void
  /** Called with each response an attempt receives, retried or not. A throw from it is ignored. */
  onResponse?: (event: ResponseEvent) => void
  /** Milliseconds since the epoch, for the total-time bound and HTTP-date `Retry-After`. @default Date.now */
  now?: () => number
  /** Waits between attempts; must reject when the signal aborts. @default a setTimeout that the signal cancels */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>
  /** A number in [0, 1), for the jitter. @default Math.random */
  random?: () => number
  /** Arms the attempt timeout: calls `callback` after `ms`, returns a function that disarms it. @default setTimeout */
  timer?: (ms: number, callback: () => void) => () => void
}

/** Per-call additions to `RequestInit`. */
export interface IdempotentRequestInit extends RequestInit {
  /**
   * Use this key instead of making one: a key derived with `deriveKey`/`forwardKey`, or one kept
   * across a page reload. Giving it also covers a method outside `methods`. An `Idempotency-Key`
   * header given by the caller is used the same way.
   */
  idempotencyKey?: string | undefined
}

/**
 * The defaults of {@link createIdempotentFetch}, chosen to agree with the server's (docs/client.md,
 * "Defaults that agree"): an attempt outlasts the server's wait for an in-flight duplicate (10 s); the
 * budget outlasts a first request that runs a whole lease (30 s) while the duplicate is held for the
 * wait, with the server's `Retry-After` (at most 2 s) between attempts; and against a server that is
 * down, the jittered waits of the attempts outlast a restart of several seconds (5 s in all but about
 * 2 calls in a million), then leave attempts for the lease a crashed holder left behind.
 */
export const IDEMPOTENT_FETCH_DEFAULTS = {
  maxAttempts: 12,
  maxElapsed: '60s',
  baseDelay: '500ms',
  maxDelay: '10s',
  attemptTimeout: '15s',
} as const satisfies Partial<IdempotentFetchOptions>

const infos = new WeakMap<Response, IdempotencyInfo>()

/**
 * The key, attempts and replay flag of a response returned by an idempotent fetch; `undefined` for a
 * response it did not make (an uncovered method passes straight through).
 *
 * @example
 * const response = await idempotentFetch(url, { method: 'POST', body })
 * idempotencyInfo(response) // { key: '0193…', attempts: 2, replayed: true }
 */
export function idempotencyInfo(response: Response): IdempotencyInfo | undefined {
  return infos.get(response)
}

/**
 * Makes a fetch that names each intent once and retries it safely (docs/client.md): one key per call, sent
 * as `Idempotency-Key` on every attempt; retries on network errors, attempt timeouts, 5xx, 408, 409,
 * 425 and 429 with exponential backoff, full jitter and `Retry-After`; never on 422 or another 4xx.
 *
 * Outcomes: a 2xx/3xx Response is returned. A final 4xx throws `REQUEST_REJECTED` (or
 * `FINGERPRINT_MISMATCH` for a key reused with another request). Running out of attempts or time
 * throws `RETRIES_EXHAUSTED`. With `throwOnError: false` both return the last Response instead (no
 * response at all still throws). An abort by the caller's signal rejects with the signal's reason.
 *
 * @example
 * const post = createIdempotentFetch({ maxAttempts: 4, maxElapsed: '10s' })
 * const response = await post('https://api.example.com/charges', { method: 'POST', body: JSON.stringify(charge) })
 * idempotencyInfo(response) // { key: '0193…', attempts: 2, replayed: true }
 */
export function createIdempotentFetch(options: IdempotentFetchOptions = {}): IdempotentFetch {
  assertFunctions('createIdempotentFetch()', {
    fetch: options.fetch,
    generateKey: options.generateKey,
    onRetry: options.onRetry,
    onResponse: options.onResponse,
    now: options.now,
    sleep: options.sleep,
    random: options.random,
    timer: options.timer,
  })
  const baseFetch: FetchLike = options.fetch ?? ((input, init) => globalThis.fetch(input, init))
  const methods = new Set((nameList(options.methods, 'methods', "['POST', 'PATCH']") ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()))
  const generateKey = options.generateKey ?? (() => uuidv7())
  const maxAttempts = options.maxAttempts ?? IDEMPOTENT_FETCH_DEFAULTS.maxAttempts
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1) {
    throw new IdempotencyError('INVALID_OPTION', `maxAttempts must be a whole number of at least 1 (1 means no retry), got ${maxAttempts}.`)
  }
  const maxElapsedMs = parsePositiveDuration(options.maxElapsed ?? IDEMPOTENT_FETCH_DEFAULTS.maxElapsed, 'maxElapsed')
  const baseDelayMs = parseDuration(options.baseDelay ?? IDEMPOTENT_FETCH_DEFAULTS.baseDelay, 'baseDelay')
  const maxDelayMs = parseDuration(options.maxDelay ?? IDEMPOTENT_FETCH_DEFAULTS.maxDelay, 'maxDelay')
  const attemptTimeoutMs = parsePositiveDuration(options.attemptTimeout ?? IDEMPOTENT_FETCH_DEFAULTS.attemptTimeout, 'attemptTimeout')
  const throwOnError = options.throwOnError ?? true
  const now = options.now ?? Date.now
  const sleep = options.sleep ?? abortableSleep
  const random = options.random ?? Math.random
  const timer = options.timer ?? realTimer

  return async function idempotentFetch(input: string | URL | Request, init: IdempotentRequestInit = {}): Promise<Response> {
    const { idempotencyKey, ...fetchInit } = init
    const method = methodOf(input, fetchInit)
    if (!methods.has(method) && idempotencyKey === undefined) return baseFetch(input, fetchInit)

    const signal = fetchInit.signal ?? (input instanceof Request ? input.signal : undefined)
    signal?.throwIfAborted()
    const request = await toReplayable(input, fetchInit, method)
    const key = idempotencyKey ?? request.headers.get('idempotency-key') ?? generateKey()
    assertKey(key)
    request.headers.set('idempotency-key', key)
    const url = String(request.url)
    const startedAt = now()

    for (let attempt = 1; ; attempt++) {
      signal?.throwIfAborted()
      const timeoutMs = Math.max(1, Math.min(attemptTimeoutMs, maxElapsedMs - (now() - startedAt)))
      const { response, error } = await sendOnce(baseFetch, request, signal, timeoutMs, timer)
      const elapsedMs = now() - startedAt
      if (response) {
        const info: IdempotencyInfo = { key, attempts: attempt, replayed: response.headers.get('idempotent-replayed') === 'true' }
        infos.set(response, info)
        quietly(() => options.onResponse?.({ ...info, method, url, response, elapsedMs }))
        if (response.status < 400) return response
        if (!isRetryableStatus(response.status)) {
          if (!throwOnError) return response
          throw await rejected(method, url, key, attempt, response)
        }
      }
      const hintedMs = response ? retryAfterMs(response.headers.get('retry-after'), now()) : undefined
      const delayMs = Math.max(hintedMs ?? 0, backoffMs(attempt, baseDelayMs, maxDelayMs, random))
      if (attempt >= maxAttempts || elapsedMs + delayMs >= maxElapsedMs) {
        if (response && !throwOnError) return response
        throw new IdempotentRequestError(
          'RETRIES_EXHAUSTED',
          `${method} ${url} did not succeed in ${attempt} attempt(s) over ${elapsedMs}ms (${describeLast(response, error, hintedMs)}). ` +
            `Retrying later with the same key (${key}) is safe: the server runs the operation at most once.`,
          {
            status: response?.status,
            problem: response ? await readProblem(response) : undefined,
            key,
            attempts: attempt,
            response,
            cause: error,
          },
        )
      }
      quietly(() => options.onRetry?.({ key, method, url, attempt, delayMs, elapsedMs, response, error }))
      // Free the connection: the body of a response that will be retried is never read.
      await response?.body?.cancel().catch(() => {})
      await sleep(delayMs, signal)
    }
  }
}

/**
 * One attempt. Its timeout covers the wait for the response headers only: once they arrive the timer
 * stops, so a slow download of the body the caller reads later is not cut off.
 */
async function sendOnce(
  baseFetch: FetchLike,
  request: ReplayableRequest,
  signal: AbortSignal | null | undefined,
  timeoutMs: number,
  timer: (ms: number, callback: () => void) => () => void,
): Promise<{ response?: Response; error?: unknown }> {
  const timeout = new AbortController()
  const disarm = timer(timeoutMs, () =>
    timeout.abort(new DOMException(`No response within the attempt timeout of ${timeoutMs}ms.`, 'TimeoutError')),
  )
  try {
    const attemptSignal = signal ? AbortSignal.any([signal, timeout.signal]) : timeout.signal
    return { response: await baseFetch(request.url, { ...request.init, signal: attemptSignal }) }
  } catch (error) {
    if (signal?.aborted) throw signal.reason
    return { error: timeout.signal.aborted ? timeout.signal.reason : error } // a network error or this attempt's timeout
  } finally {
    disarm()
  }
}

function realTimer(ms: number, callback: () => void): () => void {
  return longTimeout(callback, ms)
}

/** The error for a final 4xx: a key reused with another request, or any other refusal. */
async function rejected(method: string, url: string, key: string, attempts: number, response: Response): Promise<IdempotentRequestError> {
  const problem = await readProblem(response)
  const code = rejectionCode(response.status, problem)
  const why =
    code === 'FINGERPRINT_MISMATCH'
      ? `The key ${key} was used before with another request: a changed request is a new intent and needs a new key.`
      : 'It was not retried, since the same request would be refused the same way: fix the request (or its credentials) first.'
  return new IdempotentRequestError(
    code,
    `${method} ${url} was refused with ${response.status}${problem?.detail ? `: ${problem.detail}` : ''}. ${why}`,
    { status: response.status, problem, key, attempts, response },
  )
}

function describeLast(response: Response | undefined, error: unknown, hintedMs: number | undefined): string {
  if (!response) return `last error: ${error instanceof Error ? error.message : String(error)}`
  return `last status ${response.status}${hintedMs === undefined ? '' : `, Retry-After ${Math.ceil(hintedMs / 1_000)}s`}`
}

/** Hooks are for logs and metrics: a broken one must not break the call. */
function quietly(hook: () => void): void {
  try {
    hook()
  } catch {
    // ignored on purpose
  }
}

/**
 * The idempotent fetch with default options (POST and PATCH covered, 12 attempts, 60 s in all).
 *
 * @example
 * const response = await idempotentFetch('https://api.example.com/orders', { method: 'POST', body })
 */
export const idempotentFetch: IdempotentFetch = createIdempotentFetch()
