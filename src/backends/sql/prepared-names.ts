/** Prepared-statement names, for the PostgreSQL store and the data-layer adapters that prepare its statements. Not part of the public API. */

import { createHash } from 'node:crypto'

/**
 * `idemkey_<hash>`, or `idemkey_<tool>_<hash>`: a name that follows from the statement's text (24 hex
 * digits of its SHA-1), so two texts never share a prepared statement, and stores on different
 * tables neither. Within PostgreSQL's 63 bytes for any tool name up to 30.
 */
export function statementName(sql: string, tool?: string): string {
  return `idemkey_${tool === undefined ? '' : `${tool}_`}${createHash('sha1').update(sql).digest('hex').slice(0, 24)}`
}

const preparedNames = new Map<string, string>()

/**
 * {@link statementName} for a statement of `tool`, remembered: adapters ask for it on every statement
 * they send, where the store names its statements once.
 */
export function preparedName(tool: string, sql: string): string {
  const cacheKey = `${tool}\n${sql}`
  let name = preparedNames.get(cacheKey)
  if (name === undefined) {
    name = statementName(sql, tool)
    preparedNames.set(cacheKey, name)
  }
  return name
}
