import { formatDuration } from '../core/duration.js'
import { type LeaseEnd, leaseEnd, leaseEnds } from '../core/lease-end.js'
import type { IdempotencyStore, StoredRecord } from '../core/store.js'

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

/**
 * A record as plain JSON: times as ISO strings and ages, the body summarized (size, and text when readable);
 * `leaseEnded` and `stuck` (abandoned by its holder) by `end`, what leaseEnds (core/lease-end.ts) found.
 */
export function recordJson(record: StoredRecord, nowMs: number, end: LeaseEnd | null): Record<string, unknown> {
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
    leaseState: leaseState(record, nowMs, end),
    leaseEnded: end,
    stuck: end === 'abandoned',
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
 * `held 12s more`, `released 3s ago (…)`, `ended 3s ago: running in its transaction (…)`, `ended 3s ago, not
 * renewed (…)`, or `-` once the record is settled. `end`: what ended the lease, as leaseEnds (core/lease-end.ts) found
 * (by default as the record alone tells, which cannot see a holder in its transaction).
 */
export function leaseState(record: StoredRecord, nowMs: number, end: LeaseEnd | null = leaseEnd(record, nowMs)): string {
  if (record.status !== 'in_progress' || record.lockedUntilMs === null) return '-'
  const left = record.lockedUntilMs - nowMs
  if (left > 0) return `held ${formatDuration(left)} more`
  const ago = formatDuration(-left)
  if (end === 'released') return `released ${ago} ago (transient failure: the next retry runs afresh)`
  if (end === 'in_transaction') {
    return `ended ${ago} ago: running in its transaction (lease not renewed while the transaction holds the row; duplicates wait for its commit)`
  }
  return `ended ${ago} ago, not renewed (holder crashed or hung: the next retry takes over)`
}

/** What ended one record's lease, asking the store whether its holder runs in its transaction (leaseEnds). */
export async function leaseEndOf(store: IdempotencyStore, record: StoredRecord, nowMs: number): Promise<LeaseEnd | null> {
  const found = await leaseEnds(store, [record], nowMs)
  warnUnchecked(found.unchecked)
  return found.ends[0] ?? null
}

/**
 * Says on stderr that the store could not tell which holders run in their transaction (`unchecked` of
 * leaseEnds): those are shown STUCK, which may be wrong for some.
 */
export function warnUnchecked(unchecked: string | undefined): void {
  if (unchecked === undefined) return
  process.stderr.write(
    `idemkey: could not ask the store which holders run inside their transaction (${unchecked}); they are shown as STUCK. Run the command again.\n`,
  )
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
