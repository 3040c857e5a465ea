#!/usr/bin/env node
/**
 * Runs a command (the rest of the arguments) on a supported Node.js: this one when it is 22.16 or
 * later, else the main tested line (MAIN_LINE) fetched from the npm registry, first on PATH so that
 * the command and everything it starts (npm, vitest, tsx, child processes) run on it.
 *
 * This is what keeps `npm test` working on a machine whose own Node.js is past its end of life
 * (Node 20 has no node:sqlite, the embedded store's driver).
 *
 * @example node scripts/with-node.mjs npm run test:suite
 */
import { spawn } from 'node:child_process'
import { delimiter, dirname } from 'node:path'
import { isSupportedNode, MAIN_LINE, MINIMUM_NODE, nodeBinary } from './runtimes.mjs'

const [command, ...args] = process.argv.slice(2)
if (!command) {
  console.error('usage: node scripts/with-node.mjs <command> [args...]')
  process.exit(2)
}

const env = { ...process.env }
if (!isSupportedNode() || process.env.IDEMKEY_TEST_NODE) {
  const line = Number(process.env.IDEMKEY_TEST_NODE ?? MAIN_LINE)
  const node = nodeBinary(line)
  if (!process.env.IDEMKEY_TEST_NODE) {
    console.error(
      `idemkey: Node.js ${process.version} is older than the oldest supported (${MINIMUM_NODE}); running on Node.js ${line} from the registry (${node}).`,
    )
  }
  env.PATH = `${dirname(node)}${delimiter}${env.PATH ?? ''}`
}

const child = spawn(command, args, { stdio: 'inherit', env })
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill(signal))
child.on('error', (error) => {
  console.error(`idemkey: could not run ${command}: ${error.message}`)
  process.exit(1)
})
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)))
