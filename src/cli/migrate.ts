import type { Command } from 'commander'
import { describeStore } from '../stores/open.js'
import { storeOption } from './options.js'
import { printJson } from './output.js'
import { CliError, withStore } from './run.js'

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
      const url = withLayout(options.store, options.layout, options.partitionInterval)
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
