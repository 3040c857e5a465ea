// Mutation testing of the Redis store against a real Redis: `npm run mutate:redis` (not in CI; about
// 40 minutes on two cores with --concurrency 2). The mutants are the store's TypeScript (the Lua scripts
// are not mutated); the tests are the suites vitest.mutate-redis.config.ts lists, on the server at
// 127.0.0.1:6379 with a fresh prefix per suite, so two test runners share it safely.
// docs/testing.md records the last score and the survivors accepted, with why.
import { storeRun } from './stryker.config.mjs'

export default storeRun('redis', [
  'src/stores/redis/redis-store.ts',
  'src/stores/redis/record.ts',
  'src/stores/redis/keys.ts',
  'src/stores/redis/notifier.ts',
  'src/stores/redis/client.ts',
  'src/stores/redis/node-redis.ts',
  'src/stores/redis/scan.ts',
])
