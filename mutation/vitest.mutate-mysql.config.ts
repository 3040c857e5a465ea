import { defineConfig } from 'vitest/config'

// The suites `npm run mutate:mysql` (stryker.mysql.config.mjs) runs for each mutant of the MySQL store:
// the suites beside it in src/backends/mysql/ (contract, model, group commit, setup, transactions, and its
// rules in mysql-store-rules.test.ts: options, errors, list and purge, batches, migrate, queryTimeout on
// half-open connections), and the durable steps in your transaction. Each uses tables of its own on the
// server at 127.0.0.1:3306. Paths are from the repository root, where stryker runs.
export default defineConfig({
  test: {
    globals: true,
    include: ['src/backends/mysql/*.test.ts', 'test/steps-transaction.test.ts'],
    // The model's random sequences, fewer of them (IDEMKEY_MODEL_RUNS caps numRuns), and not its real-time
    // runs (about 17 s, on the server's clock): a mutant costs seconds, not a minute. The contract stays whole.
    env: { IDEMKEY_MODEL_RUNS: '150' },
    testNamePattern: '^(?!.*in real time on the server)',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
