import { type LeaseEnd, leaseEnds } from '../../core/lease-end.js'
import type { IdempotencyStore, ListFilter, RecordStatus, StoredRecord } from '../../core/store.js'
import { durationArg, intArg, storeOption } from '../options.js'
import { age, leaseState, printJson, recordJson, renderTable, warnUnchecked } from '../output.js'
import { type Command, Option } from '../program.js'
import { withExistingStore } from '../run.js'

const STATUSES: RecordStatus[] = ['in_progress', 'completed', 'failed']

/** The first column of the table, by what ended the lease (core/lease-end.ts). */
const LABELS = { abandoned: 'STUCK', in_transaction: 'in tx', released: 'released', live: '' } as const

/** Stuck first, then those running (lease held, or in their transaction), then released, then settled. */
const RANK = { abandoned: 0, live: 1, in_transaction: 1, released: 2 } as const

interface ListOptions {
  store: string
  status?: RecordStatus
  olderThan?: number
  scope?: string
  limit: number
  includeExpired?: boolean
  json?: boolean
}

/**
 * `idemkey list`: records for operators. Stuck intents first (in progress, lease ended without a
 * release: the holder crashed or hung), then live in-progress ones (lease held, or the holder inside its
 * transaction), then released ones (a transient failure gave them back; the next retry runs afresh),
 * then settled ones; oldest first within each.
 */
export function registerList(program: Command): void {
  program
    .command('list')
    .description('list records: stuck intents (holder crashed) first, then in progress, released, settled')
    .addOption(new Option('--status <status>', 'only records with this status').choices(STATUSES))
    .option('--older-than <duration>', 'only records created at least this long ago (e.g. 5m)', durationArg('--older-than'))
    .option('--scope <scope>', 'only records of this scope')
    .option('--limit <n>', 'most records shown', intArg('--limit', 1, 100_000), 100)
    .option('--include-expired', 'also show expired records not yet purged')
    .addOption(storeOption())
    .option('--json', 'print the records as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey list --store sqlite:data/idemkey.db    stuck intents first, then the oldest
  idemkey list --status in_progress --older-than 5m --store postgres://app@127.0.0.1:5432/app
  idemkey list --scope tenant-7 --store redis://127.0.0.1:6379 --json

The first column: STUCK is an in-progress record whose lease ran out without a release (its holder
crashed, was killed or hung): the next retry with its key takes over and runs the work again, so check
whether it took effect. "in tx" is one whose holder runs inside its database transaction, which holds
the record's row (runInTransaction after its first step no longer renews the lease): it is alive, a
duplicate waits for its commit. "released" is one a transient failure (5xx, 401, 408, 409, 425, 429, a
thrown error) gave back: nothing is wrong, the next retry runs afresh.`,
    )
    .action(async (options: ListOptions) => {
      await withExistingStore(options.store, 'list', async ({ store }) => {
        const now = Date.now()
        const { records, ends } = await collect(store, options, now)
        if (options.json) {
          printJson(records.map((r, i) => recordJson(r, now, ends[i] ?? null)))
          return
        }
        if (records.length === 0) {
          process.stdout.write('no records match\n')
          return
        }
        const rows = records.map((r, i) => [
          LABELS[ends[i] ?? 'live'],
          r.scope,
          r.key,
          r.status,
          age(r.createdAtMs, now),
          r.token,
          r.attempts,
          leaseState(r, now, ends[i] ?? null),
          r.response ? String(r.response.status) : '-',
        ])
        process.stdout.write(`${renderTable(['', 'scope', 'key', 'status', 'age', 'token', 'attempts', 'lease', 'response'], rows)}\n`)
      })
    })
}

/**
 * Asks the store per status (in progress first), so stuck intents are never pushed out of the
 * listing by a mass of completed ones, and which holders past their lease run in their transaction,
 * then orders: stuck, in progress, released, the rest; oldest first.
 */
async function collect(
  store: IdempotencyStore,
  options: ListOptions,
  now: number,
): Promise<{ records: StoredRecord[]; ends: Array<LeaseEnd | null> }> {
  const base: ListFilter = { limit: options.limit }
  if (options.scope !== undefined) base.scope = options.scope
  if (options.olderThan !== undefined) base.createdBeforeMs = now - options.olderThan
  if (options.includeExpired) base.includeExpired = true
  const statuses = options.status ? [options.status] : STATUSES
  const records: StoredRecord[] = []
  for (const status of statuses) {
    if (records.length >= options.limit) break
    records.push(...(await store.list({ ...base, status, limit: options.limit - records.length })))
  }
  const found = await leaseEnds(store, records, now)
  warnUnchecked(found.unchecked)
  const rank = (i: number) => ((records[i] as StoredRecord).status === 'in_progress' ? RANK[found.ends[i] ?? 'live'] : 3)
  const order = records
    .map((_, i) => i)
    .sort((a, b) => rank(a) - rank(b) || (records[a] as StoredRecord).createdAtMs - (records[b] as StoredRecord).createdAtMs)
    .slice(0, options.limit)
  return { records: order.map((i) => records[i] as StoredRecord), ends: order.map((i) => found.ends[i] ?? null) }
}
