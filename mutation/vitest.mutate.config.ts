import { defineConfig } from 'vitest/config'

// The suites `npm run mutate` (stryker.config.mjs) runs for each mutant: in-process, no servers, no
// build. They include the HTTP conformance suite (seven frameworks over the engine) and the
// deterministic simulator (test/sim.test.ts), which drive the ledger, the engine and the memory store
// the way users and faults do.
export default defineConfig({
  test: {
    globals: true,
    include: [
      'src/core/**/*.test.ts',
      'src/backends/memory/*.test.ts',
      'src/backends/sqlite/*.test.ts',
      'src/http/http-engine.test.ts',
      'src/http/http-engine-parts.test.ts',
      'test/http-conformance.test.ts',
      'test/http-adapters.test.ts',
      'src/http/scope.test.ts',
      'test/client-http.test.ts',
      'test/client-forwarding.test.ts',
      'test/steps-http.test.ts',
      'test/sim.test.ts',
      'src/observability/observability.test.ts',
    ],
    // A time limit that instrumented code (every branch counted) cannot meet says nothing of a mutant;
    // the proxy's conformance runs the built CLI in a child process, which no mutant reaches.
    testNamePattern: '^(?!.*(without hanging|HTTP conformance: idemkey proxy))',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
})
