// The unit suites on the same mutants as `npm run mutate:sim` (stryker.sim.config.mjs), so the
// simulator's score can be read beside theirs and the mutants they kill that it does not listed:
// `node scripts/with-node.mjs npx stryker run mutation/stryker.sim-units.config.mjs`.
import base from './stryker.config.mjs'
import { simMutate } from './stryker.sim.config.mjs'

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
const config = {
  ...base,
  vitest: { configFile: 'mutation/vitest.mutate-sim-units.config.ts', related: false },
  mutate: simMutate,
  incremental: false,
  reporters: ['clear-text', 'progress-append-only', 'json'],
  jsonReporter: { fileName: 'reports/mutation/sim-units/mutation.json' },
  tempDirName: '.stryker-tmp/sim-units',
  ignorePatterns: [...base.ignorePatterns, '.stryker-tmp'],
}
delete config.htmlReporter
delete config.incrementalFile

export default config
