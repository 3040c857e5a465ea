// Mutation testing of the rules idemkey's guarantees rest on: `npm run mutate` (not in CI: it runs
// for about half an hour on two cores). docs/testing.md records the last score and the survivors
// accepted, with why. Scope: the ledger, the fingerprint and its canonical JSON, the HTTP engine,
// and the acquire/renew/complete/release paths of the in-process stores; the tests are the fast
// suites that cover them (vitest.mutate.config.ts), never the server-backed or multi-process ones.
/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  testRunner: 'vitest',
  vitest: { configFile: 'vitest.mutate.config.ts', related: false },
  plugins: ['@stryker-mutator/vitest-runner'],
  mutate: [
    'src/core/ledger.ts',
    'src/core/run-core.ts',
    'src/core/attempt.ts',
    'src/core/renewal.ts',
    'src/core/waiter.ts',
    'src/core/fingerprint.ts',
    'src/core/canonical-json.ts',
    'src/http/engine.ts',
    'src/http/engine-config.ts',
    'src/http/engine-answers.ts',
    'src/http/engine-transaction.ts',
    // acquire, renew, complete and release (line ranges: move them with the methods)
    'src/stores/memory/memory-store.ts:48-134',
    'src/stores/sqlite/sqlite-store.ts:107-179',
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
