/** Rows of the records table and their conversion to records. Not part of the public API. */

import { stepsFromJson } from '../../core/steps-store.js'
import type { AcquireResult, RecordStatus, StoredRecord } from '../../core/store.js'
import { type RecordRow, recordFromRow } from '../sql/rows.js'

/** A row as node-postgres returns it: bigint columns arrive as strings unless a type parser says otherwise. */
export interface Row extends RecordRow {
  scope: string
  key: string
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
  return recordFromRow(row, row.scope, row.key)
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
