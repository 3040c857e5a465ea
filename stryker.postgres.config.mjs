// Mutation testing of the PostgreSQL store against the real server: `npm run mutate:postgres` (not in CI;
// hours on two cores: the store's suites run its contract and model on the plain and the partitioned
// layout). The mutants are the store's TypeScript (its SQL is mutated only as text: a broken statement
// fails at the server); the tests are the suites vitest.mutate-postgres.config.ts lists, on the server at
// 127.0.0.1:5432, each on tables of its own, so two test runners share it safely. docs/testing.md records
// the last score and the survivors accepted, with why.
import base from './stryker.config.mjs'

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  ...base,
  vitest: { configFile: 'vitest.mutate-postgres.config.ts', related: false },
  mutate: ['src/stores/postgres/**/*.ts', '!src/stores/postgres/**/*.test.ts'],
  incrementalFile: 'reports/mutation-postgres/stryker-incremental.json',
  htmlReporter: { fileName: 'reports/mutation-postgres/mutation.html' },
  jsonReporter: { fileName: 'reports/mutation-postgres/mutation.json' },
  tempDirName: '.stryker-tmp-postgres',
}
