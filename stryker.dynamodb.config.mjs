// Mutation testing of the DynamoDB store against a real DynamoDB-compatible server: `npm run mutate:dynamodb`
// (not in CI). The mutants are the store's TypeScript; the tests are the suites
// vitest.mutate-dynamodb.config.ts lists, each on a dynalite server of its own (test/helpers/dynalite.ts),
// so two test runners never share a table. docs/testing.md records the last score and the survivors
// accepted, with why.
import base from './stryker.config.mjs'

/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  ...base,
  vitest: { configFile: 'vitest.mutate-dynamodb.config.ts', related: false },
  mutate: ['src/stores/dynamodb/dynamodb-store.ts', 'src/stores/dynamodb/schema.ts', 'src/stores/dynamodb/client.ts'],
  incrementalFile: 'reports/mutation-dynamodb/stryker-incremental.json',
  htmlReporter: { fileName: 'reports/mutation-dynamodb/mutation.html' },
  jsonReporter: { fileName: 'reports/mutation-dynamodb/mutation.json' },
  tempDirName: '.stryker-tmp-dynamodb',
}
