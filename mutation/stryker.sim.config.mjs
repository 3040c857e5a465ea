// The simulator as an oracle (issue 57): `npm run mutate:sim` runs the deterministic simulator, and only
// it, against each mutant of the memory store and the ledger's core: the same 250 seeds every time
// (`sim/main.ts --seeds 250 --bail`, about 25,000 simulated requests), in one thread, stopping at the first failing seed. A mutant is killed when a
// seed breaks an invariant (the sim exits 1) or the run hangs past the timeout. docs/testing.md
// ("Mutation testing: the simulator as an oracle") records the last score beside the unit suites' on the
// same mutants (stryker.sim-units.config.mjs). Run from the repository root, as the npm script does.
/** The files both runs mutate: the memory store (the store the simulator runs) and the ledger's core. */
export const simMutate = [
  'src/backends/memory/memory-store.ts',
  'src/core/ledger.ts',
  'src/core/store-calls.ts',
  'src/core/renewal.ts',
  'src/core/held.ts',
  'src/core/attempt.ts',
  'src/core/steps.ts',
  'src/core/fingerprint.ts',
]

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
const config = {
  testRunner: 'command',
  commandRunner: { command: 'node --import tsx sim/main.ts --seeds 250 --workers 1 --bail' },
  mutate: simMutate,
  // The command runner runs every mutant with the one command: no coverage to narrow it by.
  coverageAnalysis: 'off',
  // ignoreStatic needs perTest coverage; the static mutants, which the unit run ignores, are left out of the comparison.
  ignoreStatic: false,
  concurrency: 1,
  // A run stuck in a loop of events stops itself in a tenth of a second per seed ("no progress", 250 events
  // an intent) and --bail stops at the first failing seed, so only a loop that never yields to the
  // scheduler (a synchronous loop, an endless chain of promises) reaches the timeout: 2.5 s plus 1.5 times
  // the first run (about 4 s), about 8.5 s.
  timeoutMS: 2_500,
  timeoutFactor: 1.5,
  reporters: ['clear-text', 'progress-append-only', 'json'],
  jsonReporter: { fileName: 'reports/mutation/sim/mutation.json' },
  tempDirName: '.stryker-tmp/sim',
  ignorePatterns: ['dist', 'bench', '.bench-tmp', 'reports', '.stryker-tmp', '*.db', '*.db-wal', '*.db-shm', '.docs-examples'],
  thresholds: { high: 90, low: 80, break: null },
}

export default config
