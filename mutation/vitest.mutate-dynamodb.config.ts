import { defineConfig } from 'vitest/config'

// The suites `npm run mutate:dynamodb` (stryker.dynamodb.config.mjs) runs for each mutant of the DynamoDB
// store: its contract and model (on your client and on a single-table layout), its specifics, its rules
// (option checks, migrate, item format, size limit, list and purge, errors, close) and the driver suite
// (the SDK client it builds, its errors). Each test file starts a dynalite server of its own.
export default defineConfig({
  test: {
    globals: true,
    include: [
      'src/backends/dynamodb/dynamodb-store.test.ts',
      'test/dynamodb-driver.test.ts',
      'src/backends/dynamodb/dynamodb-store-rules.test.ts',
    ],
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
