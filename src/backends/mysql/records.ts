/** Rows of the MySQL table and the records they hold. Not part of the public API. */

import type { AcquireResult, Outcome, StoredRecord } from '../../core/store.js'
import { assertIdentity, assertPositiveInteger } from '../../core/validate.js'
import { assertOutcome, encodeHeaders } from '../records.js'
import { type RecordRow, recordFromRow } from '../sql/rows.js'
import type { MySqlValue } from './pool.js'

/** A row as mysql2 returns it; numbers may come as strings from pools with `bigNumberStrings`. */
export interface Row extends RecordRow {
  scope: Buffer
  key: Buffer
  response_body: Buffer | null
  mine?: number | string | null
  /** The record's steps (JSON text), read back by acquire. */
  steps?: string | null
  /** Whether the record holds steps (1/0), where the read does not ship them. */
  has_steps?: number | string | null
  now_ms?: number | string
}

/** What acquire answers for a live record; `undefined` when the record can be taken. */
export function liveAnswer(row: Row, fingerprint: string): AcquireResult | undefined {
  const now = Number(row.now_ms)
  const lockedUntilMs = row.locked_until === null ? null : Number(row.locked_until)
  if (Number(row.expires_at) <= now) return undefined
  const ended = row.status === 'in_progress' && (lockedUntilMs as number) <= now
  // An ended attempt that left steps is taken over only by its own request; another one is a mismatch.
  const hasSteps = row.has_steps !== undefined ? Number(row.has_steps) === 1 : row.steps != null && row.steps !== '{}'
  if (ended && (row.fingerprint === fingerprint || !hasSteps)) return undefined
  if (row.fingerprint !== fingerprint) return { kind: 'mismatch' }
  if (row.status === 'in_progress') return { kind: 'in_progress', lockedUntilMs: lockedUntilMs as number }
  return { kind: 'replay', record: toRecord(row) }
}

/** Validates a completion and turns it into the values of the completing UPDATE. */
export function completeValues(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Record<string, MySqlValue> {
  assertIdentity(scope, key)
  assertPositiveInteger(ttlMs, 'ttlMs')
  assertOutcome(outcome)
  const body = outcome.response.body
  return {
    ...identity(scope, key),
    token,
    status: outcome.status,
    response_status: outcome.response.status,
    response_headers: encodeHeaders(outcome.response.headers),
    response_body: Buffer.from(body.buffer, body.byteOffset, body.byteLength),
    resource_id: outcome.resourceId ?? null,
    ttl: ttlMs,
  }
}

/** Scope and key as the bytes the VARBINARY columns hold. */
export function identity(scope: string, key: string): { scope: Buffer; key: Buffer } {
  return { scope: Buffer.from(scope, 'utf8'), key: Buffer.from(key, 'latin1') }
}

/** The record a row holds; the body is copied out of the driver's buffer. */
export function toRecord(row: Row): StoredRecord {
  return recordFromRow(row, row.scope.toString('utf8'), row.key.toString('latin1'))
}
