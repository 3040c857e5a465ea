import { defineConfig } from 'vitest/config'
import { SlowestFirstSequencer } from './test/setup/sequencer.js'

export default defineConfig({
  test: {
    // The exported contract suite (idemkey/testing) finds describe/it on globalThis.
    globals: true,
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    // Every way of running the tests tests the current sources: stale Lua or dist/ is rebuilt first.
    globalSetup: ['test/setup/fresh-build.ts'],
    // Generous: the property-based store models run 1,000 sequences against a real server, about 40 s on
    // an idle 2-core host and past 60 s on a slow one (2026-11-25: a host 2.6x slower failed the
    // partitioned PostgreSQL steps model at 60 s). A hung test still fails, three minutes in.
    testTimeout: 180_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // Two cores: more workers only make the store and crash tests fight for CPU.
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    // The slowest files first, so the two workers end together (test/setup/sequencer.ts).
    sequence: { sequencer: SlowestFirstSequencer },
    reporters: ['default'],
  },
})
