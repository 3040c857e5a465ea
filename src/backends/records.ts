/** Helpers shared by store implementations. Not part of the public API. */

import type { ListFilter, Outcome, StoredRecord, StoredResponse } from '../core/store.js'
import { IdempotencyError } from '../errors.js'

/**
 * A copy that shares no bytes with the caller's response. `Buffer.from` copies a small body into
 * Node's shared 8 KiB pool instead of a buffer of its own: an in-process store holds one per record,
 * and the garbage collector pays for every separate buffer it tracks.
 */
export function copyResponse(response: StoredResponse): StoredResponse {
  return { status: response.status, headers: { ...response.headers }, body: Buffer.from(response.body) }
}

export function copyRecord(record: StoredRecord): StoredRecord {
  return { ...record, response: record.response ? copyResponse(record.response) : null }
}

/** Throws `INVALID_ARGUMENT` unless the outcome can be stored. */
export function assertOutcome(outcome: Outcome): void {
  const response = outcome?.response
  const ok =
    (outcome?.status === 'completed' || outcome?.status === 'failed') &&
    response !== undefined &&
    Number.isInteger(response.status) &&
    response.status >= 100 &&
    response.status <= 999 &&
    typeof response.headers === 'object' &&
    response.headers !== null &&
    allStrings(response.headers) &&
    response.body instanceof Uint8Array &&
    (outcome.resourceId === undefined || outcome.resourceId === null || typeof outcome.resourceId === 'string')
  if (!ok) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      'An outcome needs status "completed" or "failed" and a response { status: 100-999, headers: Record<string, string>, body: Uint8Array }.',
    )
  }
}

/**
 * The list filter's limit (100 when not given); throws `INVALID_ARGUMENT` unless it is a non-negative
 * integer. Unchecked, SQLite read a negative LIMIT as none at all (every record) and an array's slice
 * left out the last records.
 */
export function listLimit(filter: ListFilter): number {
  const limit = filter.limit ?? 100
  if (!Number.isSafeInteger(limit) || limit < 0) {
    throw new IdempotencyError('INVALID_ARGUMENT', `list limit must be a non-negative integer, got ${String(limit)}.`)
  }
  return limit
}

/** Whether a record passes a list filter at `nowMs`. */
export function matchesFilter(record: StoredRecord, filter: ListFilter, nowMs: number): boolean {
  if (!filter.includeExpired && record.expiresAtMs <= nowMs) return false
  if (filter.scope !== undefined && record.scope !== filter.scope) return false
  if (filter.status !== undefined && record.status !== filter.status) return false
  if (filter.createdBeforeMs !== undefined && record.createdAtMs > filter.createdBeforeMs) return false
  return true
}

/** Stored headers as one JSON text (sorted keys, so equal headers are equal text). */
export function encodeHeaders(headers: Record<string, string>): string {
  const sorted: Record<string, string> = {}
  for (const name of Object.keys(headers).sort()) sorted[name] = headers[name] as string
  return JSON.stringify(sorted)
}

export function decodeHeaders(text: string | null | undefined): Record<string, string> {
  return text ? (JSON.parse(text) as Record<string, string>) : {}
}

function allStrings(headers: Record<string, unknown>): boolean {
  for (const name in headers) if (typeof headers[name] !== 'string') return false
  return true
}

/**
 * An error and what it wraps, a few levels deep: `cause`, and where data-layer tools keep the
 * driver's error (Sequelize's `parent`/`original`, TypeORM's `driverError`).
 */
export function causes(error: unknown): unknown[] {
  const seen: unknown[] = []
  const queue = [error]
  while (queue.length > 0 && seen.length < 12) {
    const current = queue.shift()
    if (!current || typeof current !== 'object' || seen.includes(current)) continue
    seen.push(current)
    const wrapper = current as { cause?: unknown; parent?: unknown; original?: unknown; driverError?: unknown }
    queue.push(wrapper.cause, wrapper.parent, wrapper.original, wrapper.driverError)
  }
  return seen
}
