// Mutation testing of the PostgreSQL store against the real server: `npm run mutate:postgres` (not in CI;
// hours on two cores: the store's suites run its contract and model on the plain and the partitioned
// layout). The mutants are the store's TypeScript (its SQL is mutated only as text: a broken statement
// fails at the server); the tests are the suites vitest.mutate-postgres.config.ts lists, on the server at
// 127.0.0.1:5432, each on tables of its own, so two test runners share it safely. docs/testing.md records
// the last score and the survivors accepted, with why.
import { storeRun } from './stryker.config.mjs'

export default storeRun('postgres', [
  'src/backends/postgres/**/*.ts',
  '!src/backends/postgres/**/*.test.ts',
  'src/backends/end-pool.ts',
  'src/backends/sql/rows.ts',
  'src/backends/sql/prepared-names.ts',
])
