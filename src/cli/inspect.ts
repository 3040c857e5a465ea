import type { Command } from 'commander'
import { DEFAULT_SCOPE } from '../core/ledger.js'
import type { StoredRecord } from '../core/store.js'
import { describeStore } from '../stores/open.js'
import { storeOption } from './options.js'
import { age, bodyPreview, leaseState, printJson, recordJson, renderPairs } from './output.js'
import { CliError, withExistingStore } from './run.js'

/** The scopes tried when `--scope` is not given: the HTTP layer's default, then the ledger's. */
const DEFAULT_SCOPES = ['public', DEFAULT_SCOPE]

/** `idemkey inspect KEY`: one record, its status, age, token, attempts, lease and stored response. */
export function registerInspect(program: Command): void {
  program
    .command('inspect')
    .description('show one record: status, age, token, attempts, lease, stored response')
    .argument('<key>', 'the idempotency key')
    .option('--scope <scope>', `the key's scope (default: tries ${DEFAULT_SCOPES.map((s) => `"${s}"`).join(', then ')})`)
    .addOption(storeOption())
    .option('--json', 'print the record as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey inspect 0193b7e2-8f3a-7c4e-9a1b-3f2d5e6c7a8b
  idemkey inspect order-42 --scope fn:tenant-7 --store postgres://app@127.0.0.1/app --json
  Requests with an Authorization header are scoped by a keyed hash of it (cred:…), tenants by fn:… or header:…: find the scope with idemkey list.`,
    )
    .action(async (key: string, options: { scope?: string; store: string; json?: boolean }) => {
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
        if (options.json) {
          printJson({ found: true, record: recordJson(record, now) })
          return
        }
        process.stdout.write(`${renderRecord(record, now)}\n`)
      })
    })
}

function renderRecord(record: StoredRecord, now: number): string {
  const pairs: Array<[string, string | number]> = [
    ['key', record.key],
    ['scope', record.scope],
    ['status', record.status],
    ['age', age(record.createdAtMs, now)],
    ['token', record.token],
    ['attempts', record.attempts],
    ['lease', leaseState(record, now)],
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
