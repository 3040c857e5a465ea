// Mutation testing of the MySQL/MariaDB store against the real server: `npm run mutate:mysql` (not in CI).
// The mutants are the store's TypeScript and the group commit it shares with PostgreSQL (its SQL is
// mutated only as text: a broken statement fails at the server); the tests are the suites
// vitest.mutate-mysql.config.ts lists, on the server at 127.0.0.1:3306, each on tables of its own, so two
// test runners share it safely. docs/testing.md records the last score and the survivors accepted, with why.
import { storeRun } from './stryker.config.mjs'

export default storeRun('mysql', [
  'src/backends/mysql/**/*.ts',
  '!src/backends/mysql/**/*.test.ts',
  'src/backends/group-commit.ts',
  'src/backends/end-pool.ts',
  'src/backends/sql/rows.ts',
])
