import { IdempotencyError } from '../errors.js'

/** A duration in milliseconds, or a string such as `250ms`, `30s`, `5m`, `24h`, `7d`, `1h30m`. */
export type Duration = number | string

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
    return Math.round(input)
  }
  if (typeof input !== 'string') {
    throw new IdempotencyError('INVALID_OPTION', `${name} must be milliseconds or a string like "30s", got ${typeof input}.`)
  }
  const text = input.trim()
  if (/^\d+$/.test(text)) return Number(text)
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
  return Math.round(total)
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
