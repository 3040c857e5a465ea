import { defineConfig } from 'vitest/config'
import base from './vitest.mutate.config.js'

// The unit suites of the ledger core and the memory store (the suites of `npm run mutate` without the
// simulator, test/sim.test.ts, nor the HTTP suites): what they alone kill of the mutants
// `npm run mutate:sim` runs the simulator against.
export default defineConfig({
  test: {
    ...base.test,
    include: ['src/core/**/*.test.ts', 'src/backends/memory/*.test.ts'],
  },
})
