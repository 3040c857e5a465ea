import { createInterface } from 'node:readline/promises'
import { storeOption } from '../options.js'
import { leaseEndOf, leaseState, printJson } from '../output.js'
import type { Command } from '../program.js'
import { CliError, withExistingStore } from '../run.js'
import { describeStore } from '../store-url.js'

/**
 * `idemkey evict KEY`: an operator's deliberate reset. The next request with the key runs afresh,
 * so the operation may happen again: the command shows the record and asks before deleting it.
 */
export function registerEvict(program: Command): void {
  program
    .command('evict')
    .description("delete one record whatever its state (an operator's deliberate reset), after confirmation")
    .argument('<key>', 'the idempotency key')
    .option('--scope <scope>', "the key's scope", 'public')
    .option('-y, --yes', 'do not ask for confirmation (needed when stdin is not a terminal)')
    .addOption(storeOption())
    .option('--json', 'print the result as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey evict order-42 --scope tenant-7          shows the record, then asks
  idemkey evict order-42 --scope tenant-7 --yes    for scripts
  After an eviction the next request with this key runs the operation again: evict only when you
  know the operation did not take effect, or that running it again is what you want.`,
    )
    .action(async (key: string, options: { scope: string; yes?: boolean; store: string; json?: boolean }) => {
      await withExistingStore(options.store, 'evict', async ({ store, spec }) => {
        const record = await store.get(options.scope, key)
        if (!options.yes) {
          if (!process.stdin.isTTY) {
            throw new CliError('evict deletes a record and needs confirmation: run it in a terminal, or pass --yes.', 2)
          }
          const now = Date.now()
          const what = record
            ? `${record.status} record (token ${record.token}, ${record.attempts} attempt(s), lease ${leaseState(record, now, await leaseEndOf(store, record, now))})`
            : 'record (expired or absent)'
          const rl = createInterface({ input: process.stdin, output: process.stderr })
          const answer = await rl.question(
            `Delete the ${what} for key "${key}" in scope "${options.scope}" of ${describeStore(spec)}?\nThe next request with this key will run the operation again. Type the key to confirm: `,
          )
          rl.close()
          if (answer.trim() !== key) throw new CliError('Not confirmed: nothing was deleted.', 2)
        }
        const existed = await store.evict(options.scope, key)
        if (options.json) printJson({ key, scope: options.scope, evicted: existed })
        else
          process.stdout.write(
            existed
              ? `evicted key "${key}" in scope "${options.scope}"\n`
              : `no record for key "${key}" in scope "${options.scope}": nothing to evict\n`,
          )
      })
    })
}
