#!/usr/bin/env node
// The idemkey command: the compiled CLI lives in dist/ (npm install runs the build).
import { spawnSync } from 'node:child_process'
import { existsSync } from 'node:fs'

const [major, minor] = process.versions.node.split('.').map(Number)
const checkout = new URL('../scripts/runtimes.mjs', import.meta.url)
if ((major < 22 || (major === 22 && minor < 16)) && !process.versions.bun && !process.versions.deno && existsSync(checkout)) {
  // A source checkout on a Node.js older than the oldest supported (this machine's Node 20, say):
  // run the same command on the project's tested Node.js, fetched once from the npm registry.
  const { MAIN_LINE, nodeBinary } = await import(checkout.href)
  const node = nodeBinary(MAIN_LINE)
  process.stderr.write(
    `idemkey: Node.js ${process.version} is not supported (22.16+, 24, 26 are); running on Node.js ${MAIN_LINE} (${node}).\n`,
  )
  const result = spawnSync(node, [new URL(import.meta.url).pathname, ...process.argv.slice(2)], { stdio: 'inherit' })
  process.exit(result.status ?? 1)
}
await import('../dist/cli/main.js')
