import { type Command, Option } from 'commander'
import type { IdempotencyStore, ListFilter, RecordStatus, StoredRecord } from '../core/store.js'
import { durationArg, intArg, storeOption } from './options.js'
import { age, isStuck, leaseEnd, leaseState, printJson, recordJson, renderTable } from './output.js'
import { withExistingStore } from './run.js'

const STATUSES: RecordStatus[] = ['in_progress', 'completed', 'failed']

/** The first column of the table, by what ended the lease (see leaseEnd in output.ts). */
const LABELS = { abandoned: 'STUCK', released: 'released', live: '' } as const

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
 * release: the holder crashed or hung), then live in-progress ones, then released ones (a transient
 * failure gave them back; the next retry runs afresh), then settled ones; oldest first within each.
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
whether it took effect. "released" is one a transient failure (5xx, 401, 408, 409, 425, 429, a thrown
error) gave back: nothing is wrong, the next retry runs afresh.`,
    )
    .action(async (options: ListOptions) => {
      await withExistingStore(options.store, 'list', async ({ store }) => {
        const now = Date.now()
        const records = await collect(store, options, now)
        if (options.json) {
          printJson(records.map((r) => ({ ...recordJson(r, now), stuck: isStuck(r, now) })))
          return
        }
        if (records.length === 0) {
          process.stdout.write('no records match\n')
          return
        }
        const rows = records.map((r) => [
          LABELS[leaseEnd(r, now) ?? 'live'],
          r.scope,
          r.key,
          r.status,
          age(r.createdAtMs, now),
          r.token,
          r.attempts,
          leaseState(r, now),
          r.response ? String(r.response.status) : '-',
        ])
        process.stdout.write(`${renderTable(['', 'scope', 'key', 'status', 'age', 'token', 'attempts', 'lease', 'response'], rows)}\n`)
      })
    })
}

/**
 * Asks the store per status (in progress first), so stuck intents are never pushed out of the
 * listing by a mass of completed ones, then orders: stuck, in progress, the rest; oldest first.
 */
async function collect(store: IdempotencyStore, options: ListOptions, now: number): Promise<StoredRecord[]> {
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
  const rank = (r: StoredRecord) => {
    if (r.status !== 'in_progress') return 3
    const ended = leaseEnd(r, now)
    return ended === 'abandoned' ? 0 : ended === 'released' ? 2 : 1
  }
  return records.sort((a, b) => rank(a) - rank(b) || a.createdAtMs - b.createdAtMs).slice(0, options.limit)
}
