import type { LeaseEnd } from '../../core/lease-end.js'
import { DEFAULT_SCOPE } from '../../core/ledger.js'
import type { StoredRecord } from '../../core/store.js'
import { storeOption } from '../options.js'
import { age, bodyPreview, leaseEndOf, leaseState, printJson, recordJson, renderPairs } from '../output.js'
import type { Command } from '../program.js'
import { assertStoreExists, CliError, withExistingStore } from '../run.js'
import { describeStore, parseStoreUrl } from '../store-url.js'
import { DEFAULT_INBOX_TABLE, readInboxes, renderInboxes } from './inbox-report.js'

/** The scopes tried when `--scope` is not given: the HTTP layer's default, then the ledger's. */
const DEFAULT_SCOPES = ['public', DEFAULT_SCOPE]

interface InspectOptions {
  scope?: string
  store: string
  json?: boolean
  inboxes?: boolean
  inboxTable: string
}

/**
 * `idemkey inspect KEY`: one record, its status, age, token, attempts, lease and stored response.
 * `idemkey inspect --inboxes`: each inbox consumer's oldest kept message ID instead.
 */
export function registerInspect(program: Command): void {
  program
    .command('inspect')
    .description(
      "show one record: status, age, token, attempts, lease, stored response (or, with --inboxes, each inbox's oldest kept ID and failing messages)",
    )
    .argument('[key]', 'the idempotency key')
    .option('--scope <scope>', `the key's scope (default: tries ${DEFAULT_SCOPES.map((s) => `"${s}"`).join(', then ')})`)
    .option(
      '--inboxes',
      'instead of a record: each consumer of the inbox table, its oldest kept message ID (age, time) and its failing messages',
    )
    .option('--inbox-table <name>', 'the inbox table, optionally schema.table (with --inboxes)', DEFAULT_INBOX_TABLE)
    .addOption(storeOption())
    .option('--json', 'print the record as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey inspect 0193b7e2-8f3a-7c4e-9a1b-3f2d5e6c7a8b
  idemkey inspect order-42 --scope fn:tenant-7 --store postgres://app@127.0.0.1/app --json
  idemkey inspect --inboxes --store postgres://app@127.0.0.1/app
  Requests with an Authorization header are scoped by a keyed hash of it (cred:…), tenants by fn:… or header:…: find the scope with idemkey list.`,
    )
    .action(async (key: string | undefined, options: InspectOptions) => {
      if (options.inboxes) return inspectInboxes(options)
      if (key === undefined)
        throw new CliError('Give the idempotency key to inspect (idemkey inspect KEY), or --inboxes for the inbox consumers.', 2)
      await withExistingStore(options.store, 'inspect', async ({ store, spec }) => {
        const scopes = options.scope === undefined ? DEFAULT_SCOPES : [options.scope]
        let record: StoredRecord | null = null
        for (const scope of scopes) {
          record = await store.get(scope, key)
          if (record) break
        }
        const now = Date.now()
        if (!record) {
          const where = scopes.map((s) => `"${s}"`).join(' or ')
          if (options.json) printJson({ found: false, key, scopes })
          throw new CliError(
            `No live record for key "${key}" in scope ${where} of ${describeStore(spec)}. It may never have been used, have expired, or live in another scope: pass --scope, or look with idemkey list.`,
          )
        }
        const end = await leaseEndOf(store, record, now)
        if (options.json) {
          printJson({ found: true, record: recordJson(record, now, end) })
          return
        }
        process.stdout.write(`${renderRecord(record, now, end)}\n`)
      })
    })
}

/** `--inboxes`: the inbox table of the database `--store` names, one row per consumer. */
async function inspectInboxes(options: InspectOptions): Promise<void> {
  const spec = parseStoreUrl(options.store)
  assertStoreExists(spec, 'inspect')
  const rows = await readInboxes(spec, options.inboxTable)
  const now = Date.now()
  if (options.json) {
    printJson({
      table: options.inboxTable,
      inboxes: rows.map((row) => ({
        consumer: row.consumer,
        oldest:
          row.oldestProcessedAtMs === null
            ? null
            : {
                messageId: row.oldestMessageId,
                processedAt: new Date(row.oldestProcessedAtMs).toISOString(),
                ageMs: Math.max(0, now - row.oldestProcessedAtMs),
              },
        failing: row.failing.map((f) => ({
          messageId: f.messageId,
          attempts: f.attempts,
          lastAttemptAt: new Date(f.lastAttemptAtMs).toISOString(),
          ageMs: Math.max(0, now - f.lastAttemptAtMs),
        })),
      })),
    })
    return
  }
  process.stdout.write(`${renderInboxes(rows, options.inboxTable, now)}\n`)
}

function renderRecord(record: StoredRecord, now: number, end: LeaseEnd | null): string {
  const pairs: Array<[string, string | number]> = [
    ['key', record.key],
    ['scope', record.scope],
    ['status', record.status],
    ['age', age(record.createdAtMs, now)],
    ['token', record.token],
    ['attempts', record.attempts],
    ['lease', leaseState(record, now, end)],
    ['created', new Date(record.createdAtMs).toISOString()],
    ['updated', new Date(record.updatedAtMs).toISOString()],
    ['expires', new Date(record.expiresAtMs).toISOString()],
    ['fingerprint', record.fingerprint],
    ['resource', record.resourceId ?? '-'],
  ]
  if (record.response) {
    const { status, headers, body } = record.response
    const preview = bodyPreview(body)
    pairs.push(['response', `${status}, ${body.byteLength} bytes${headers['content-type'] ? `, ${headers['content-type']}` : ''}`])
    for (const [name, value] of Object.entries(headers)) pairs.push([`  ${name}`, value])
    if (preview) pairs.push(['  body', preview])
  } else {
    pairs.push(['response', '- (none stored yet)'])
  }
  return renderPairs(pairs)
}
