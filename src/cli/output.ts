import { formatDuration } from '../core/duration.js'
import type { StoredRecord } from '../core/store.js'

/**
 * Renders rows as an aligned plain-text table with a header line; numbers are right-aligned.
 *
 * @example console.log(renderTable(['key', 'status'], [['a', 'completed']]))
 */
export function renderTable(headers: string[], rows: Array<Array<string | number>>): string {
  const cells = rows.map((row) => row.map((cell) => String(cell)))
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((row) => (row[i] ?? '').length)))
  const numeric = headers.map((_, i) => rows.length > 0 && rows.every((row) => typeof row[i] === 'number'))
  const line = (row: string[]) =>
    row
      .map((cell, i) => (numeric[i] ? cell.padStart(widths[i] ?? 0) : cell.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd()
  return [line(headers), line(widths.map((w) => '-'.repeat(w))), ...cells.map(line)].join('\n')
}

/** Renders `label: value` pairs, labels aligned. */
export function renderPairs(pairs: Array<[string, string | number]>): string {
  const width = Math.max(...pairs.map(([label]) => label.length))
  return pairs.map(([label, value]) => `${`${label}:`.padEnd(width + 1)} ${value}`).join('\n')
}

/** Prints a value as indented JSON on stdout (the `--json` output of every command). */
export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`)
}

/** A record as plain JSON: times as ISO strings and ages, the body summarized (size, and text when readable). */
export function recordJson(record: StoredRecord, nowMs: number): Record<string, unknown> {
  return {
    scope: record.scope,
    key: record.key,
    status: record.status,
    token: record.token,
    attempts: record.attempts,
    fingerprint: record.fingerprint,
    ageMs: nowMs - record.createdAtMs,
    createdAt: new Date(record.createdAtMs).toISOString(),
    updatedAt: new Date(record.updatedAtMs).toISOString(),
    expiresAt: new Date(record.expiresAtMs).toISOString(),
    lockedUntil: record.lockedUntilMs === null ? null : new Date(record.lockedUntilMs).toISOString(),
    leaseState: leaseState(record, nowMs),
    leaseEnded: leaseEnd(record, nowMs),
    resourceId: record.resourceId,
    response: record.response
      ? {
          status: record.response.status,
          headers: record.response.headers,
          bodyBytes: record.response.body.byteLength,
          bodyPreview: bodyPreview(record.response.body),
        }
      : null,
  }
}

/**
 * What ended the lease of an in-progress record, once it has ended:
 * - `released`: the holder gave the record back (a transient failure: 5xx, 401, 408, 409, 425, 429, a
 *   thrown error), so the next retry with the key runs afresh. Nothing is wrong.
 * - `abandoned`: the holder stopped renewing (crashed, killed, hung, cut off from the store). The next
 *   retry takes over; until one comes, the intent is stuck, and whether its work ran is unknown.
 *
 * Every built-in store ends a released lease at the instant of the release (`locked_until` =
 * `updated_at`), while a lease that ran out ends after the holder's last write (its last acquire or
 * renewal set `locked_until` = `updated_at` + lease). A custom store that does not keep this is
 * reported as abandoned, the cautious reading. `null` while the lease is live or the record is settled.
 */
export function leaseEnd(record: StoredRecord, nowMs: number): 'released' | 'abandoned' | null {
  if (record.status !== 'in_progress' || record.lockedUntilMs === null || record.lockedUntilMs > nowMs) return null
  return record.lockedUntilMs <= record.updatedAtMs ? 'released' : 'abandoned'
}

/** `held 12s more`, `released 3s ago (…)`, `ended 3s ago, not renewed (…)`, or `-` once the record is settled. */
export function leaseState(record: StoredRecord, nowMs: number): string {
  if (record.status !== 'in_progress' || record.lockedUntilMs === null) return '-'
  const left = record.lockedUntilMs - nowMs
  if (left > 0) return `held ${formatDuration(left)} more`
  const ago = formatDuration(-left)
  return leaseEnd(record, nowMs) === 'released'
    ? `released ${ago} ago (transient failure: the next retry runs afresh)`
    : `ended ${ago} ago, not renewed (holder crashed or hung: the next retry takes over)`
}

/** Whether an in-progress record was abandoned by its holder (crashed or hung), as opposed to released. */
export function isStuck(record: StoredRecord, nowMs: number): boolean {
  return leaseEnd(record, nowMs) === 'abandoned'
}

/** Up to 120 characters of a body when it is UTF-8 text, else `null`. */
export function bodyPreview(body: Uint8Array): string | null {
  if (body.byteLength === 0) return ''
  try {
    // `stream`: the 480 bytes may end inside a character, which is no sign of a binary body.
    const text = new TextDecoder('utf-8', { fatal: true }).decode(body.subarray(0, 480), { stream: true })
    // biome-ignore lint/suspicious/noControlCharactersInRegex: binary bodies are recognized by their control characters
    if (/[\x00-\x08\x0e-\x1f]/.test(text)) return null
    return text.length > 120 ? `${text.slice(0, 117)}...` : text
  } catch {
    return null
  }
}

/** An age for people: `4s`, `2m5s`. */
export function age(fromMs: number, nowMs: number): string {
  return formatDuration(Math.max(0, nowMs - fromMs))
}
