import { defineConfig } from 'vitest/config'

// The suites `npm run mutate:postgres` (stryker.postgres.config.mjs) runs for each mutant of the
// PostgreSQL store: its contract and model on both layouts, group commit, partitions, notifications,
// setup, timeouts and transactions, and its rules (postgres-store-rules.test.ts: options, errors, statements,
// list and purge, its own transactions, layouts), postgres-rotation-rules.test.ts (partitions, rotation, the gc
// loop) and postgres-listener.test.ts (the shared LISTEN connection), all in src/backends/postgres/. Left out:
// the store on postgres.js (the contract and model once more) and the PgInbox suites. Each uses tables of its
// own on the server at 127.0.0.1:5432. Paths are from the repository root, where stryker runs.
export default defineConfig({
  test: {
    globals: true,
    include: ['src/backends/postgres/*.test.ts'],
    exclude: [
      'src/backends/postgres/postgres-js-store.test.ts',
      'src/backends/postgres/pg-inbox-connection.test.ts',
      'src/backends/postgres/pg-inbox-swallowed-error.test.ts',
    ],
    // The model's random sequences, fewer of them (IDEMKEY_MODEL_RUNS caps numRuns), and not its real-time
    // runs (about 15 s each, on the server's clock). The contract stays whole.
    env: { IDEMKEY_MODEL_RUNS: '100' },
    testNamePattern: '^(?!.*in real time on the server)',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
