/**
 * What ended the lease of an in-progress record, for operators (`idemkey list`/`inspect`, the operator page,
 * the holders gauge): a release, a holder gone, or a holder alive inside its transaction.
 */
import type { IdempotencyStore, StoredRecord } from './store.js'

/**
 * - `released`: the holder gave the record back (a transient failure: 5xx, 401, 408, 409, 425, 429, a
 *   thrown error), so the next retry with the key runs afresh. Nothing is wrong.
 * - `abandoned`: the holder stopped renewing (crashed, killed, hung, cut off from the store). The next
 *   retry takes over; until one comes, the intent is stuck, and whether its work ran is unknown.
 * - `in_transaction`: the holder runs inside its database transaction, which holds the record's row
 *   (`runInTransaction` after its first step: the lease is not renewed, docs/steps.md). It is
 *   alive: a duplicate waits for it and replays, a takeover waits for its commit or rollback.
 */
export type LeaseEnd = 'released' | 'abandoned' | 'in_transaction'

/**
 * What ended the lease, as the record alone tells: `released` or `abandoned` (a holder in its transaction
 * looks abandoned here; {@link leaseEnds} asks the store). Every built-in store ends a released lease at the
 * instant of the release (`locked_until` = `updated_at`), while a lease that ran out ends after the holder's
 * last write (its last acquire or renewal set `locked_until` = `updated_at` + lease). A custom store that does
 * not keep this is reported as abandoned, the cautious reading. `null` while the lease is live or the record
 * is settled.
 */
export function leaseEnd(record: StoredRecord, nowMs: number): 'released' | 'abandoned' | null {
  if (record.status !== 'in_progress' || record.lockedUntilMs === null || record.lockedUntilMs > nowMs) return null
  return record.lockedUntilMs <= record.updatedAtMs ? 'released' : 'abandoned'
}

/** Records asked about per round trip of {@link leaseEnds}. */
const PROBE_BATCH = 200

/** What {@link leaseEnds} answers: one entry per record, and why the store could not be asked, if it could not. */
export interface LeaseEnds {
  ends: Array<LeaseEnd | null>
  /** Set when the store failed to say which holders run in a transaction: those stay `abandoned`. */
  unchecked?: string
}

/**
 * What ended each record's lease, asking the store (`heldInTransaction`, without waiting for any lock) about
 * the records that look abandoned only, a batch of {@link PROBE_BATCH} per round trip: those whose row an
 * open transaction holds are `in_transaction`. A store without transactional holders is not asked. When the
 * store fails to answer, the records stay `abandoned` (the cautious reading) and `unchecked` says why.
 *
 * @example const { ends } = await leaseEnds(store, await store.list({ status: 'in_progress' }), Date.now())
 */
export async function leaseEnds(store: IdempotencyStore, records: readonly StoredRecord[], nowMs: number): Promise<LeaseEnds> {
  const ends: Array<LeaseEnd | null> = records.map((r) => leaseEnd(r, nowMs))
  const probe = store.heldInTransaction?.bind(store)
  if (!probe) return { ends }
  const abandoned = ends.flatMap((end, i) => (end === 'abandoned' ? [i] : []))
  try {
    for (let from = 0; from < abandoned.length; from += PROBE_BATCH) {
      const batch = abandoned.slice(from, from + PROBE_BATCH)
      const held = await probe(batch.map((i) => records[i] as StoredRecord))
      batch.forEach((i, n) => {
        if (held[n] === true) ends[i] = 'in_transaction'
      })
    }
    return { ends }
  } catch (error) {
    return { ends, unchecked: error instanceof Error ? error.message : String(error) }
  }
}

/** The in-progress records {@link holdersPastLease} reads, at most: the gauges count up to this many. */
export const HOLDERS_COUNT_LIMIT = 1_000

/**
 * How many holders are past their lease, stuck (abandoned) or alive in their transaction, among the first
 * {@link HOLDERS_COUNT_LIMIT} in-progress records: what the holders gauges report. Rejects when the store
 * does not answer the listing.
 */
export async function holdersPastLease(store: IdempotencyStore, nowMs: number): Promise<{ stuck: number; inTransaction: number }> {
  const records = await store.list({ status: 'in_progress', limit: HOLDERS_COUNT_LIMIT })
  const { ends } = await leaseEnds(store, records, nowMs)
  return {
    stuck: ends.filter((end) => end === 'abandoned').length,
    inTransaction: ends.filter((end) => end === 'in_transaction').length,
  }
}
