import { intArg, storeOption } from '../options.js'
import { printJson } from '../output.js'
import type { Command } from '../program.js'
import { withExistingStore } from '../run.js'
import { describeStore } from '../store-url.js'

/** A PostgresStore on the partitioned layout: expiry drops partitions instead of deleting rows. */
interface PartitionedStore {
  layout: 'partitioned'
  rotatePartitions(): Promise<{ created: string[]; dropped: string[] }>
}

function isPartitioned(store: unknown): store is PartitionedStore {
  return (store as { layout?: unknown }).layout === 'partitioned'
}

/** `idemkey gc`: purges expired records in bounded batches, so traffic is never blocked for long. */
export function registerGc(program: Command): void {
  program
    .command('gc')
    .description('purge expired records, in batches, and print how many')
    .addOption(storeOption())
    .option('--batch <n>', 'records deleted per round trip', intArg('--batch', 1, 100_000), 1000)
    .option('--json', 'print the result as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey gc --store sqlite:data/idemkey.db
  idemkey gc --store redis://127.0.0.1:6379 --json
  IDEMKEY_STORE=postgres://app@127.0.0.1:5432/app idemkey gc
  idemkey gc --store 'postgres://app@127.0.0.1:5432/app?layout=partitioned'
    (a partitioned table: creates partitions ahead and drops those whose every record expired)
  Run it from cron (e.g. hourly); expired records already count as absent before they are purged.
  A SQLite file that does not exist is refused, never created.`,
    )
    .action(async (options: { store: string; batch: number; json?: boolean }) => {
      await withExistingStore(options.store, 'gc', async ({ store, spec }) => {
        if (isPartitioned(store)) {
          const { created, dropped } = await store.rotatePartitions()
          if (options.json) printJson({ store: describeStore(spec), layout: 'partitioned', dropped, created })
          else {
            const plural = (n: number) => (n === 1 ? '' : 's')
            process.stdout.write(
              `dropped ${dropped.length} expired partition${plural(dropped.length)} and created ${created.length} ahead in ${describeStore(spec)}\n`,
            )
          }
          return
        }
        let purged = 0
        let batches = 0
        for (;;) {
          const deleted = await store.purgeExpired(options.batch)
          purged += deleted
          batches++
          if (deleted < options.batch) break
        }
        if (options.json) printJson({ store: describeStore(spec), purged, batches })
        else process.stdout.write(`purged ${purged} expired record${purged === 1 ? '' : 's'} from ${describeStore(spec)}\n`)
      })
    })
}
