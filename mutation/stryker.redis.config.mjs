// Mutation testing of the Redis store against a real Redis: `npm run mutate:redis` (not in CI; about
// 40 minutes on two cores with --concurrency 2). The mutants are the store's TypeScript (the Lua scripts
// are not mutated); the tests are the suites vitest.mutate-redis.config.ts lists, on the server at
// 127.0.0.1:6379 with a fresh prefix per suite, so two test runners share it safely.
// docs/testing.md records the last score and the survivors accepted, with why.
import { storeRun } from './stryker.config.mjs'

export default storeRun('redis', [
  'src/backends/redis/redis-store.ts',
  'src/backends/redis/fast-path.ts',
  'src/backends/redis/scripts.ts',
  'src/backends/redis/record.ts',
  'src/backends/redis/keys.ts',
  'src/backends/redis/notifier.ts',
  'src/backends/redis/client.ts',
  'src/backends/redis/node-redis.ts',
  'src/backends/redis/scan.ts',
])
