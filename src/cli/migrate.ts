import type { Command } from 'commander'
import { describeStore } from '../stores/open.js'
import { storeOption } from './options.js'
import { printJson } from './output.js'
import { withStore } from './run.js'

/** `idemkey migrate`: creates or upgrades the store's schema. Safe to run again and from several machines. */
export function registerMigrate(program: Command): void {
  program
    .command('migrate')
    .description("create or upgrade the store's schema (safe to run again)")
    .addOption(storeOption())
    .option('--json', 'print the result as JSON')
    .addHelpText(
      'after',
      `
Examples:
  idemkey migrate --store sqlite:idemkey.db
  idemkey migrate --store postgres://app@127.0.0.1:5432/app`,
    )
    .action(async (options: { store: string; json?: boolean }) => {
      await withStore(options.store, async (opened) => {
        const done = await opened.migrate()
        if (options.json) printJson({ store: describeStore(opened.spec), result: done })
        else process.stdout.write(`${done}\n`)
      })
    })
}
