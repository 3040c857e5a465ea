// Mutation testing of the DynamoDB store against a real DynamoDB-compatible server: `npm run mutate:dynamodb`
// (not in CI). The mutants are the store's TypeScript; the tests are the suites
// vitest.mutate-dynamodb.config.ts lists, each on a dynalite server of its own (test/helpers/dynalite.ts),
// so two test runners never share a table. docs/testing.md records the last score and the survivors
// accepted, with why.
import { storeRun } from './stryker.config.mjs'

export default storeRun('dynamodb', [
  'src/backends/dynamodb/dynamodb-store.ts',
  'src/backends/dynamodb/schema.ts',
  'src/backends/dynamodb/client.ts',
  'src/backends/dynamodb/requests.ts',
  'src/backends/dynamodb/migrate.ts',
])
