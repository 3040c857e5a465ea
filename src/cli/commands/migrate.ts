import { formatDuration, parseDuration } from '../../core/duration.js'
import { storeOption } from '../options.js'
import { printJson } from '../output.js'
import type { Command } from '../program.js'
import { CliError, withStore } from '../run.js'
import { describeStore, existingPostgresTable, parseStoreUrl } from '../store-url.js'

interface LayoutConvertible {
  convertLayout(): Promise<{ from: string; to: string; records: number }>
}

/** The store URL with the layout flags as its query parameters (`?layout=`, `?partitionInterval=`). */
function withLayout(url: string, layout: string | undefined, interval: string | undefined): string {
  if (layout === undefined && interval === undefined) return url
  if (layout !== undefined && layout !== 'plain' && layout !== 'partitioned') {
    throw new CliError(`--layout is plain or partitioned, not "${layout}".`, 2)
  }
  if (!/^postgres(ql)?:\/\//.test(url.trim())) throw new CliError('--layout and --partition-interval apply to a postgres:// store only.', 2)
  const parsed = new URL(url.trim())
  if (layout !== undefined) parsed.searchParams.set('layout', layout)
  if (interval !== undefined) parsed.searchParams.set('partitionInterval', interval)
  return parsed.toString()
}

/**
 * Refuses a `--partition-interval` that would not be used: a partitioned table keeps the interval
 * it was created with (its partitions have that span), and a plain table has none. Said before
 * anything is changed, rather than done otherwise than asked.
 */
async function checkInterval(url: string, layout: string | undefined, interval: string): Promise<void> {
  const spec = parseStoreUrl(url)
  const asked = parseDuration(interval, '--partition-interval')
  const table = await existingPostgresTable(spec)
  const name = describeStore(spec)
  if (layout === 'plain')
    throw new CliError("--partition-interval is the span of a partitioned table's partitions: leave it out with --layout plain.", 2, true)
  if ((layout ?? table?.layout) !== 'partitioned') {
    const what = table === undefined ? `${name} has no table yet, and migrate would create a plain one` : `the table of ${name} is plain`
    throw new CliError(
      `--partition-interval is the span of a partitioned table's partitions, and ${what}: add --layout partitioned.`,
      2,
      true,
    )
  }
  if (table?.layout === 'partitioned' && table.intervalMs !== undefined && table.intervalMs !== asked) {
    throw new CliError(
      `the table of ${name} is partitioned by ${formatDuration(table.intervalMs)}, and a partitioned table keeps the span it was created with (--partition-interval ${interval} would not be used). To change it, convert it to plain and back: idemkey migrate --store … --layout plain, then --layout partitioned --partition-interval ${interval} (each a rewrite of every record under an exclusive lock).`,
      2,
    )
  }
}

/** `idemkey migrate`: creates or upgrades the store's schema. Safe to run again and from several machines. */
export function registerMigrate(program: Command): void {
  program
    .command('migrate')
    .description("create or upgrade the store's schema (safe to run again)")
    .addOption(storeOption())
    .option(
      '--layout <layout>',
      'PostgreSQL: plain or partitioned; creates the table so, or converts an existing one (records kept, one transaction under an exclusive lock)',
    )
    .option('--partition-interval <duration>', 'PostgreSQL: the span of one partition of a table this creates or converts (default 1d)')
    .option('--json', 'print the result as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey migrate --store sqlite:idemkey.db
  idemkey migrate --store postgres://app@127.0.0.1:5432/app
  idemkey migrate --store postgres://app@127.0.0.1:5432/app --layout partitioned --partition-interval 1d
  idemkey migrate --store postgres://app@127.0.0.1:5432/app --layout plain   (back to one table)`,
    )
    .action(async (options: { store: string; layout?: string; partitionInterval?: string; json?: boolean }) => {
      let url = withLayout(options.store, options.layout, options.partitionInterval)
      if (options.partitionInterval !== undefined) {
        await checkInterval(url, options.layout, options.partitionInterval)
        // The check found the table partitioned (or --layout says it will be): the store need not look again.
        url = withLayout(options.store, 'partitioned', options.partitionInterval)
      }
      await withStore(url, async (opened) => {
        if (options.layout !== undefined) {
          const converted = await (opened.store as unknown as LayoutConvertible).convertLayout()
          const done =
            converted.from === converted.to
              ? `${describeStore(opened.spec)} has the ${converted.to} layout; schema is up to date`
              : `converted ${describeStore(opened.spec)} from ${converted.from} to ${converted.to}: ${converted.records} records kept`
          if (options.json) printJson({ store: describeStore(opened.spec), result: done, ...converted })
          else process.stdout.write(`${done}\n`)
          return
        }
        const done = await opened.migrate()
        if (options.json) printJson({ store: describeStore(opened.spec), result: done })
        else process.stdout.write(`${done}\n`)
      })
    })
}
