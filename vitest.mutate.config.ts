import { defineConfig } from 'vitest/config'

// The suites `npm run mutate` (stryker.config.mjs) runs for each mutant: fast, in-process, no
// servers, no build. The HTTP conformance suite is left out: it boots seven frameworks for each
// mutant it covers (minutes per hundred mutants); the engine's rules are covered by http-engine.
export default defineConfig({
  test: {
    globals: true,
    include: [
      'src/core/**/*.test.ts',
      'src/stores/memory/*.test.ts',
      'src/stores/sqlite/*.test.ts',
      'test/http-engine.test.ts',
      'test/steps.test.ts',
      'test/observability.test.ts',
    ],
    // A time limit that instrumented code (every branch counted) cannot meet says nothing of a mutant.
    testNamePattern: '^(?!.*without hanging)',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
