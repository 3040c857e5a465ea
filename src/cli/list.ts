import { type Command, Option } from 'commander'
import type { IdempotencyStore, ListFilter, RecordStatus, StoredRecord } from '../core/store.js'
import { DEFAULT_STORE_URL } from '../stores/open.js'
import { durationArg, intArg, STORE_HELP, storeArg } from './options.js'
import { age, isStuck, leaseState, printJson, recordJson, renderTable } from './output.js'
import { withStore } from './run.js'

const STATUSES: RecordStatus[] = ['in_progress', 'completed', 'failed']

interface ListOptions {
  store: string
  status?: RecordStatus
  olderThan?: number
  scope?: string
  limit: number
  includeExpired?: boolean
  json?: boolean
}

/** `idemkey list`: records for operators, stuck intents first (in progress, lease ended), then oldest first. */
export function registerList(program: Command): void {
  program
    .command('list')
    .description('list records, stuck intents first')
    .addOption(new Option('--status <status>', 'only records with this status').choices(STATUSES))
    .option('--older-than <duration>', 'only records created at least this long ago (e.g. 5m)', durationArg('--older-than'))
    .option('--scope <scope>', 'only records of this scope')
    .option('--limit <n>', 'most records shown', intArg('--limit', 1, 100_000), 100)
    .option('--include-expired', 'also show expired records not yet purged')
    .option('--store <url>', STORE_HELP, storeArg, DEFAULT_STORE_URL)
    .option('--json', 'print the records as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey list                                   stuck intents first, then the oldest
  idemkey list --status in_progress --older-than 5m
  idemkey list --scope tenant-7 --store redis://127.0.0.1:6379 --json`,
    )
    .action(async (options: ListOptions) => {
      await withStore(options.store, async ({ store }) => {
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
          isStuck(r, now) ? 'STUCK' : '',
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
  const rank = (r: StoredRecord) => (isStuck(r, now) ? 0 : r.status === 'in_progress' ? 1 : 2)
  return records.sort((a, b) => rank(a) - rank(b) || a.createdAtMs - b.createdAtMs).slice(0, options.limit)
}
