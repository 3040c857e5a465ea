#!/usr/bin/env node
/**
 * The suites that run beyond the main line (`npm test` runs everything on one maintained Node.js):
 * - on every other supported Node.js line: the store contract suites (src/stores: every store, both
 *   SQLite drivers), the demo, the docs' examples and the package-consumer install, under vitest (its
 *   type checks, which no Node.js line changes, run once, in the main suite: IDEMKEY_TYPECHECKS);
 * - on Bun and on Deno 2: test/runtimes/portable.runtime.mjs (the ledger, the stores, the fetch and
 *   Hono adapters and idempotentFetch, against the built package and the real servers).
 * test/package-managers.test.ts, in the main suite, installs the tarball with npm 12 and pnpm on every line.
 *
 * The store models' property runs (src/testing/store-model.ts) are capped at 100 random sequences a model
 * on the other lines (`IDEMKEY_MODEL_RUNS`, unless set): what a line can break is the runtime and its
 * drivers under every operation, which 100 sequences exercise; the 1,000 that search the state machine's
 * corners run on the main line, where the same code meets the same servers. That takes the lines from
 * 165 s to about 125 s each on CI's two cores, with every test file still run.
 *
 * Usage: npm run test:runtimes [-- node22 node26 bun deno]   (default: all of them)
 * Node.js releases, Bun and Deno come from the npm registry (scripts/runtimes.mjs), cached after the first run.
 */
import { spawnSync } from 'node:child_process'
import { delimiter, dirname, join } from 'node:path'
import { MAIN_LINE, NODE_LINES, nodeBinary, ROOT, toolCommand } from './runtimes.mjs'

const NODE_SUITES = ['src/stores', 'test/cli-demo.test.ts', 'test/docs-examples.test.ts', 'test/package-consumer.test.ts']
const PORTABLE = 'test/runtimes/portable.runtime.mjs'

const otherLines = Object.keys(NODE_LINES)
  .map(Number)
  .filter((line) => line !== MAIN_LINE)
const all = [...otherLines.map((line) => `node${line}`), 'bun', 'deno']
const wanted = process.argv.slice(2).length > 0 ? process.argv.slice(2) : all
const unknown = wanted.filter((name) => !all.includes(name))
if (unknown.length > 0) {
  console.error(`test-runtimes: unknown ${unknown.join(', ')}; expected some of ${all.join(', ')}`)
  process.exit(2)
}

function onPath(binary, env = process.env) {
  return { ...env, PATH: `${dirname(binary)}${delimiter}${env.PATH ?? ''}` }
}

function step(name, command, args, env) {
  console.log(`\n=== test-runtimes: ${name}: ${[command, ...args].join(' ')}`)
  const started = Date.now()
  const result = spawnSync(command, args, { cwd: ROOT, stdio: 'inherit', env })
  const seconds = ((Date.now() - started) / 1000).toFixed(0)
  const ok = result.status === 0
  console.log(`=== test-runtimes: ${name}: ${ok ? 'passed' : `FAILED (exit ${result.status ?? result.signal})`} in ${seconds}s`)
  return { name, ok, seconds }
}

// The portable suite imports dist/: brought up to date on the main line (built only when older than its
// sources: after \`npm test\`, as in CI, it is current).
const main = nodeBinary(MAIN_LINE)
const results = [step('build', main, [join(ROOT, 'scripts/build-if-stale.mjs'), '--dist'], onPath(main))]
for (const name of wanted) {
  if (name.startsWith('node')) {
    const node = nodeBinary(Number(name.slice(4)))
    results.push(
      step(`Node.js ${name.slice(4)}`, node, [join(ROOT, 'node_modules/vitest/vitest.mjs'), 'run', ...NODE_SUITES], {
        ...onPath(node),
        IDEMKEY_TYPECHECKS: 'main-line-only',
        IDEMKEY_MODEL_RUNS: process.env.IDEMKEY_MODEL_RUNS ?? '100',
      }),
    )
  } else if (name === 'bun') {
    const [bun] = toolCommand('bun')
    results.push(step('Bun', bun, ['test', `./${PORTABLE}`], process.env))
  } else {
    const [deno] = toolCommand('deno')
    results.push(step('Deno', deno, ['test', '--allow-all', PORTABLE], { ...process.env, NO_COLOR: '1' }))
  }
}

console.log('\ntest-runtimes summary:')
for (const r of results) console.log(`  ${r.ok ? 'passed' : 'FAILED'}  ${r.name} (${r.seconds}s)`)
process.exit(results.every((r) => r.ok) ? 0 : 1)
