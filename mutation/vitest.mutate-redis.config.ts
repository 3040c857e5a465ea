import { defineConfig } from 'vitest/config'

// The suites `npm run mutate:redis` (stryker.redis.config.mjs) runs for each mutant of the Redis store:
// its contract and model on a URL, an ioredis client and a node-redis client, and the suites that pin
// the record's layout and format, the store's rules, the errors, the clients (one starts a Redis
// Cluster of its own for the node-redis cluster adapter), key names, scans, notifications and the
// compare-and-set complete. Each uses its own random prefix on the Redis at 127.0.0.1:6379. Left out:
// the ioredis cluster, crash and multi-process suites (minutes each), and the model's real-time runs (below).
export default defineConfig({
  test: {
    globals: true,
    include: [
      'src/backends/redis/redis-store.test.ts',
      'src/backends/redis/redis-node-redis.test.ts',
      'src/backends/redis/redis-layout.test.ts',
      'src/backends/redis/redis-errors.test.ts',
      'test/redis-restarts.test.ts',
      'src/backends/redis/redis-notifications.test.ts',
      'src/backends/redis/redis-compare-and-set.test.ts',
      'src/backends/redis/redis-compare-and-set-args.test.ts',
      'src/backends/redis/redis-store-rules.test.ts',
      'src/backends/redis/redis-record-format.test.ts',
      'src/backends/redis/redis-clients.test.ts',
      'src/backends/redis/redis-keys-scan-notify.test.ts',
    ],
    // The real-time model runs (about 11 s each, on the server's clock) would make each mutant cost a minute;
    // the same model's random command sequences and the contract stay.
    testNamePattern: '^(?!.*(without hanging|in real time on the server))',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
