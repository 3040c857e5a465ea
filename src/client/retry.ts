import { systemClock } from '../core/clock.js'

/** When to retry, and how long to wait: the policy of docs/client.md, kept apart from the fetch wrapper. */

/** Statuses below 500 worth retrying with the same key: the server may succeed next time. */
export const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([408, 409, 425, 429])

/**
 * Whether a status is retried with the same key: every 5xx, 408 (timeout), 409 (the key is in flight),
 * 425 (too early, RFC 8470) and 429 (rate limited). Never 422 or another 4xx: the same request would
 * fail the same way.
 *
 * @example isRetryableStatus(503) // true
 * @example isRetryableStatus(422) // false
 */
export function isRetryableStatus(status: number): boolean {
  return (status >= 500 && status <= 599) || RETRYABLE_STATUSES.has(status)
}

/**
 * Exponential backoff with full jitter: a random delay between 0 and `min(maxMs, baseMs * 2^(attempt-1))`,
 * so that many clients retrying at once spread out instead of arriving together.
 *
 * @example backoffMs(3, 100, 10_000, Math.random) // somewhere in [0, 400)
 */
export function backoffMs(attempt: number, baseMs: number, maxMs: number, random: () => number): number {
  const cap = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt - 1))
  return Math.floor(random() * cap)
}

/**
 * Reads `Retry-After` (delay-seconds or an HTTP-date, RFC 9110 §10.2.3) as milliseconds from `nowMs`;
 * `undefined` when absent or unreadable. A date in the past reads as 0.
 *
 * @example retryAfterMs('2', Date.now()) // 2000
 * @example retryAfterMs('Wed, 21 Oct 2015 07:28:10 GMT', Date.parse('Wed, 21 Oct 2015 07:28:00 GMT')) // 10000
 */
export function retryAfterMs(value: string | null | undefined, nowMs: number): number | undefined {
  if (value === null || value === undefined) return undefined
  const text = value.trim()
  if (/^\d+$/.test(text)) return Number(text) * 1_000
  // Only dates that look like dates: Date.parse also accepts bare numbers such as "1.5" or "-1".
  if (!/[a-z]/i.test(text)) return undefined
  const date = Date.parse(text)
  return Number.isNaN(date) ? undefined : Math.max(0, date - nowMs)
}

/**
 * The default sleep: a timer that an `AbortSignal` cancels (rejecting with the signal's reason).
 *
 * @example await abortableSleep(100, controller.signal)
 */
export function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return systemClock.sleep(ms, signal)
}
