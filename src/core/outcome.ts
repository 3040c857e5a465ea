/**
 * How a finished attempt is kept (docs/ledger.md, "Outcomes"):
 * - `completed`: success, stored and replayed until it expires;
 * - `failed`: a final failure, stored and replayed, because the same request would fail the same way;
 * - `transient`: the record is released and the next retry runs afresh. Never cached.
 */
export type Classification = 'completed' | 'failed' | 'transient'

/** 4xx statuses that are worth retrying, so they are never stored. */
export const TRANSIENT_4XX: ReadonlySet<number> = new Set([401, 408, 409, 425, 429])

/**
 * The default classification of an HTTP status: 2xx/3xx completed; 4xx failed except 401, 408,
 * 409, 425, 429; everything else (5xx, 1xx, nonsense) transient.
 */
export function classifyStatus(status: number): Classification {
  if (status >= 200 && status < 400) return 'completed'
  if (status >= 400 && status < 500) return TRANSIENT_4XX.has(status) ? 'transient' : 'failed'
  return 'transient'
}
