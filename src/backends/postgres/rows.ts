/** Rows of the records table and their conversion to records. Not part of the public API. */

import { stepsFromJson } from '../../core/steps-store.js'
import type { AcquireResult, RecordStatus, StoredRecord } from '../../core/store.js'
import { decodeHeaders } from '../records.js'

/** A row as node-postgres returns it: bigint columns arrive as strings unless a type parser says otherwise. */
export interface Row {
  scope: string
  key: string
  fingerprint: string
  status: RecordStatus
  token: string | number
  locked_until: string | number | null
  response_status: number | null
  response_headers: string | null
  response_body: Uint8Array | null
  resource_id: string | null
  attempts: number
  created_at: string | number
  updated_at: string | number
  expires_at: string | number
}

/** What the acquire statement answers: the token it took, or the live record that stopped it. */
export interface AcquireRow extends Omit<Row, 'scope' | 'key' | 'fingerprint' | 'status' | 'token'> {
  taken: string | number | null
  /** The taken record's steps (JSON text), on a takeover that has some. */
  taken_steps: string | null
  fingerprint: string | null
  status: RecordStatus | null
  token: string | number | null
}

export function toRecord(row: Row): StoredRecord {
  const stored = row.status !== 'in_progress'
  return {
    scope: row.scope,
    key: row.key,
    fingerprint: row.fingerprint,
    status: row.status,
    token: Number(row.token),
    lockedUntilMs: stored || row.locked_until === null ? null : Number(row.locked_until),
    response: stored
      ? {
          status: Number(row.response_status),
          headers: decodeHeaders(row.response_headers),
          // A plain Uint8Array of its own, whatever buffer the driver decoded into.
          body: row.response_body ? new Uint8Array(row.response_body) : new Uint8Array(0),
        }
      : null,
    resourceId: row.resource_id,
    attempts: Number(row.attempts),
    createdAtMs: Number(row.created_at),
    updatedAtMs: Number(row.updated_at),
    expiresAtMs: Number(row.expires_at),
  }
}

/**
 * What an acquire row means for the caller of `fingerprint`: acquired (with the taken record's
 * steps), or the live record's answer; `undefined` when neither came back (another caller changed
 * the row between the statement's snapshot and its insert: run it again).
 */
export function acquireAnswer(row: AcquireRow, scope: string, key: string, fingerprint: string): AcquireResult | undefined {
  if (row.taken !== null) {
    const steps = stepsFromJson(row.taken_steps)
    return steps ? { kind: 'acquired', token: Number(row.taken), steps } : { kind: 'acquired', token: Number(row.taken) }
  }
  if (row.status === null) return undefined
  if (row.fingerprint !== fingerprint) return { kind: 'mismatch' }
  if (row.status === 'in_progress') return { kind: 'in_progress', lockedUntilMs: Number(row.locked_until) }
  return { kind: 'replay', record: toRecord({ ...row, scope, key } as Row) }
}
