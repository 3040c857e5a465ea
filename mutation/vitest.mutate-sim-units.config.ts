import { defineConfig } from 'vitest/config'
import base from './vitest.mutate.config.js'

// The suites of `npm run mutate` without the simulator (test/sim.test.ts): what the unit and contract
// suites alone kill of the mutants `npm run mutate:sim` runs the simulator against.
export default defineConfig({
  test: {
    ...base.test,
    include: (base.test?.include ?? []).filter((file) => file !== 'test/sim.test.ts'),
  },
})
