import { defineConfig } from 'vitest/config'

// The suites `npm run mutate:postgres` (stryker.postgres.config.mjs) runs for each mutant of the
// PostgreSQL store: its contract and model on both layouts, group commit, partitions, notifications,
// setup, timeouts and transactions, and its rules (src/backends/postgres/postgres-store-rules.test.ts: options, errors,
// statements, list and purge, its own transactions, layouts) and src/backends/postgres/postgres-rotation-rules.test.ts (partitions,
// rotation, the gc loop) and src/backends/postgres/postgres-listener.test.ts (the shared LISTEN connection). Each uses tables of its own on the server at 127.0.0.1:5432.
export default defineConfig({
  test: {
    globals: true,
    include: [
      'src/backends/postgres/*.test.ts',
      'src/backends/postgres/postgres-store-rules.test.ts',
      'src/backends/postgres/postgres-rotation-rules.test.ts',
      'src/backends/postgres/postgres-listener.test.ts',
    ],
    // The model's random sequences, fewer of them (IDEMKEY_MODEL_RUNS caps numRuns), and not its real-time
    // runs (about 15 s each, on the server's clock). The contract stays whole.
    env: { IDEMKEY_MODEL_RUNS: '100' },
    testNamePattern: '^(?!.*in real time on the server)',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
