import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    // The exported contract suite (idemkey/testing) finds describe/it on globalThis.
    globals: true,
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // Every way of running the tests tests the current sources: stale Lua or dist/ is rebuilt first.
    globalSetup: ['test/setup/fresh-build.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // Two cores: more workers only make the store and crash tests fight for CPU.
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    reporters: ['default'],
  },
})
