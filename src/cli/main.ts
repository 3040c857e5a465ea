import { readFileSync } from 'node:fs'
import { registerDemo } from './commands/demo.js'
import { registerDoctor } from './commands/doctor.js'
import { registerEvict } from './commands/evict.js'
import { registerGc } from './commands/gc.js'
import { registerInspect } from './commands/inspect.js'
import { registerList } from './commands/list.js'
import { registerMigrate } from './commands/migrate.js'
import { registerProxy } from './commands/proxy.js'
import { registerRelay } from './commands/relay.js'
import { registerSize } from './commands/size.js'
import { Command } from './program.js'
import { quietSqliteWarning } from './quiet-warnings.js'
import { CliError, describeFailure, HELP_HINT } from './run.js'

function version(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: string }
    return pkg.version ?? '0.0.0'
  } catch {
    return '0.0.0'
  }
}

/** Builds the `idemkey` program with every command registered (exported for tests and embedding). */
export function buildProgram(): Command {
  const program = new Command()
    .name('idemkey')
    .description('Idempotency keys for any HTTP API: a demo, a reverse proxy, and operator commands for the ledger.')
    .version(version(), '-v, --version')
    .addHelpText(
      'after',
      `
Examples:
  idemkey demo                                  see double charges happen, then not (embedded SQLite)
  idemkey proxy --upstream http://127.0.0.1:3000 --port 8080
  idemkey list --status in_progress --older-than 5m
  idemkey gc --store postgres://app@127.0.0.1:5432/app
  idemkey size --writes 5000 --window 24h       storage a write rate and window need, per store
  idemkey relay --from postgres://… --to nats://127.0.0.1:4222   publish the outbox from the WAL (CDC)
  idemkey doctor redis://127.0.0.1:6379         what this server's settings can lose, per failure

Store URLs: memory:, sqlite:PATH (default sqlite:idemkey.db), postgres://…, mysql://…, redis://…`,
    )
  registerDemo(program)
  registerProxy(program)
  registerMigrate(program)
  registerInspect(program)
  registerList(program)
  registerGc(program)
  registerEvict(program)
  registerSize(program)
  registerRelay(program)
  registerDoctor(program)
  return program
}

quietSqliteWarning()
try {
  await buildProgram().parseAsync(process.argv)
} catch (error) {
  if (error instanceof CliError && error.usage) {
    // A flag refused (by the parser, or by a command's own check): `error: …` and the line pointing to --help.
    process.stderr.write(`error: ${error.message}\n${HELP_HINT}\n`)
    process.exitCode = error.exitCode
  } else {
    const { message, exitCode } = describeFailure(error)
    process.stderr.write(`idemkey: ${message}\n`)
    process.exitCode = exitCode
  }
}
