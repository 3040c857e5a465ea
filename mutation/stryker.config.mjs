// Mutation testing of the rules idemkey's guarantees rest on: `npm run mutate` (not in CI: the whole
// scope runs for about an hour and a half on two cores with --concurrency 2). docs/testing.md records the
// last score and the survivors accepted, with why. Scope: all of src/core/, the HTTP engine, and the
// in-process stores; the tests are the in-process suites that cover them, the HTTP conformance suite and
// the deterministic simulator included (mutation/vitest.mutate.config.ts), never the server-backed or
// multi-process ones. Run from the repository root (the npm scripts do): every path in these configs,
// the vitest configs beside them included, is relative to it, not to this folder.
/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
const config = {
  testRunner: 'vitest',
  vitest: { configFile: 'mutation/vitest.mutate.config.ts', related: false },
  plugins: ['@stryker-mutator/vitest-runner'],
  mutate: [
    // The ledger and everything it rests on (src/core/), the HTTP engine, and the two in-process stores.
    'src/core/**/*.ts',
    '!src/core/**/*.test.ts',
    'src/protocol/key-header.ts',
    'src/protocol/response-headers.ts',
    'src/http/engine.ts',
    'src/http/engine-config.ts',
    'src/http/engine-answers.ts',
    'src/http/engine-transaction.ts',
    'src/backends/memory/memory-store.ts',
    'src/backends/sqlite/sqlite-store.ts',
    'src/backends/sqlite/statements.ts',
  ],
  coverageAnalysis: 'perTest',
  // Static mutants (module-level constants) need every test to rerun each; not worth the hours here.
  ignoreStatic: true,
  concurrency: 1,
  timeoutMS: 20_000,
  incremental: true,
  incrementalFile: 'reports/mutation/stryker-incremental.json',
  reporters: ['clear-text', 'progress-append-only', 'html', 'json'],
  htmlReporter: { fileName: 'reports/mutation/mutation.html' },
  jsonReporter: { fileName: 'reports/mutation/mutation.json' },
  tempDirName: '.stryker-tmp',
  ignorePatterns: ['dist', 'bench', '.bench-tmp', 'reports', '*.db', '*.db-wal', '*.db-shm', '.docs-examples'],
  thresholds: { high: 90, low: 80, break: null },
}

export default config

/**
 * One server-backed store's run (stryker.<store>.config.mjs): its files, the suites
 * vitest.mutate-<store>.config.ts lists, and reports and a sandbox of its own, so runs of two stores
 * never share them.
 * @param {string} store
 * @param {string[]} mutate
 * @returns {import('@stryker-mutator/api/core').PartialStrykerOptions}
 */
export function storeRun(store, mutate) {
  return {
    ...config,
    vitest: { configFile: `mutation/vitest.mutate-${store}.config.ts`, related: false },
    mutate,
    incrementalFile: `reports/mutation-${store}/stryker-incremental.json`,
    htmlReporter: { fileName: `reports/mutation-${store}/mutation.html` },
    jsonReporter: { fileName: `reports/mutation-${store}/mutation.json` },
    tempDirName: `.stryker-tmp-${store}`,
  }
}
