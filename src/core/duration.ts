import { IdempotencyError } from '../errors.js'
import { MAX_TIMER_MS } from './long-timer.js'

/** A duration in milliseconds, or a string such as `250ms`, `30s`, `5m`, `24h`, `7d`, `1h30m`. */
export type Duration = number | string

/**
 * The longest duration idemkey takes: 36,500 days (about 100 years). Every store keeps an expiry of now
 * plus this as an integer of milliseconds; a longer one (a TTL of 1e20 ms) fails only later, in a
 * store, when the outcome is recorded.
 */
export const MAX_DURATION_MS = 36_500 * 86_400_000

const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }
const PART = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/gy

/**
 * Parses a human duration once, at the edge, into integer milliseconds.
 *
 * @example parseDuration('30s') // 30000
 * @example parseDuration(1500)  // 1500
 */
export function parseDuration(input: Duration, name = 'duration'): number {
  if (typeof input === 'number') {
    if (!Number.isFinite(input) || input < 0) {
      throw new IdempotencyError('INVALID_OPTION', `${name} must be a non-negative number of milliseconds, got ${input}.`)
    }
    return atMostMax(Math.round(input), name, input)
  }
  if (typeof input !== 'string') {
    throw new IdempotencyError('INVALID_OPTION', `${name} must be milliseconds or a string like "30s", got ${typeof input}.`)
  }
  const text = input.trim()
  if (/^\d+$/.test(text)) return atMostMax(Number(text), name, input)
  let total = 0
  let consumed = 0
  PART.lastIndex = 0
  for (let match = PART.exec(text); match !== null; match = PART.exec(text)) {
    total += Number(match[1]) * (UNIT_MS[match[2] as string] as number)
    consumed = PART.lastIndex
  }
  if (text.length === 0 || consumed !== text.length) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${name} "${input}" is not a duration: use milliseconds or a number with a unit (ms, s, m, h, d), e.g. "30s", "24h", "1h30m".`,
    )
  }
  return atMostMax(Math.round(total), name, input)
}

/**
 * A timeout armed as one Node timer by a driver or server (pg's `query_timeout`, the MySQL and DynamoDB
 * stores' request bounds, the proxy's timeouts): Node cuts a delay past 2^31 - 1 ms (24.8 days) to 1 ms,
 * which would time out everything at once, so such a value is refused here. 0 passes.
 */
export function parseTimerDuration(input: Duration, name: string): number {
  const ms = parseDuration(input, name)
  if (ms > MAX_TIMER_MS) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${name} ${shown(input)} is longer than 24.8 days (2147483647 ms), the longest delay a Node timer keeps: it would fire after 1 ms. Give a shorter one.`,
    )
  }
  return ms
}

function atMostMax(ms: number, name: string, input: Duration): number {
  if (ms > MAX_DURATION_MS) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${name} ${shown(input)} is longer than the longest duration idemkey keeps, 36500d (about 100 years).`,
    )
  }
  return ms
}

/** Formats milliseconds for people: `1500` → `1.5s`, `90000` → `1m30s`. */
export function formatDuration(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)}ms`
  if (ms < 60_000) return `${Number((ms / 1_000).toFixed(1))}s`
  const parts: string[] = []
  let rest = Math.round(ms / 1_000)
  for (const [unit, size] of [
    ['d', 86_400],
    ['h', 3_600],
    ['m', 60],
    ['s', 1],
  ] as const) {
    if (rest >= size) {
      parts.push(`${Math.floor(rest / size)}${unit}`)
      rest %= size
    }
  }
  return parts.join('')
}

/** A duration as the user gave it, for messages: `"30d"`, or `2592000000ms`. */
function shown(input: Duration): string {
  return typeof input === 'string' ? `"${input}"` : `${input}ms`
}

/** The durations of a run: how long a holder owns a record, how long its outcome is replayed, how long a duplicate waits. */
export interface RunDurations {
  lease?: Duration
  ttl?: Duration
  wait?: Duration
}

/**
 * A run's `lease`, `ttl` and `wait` as the ledger takes them, in ms: each a duration, `lease` and `ttl`
 * longer than 0. The ledger checks them so; adapters call this where they are made, so a bad one
 * fails at start-up rather than every request or job. Only the given ones are returned.
 *
 * @example runDurations({ lease: '30s', wait: 0 }) // { lease: 30000, wait: 0 }
 */
export function runDurations(options: RunDurations): { lease?: number; ttl?: number; wait?: number } {
  return {
    ...(options.lease !== undefined ? { lease: runDuration('lease', options.lease) } : {}),
    ...(options.ttl !== undefined ? { ttl: runDuration('ttl', options.ttl) } : {}),
    ...(options.wait !== undefined ? { wait: runDuration('wait', options.wait) } : {}),
  }
}

/** One of {@link runDurations}: `lease` and `ttl` must be longer than 0, `wait` may be 0. */
export function runDuration(name: keyof RunDurations, input: Duration): number {
  return name === 'wait' ? parseDuration(input, name) : parsePositiveDuration(input, name)
}

/** {@link parseDuration} for a duration that must be longer than 0 (a poll interval of 0 is a busy loop). */
export function parsePositiveDuration(input: Duration, name: string): number {
  const ms = parseDuration(input, name)
  if (ms <= 0) throw new IdempotencyError('INVALID_OPTION', `${name} must be longer than 0, got ${ms}ms.`)
  return ms
}

/**
 * A delay option in ms (a consumer's `requeueDelayMs`, Express's `abandonAfterMs`): a number from
 * `min` up to what one Node timer can wait (about 24.8 days; a longer one fires after 1 ms), else
 * `INVALID_OPTION`. A string, NaN or a negative number would otherwise fire at once: a redelivery
 * loop, or a record released while its handler still runs.
 */
export function delayOption(value: number | undefined, fallback: number, name: string, min = 0): number {
  const ms = value ?? fallback
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < min || ms > MAX_TIMER_MS) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${name} is a delay in milliseconds from ${min} to ${MAX_TIMER_MS} (about 24.8 days), got ${typeof ms === 'string' ? JSON.stringify(ms) : String(ms)}.`,
    )
  }
  return ms
}
