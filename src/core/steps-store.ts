import { IdempotencyError } from '../errors.js'
import type { StepEntry } from './store.js'
import { assertIdentity, assertPositiveInteger } from './validate.js'

/** What a store accepts as a step name: printable ASCII without `"` and `\`, so it quotes safely in a JSON path. */
const STORE_STEP_NAME = /^[\x20\x21\x23-\x5B\x5D-\x7E]{1,128}$/

/** Checks what a store's `recordStep` is given, before it touches the store. */
export function assertRecordStep(scope: string, key: string, token: number, name: unknown, result: unknown): void {
  assertIdentity(scope, key)
  assertPositiveInteger(token, 'token')
  if (typeof name !== 'string' || !STORE_STEP_NAME.test(name)) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `recordStep needs a step name of 1–128 printable ASCII characters other than " and \\, got ${JSON.stringify(name)}.`,
    )
  }
  if (result !== null && typeof result !== 'string') {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `recordStep needs the result as JSON text, or null for a started marker; got ${typeof result}.`,
    )
  }
}

/**
 * Steps as the SQL and Redis stores keep them: one JSON object per record, name → `{"r": <result JSON text>}`
 * for a recorded step or `{}` for a started marker. `null` or empty text when there are none.
 */
export function stepsFromJson(text: string | null | undefined | Record<string, { r?: string }>): StepEntry[] | undefined {
  if (text === null || text === undefined || text === '') return undefined
  const object = typeof text === 'string' ? (JSON.parse(text) as Record<string, { r?: string }>) : text
  const entries: StepEntry[] = []
  for (const name of Object.keys(object)) {
    const result = object[name]?.r
    entries.push({ name, result: typeof result === 'string' ? result : null })
  }
  return entries.length === 0 ? undefined : entries
}

/** The JSON value one step is kept as (see {@link stepsFromJson}). */
export function stepJson(result: string | null): string {
  return result === null ? '{}' : JSON.stringify({ r: result })
}
