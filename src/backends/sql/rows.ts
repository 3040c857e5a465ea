/** A records-table row as a record, for the SQL stores. Not part of the public API. */

import type { RecordStatus, StoredRecord } from '../../core/store.js'
import { decodeHeaders } from '../records.js'

/**
 * The columns of a records row but its identity, as a driver returns them: numbers may come as
 * strings (bigint columns in node-postgres, `bigNumberStrings` in mysql2).
 */
export interface RecordRow {
  fingerprint: string
  status: RecordStatus
  token: string | number
  locked_until: string | number | null
  response_status: number | null
  response_headers: string | null
  response_body: Uint8Array | null
  resource_id: string | null
  attempts: string | number
  created_at: string | number
  updated_at: string | number
  expires_at: string | number
}

/** The record a row holds, under the `scope` and `key` the dialect decoded from it. */
export function recordFromRow(row: RecordRow, scope: string, key: string): StoredRecord {
  const stored = row.status !== 'in_progress'
  return {
    scope,
    key,
    fingerprint: row.fingerprint,
    status: row.status,
    token: Number(row.token),
    lockedUntilMs: stored || row.locked_until === null ? null : Number(row.locked_until),
    response: stored
      ? {
          status: Number(row.response_status),
          headers: decodeHeaders(row.response_headers),
          // A plain Uint8Array of its own: the driver's buffer may be a slice of a larger network buffer.
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
