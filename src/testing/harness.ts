import { createRequire } from 'node:module'
import { join } from 'node:path'

type Fn = () => unknown

/** The four functions of a test framework the suites need (vitest, jest, mocha, node:test all have them). */
export interface TestHarness {
  describe(name: string, fn: () => void): void
  it(name: string, fn: Fn): void
  beforeAll(fn: Fn): void
  afterAll(fn: Fn): void
}

/** Options common to the exported suites. */
export interface SuiteOptions {
  /** The test framework's functions. @default the globals (vitest with `globals: true`, jest, mocha), else node:test */
  harness?: Partial<TestHarness>
  /**
   * When set, the suite is skipped and this reason is printed loudly (e.g. "PostgreSQL is not running");
   * `undefined` runs it, so a condition can be written in place: `skip: url ? undefined : 'no URL'`.
   */
  skip?: string | undefined
}

/** Finds describe/it/beforeAll/afterAll: given ones, then globals, then node:test. */
export function resolveHarness(given: Partial<TestHarness> = {}): TestHarness {
  const g = globalThis as Record<string, unknown>
  const pick = <K extends keyof TestHarness>(name: K, ...globals: string[]): TestHarness[K] | undefined =>
    (given[name] ?? globals.map((n) => g[n]).find((f) => typeof f === 'function')) as TestHarness[K] | undefined
  const describe = pick('describe', 'describe')
  const it = pick('it', 'it', 'test')
  const beforeAll = pick('beforeAll', 'beforeAll', 'before')
  const afterAll = pick('afterAll', 'afterAll', 'after')
  if (describe && it && beforeAll && afterAll) return { describe, it, beforeAll, afterAll }
  if (process.env.VITEST) {
    throw new Error(
      'idemkey/testing: describe/it are not globals here. Set `test.globals: true` in vitest.config, or pass { harness: { describe, it, beforeAll, afterAll } } imported from vitest.',
    )
  }
  // A built-in resolves the same from any directory; no import.meta, so the CommonJS build has it too.
  const nodeTest = createRequire(join(process.cwd(), 'noop.js'))('node:test') as Record<string, Fn>
  return {
    describe: nodeTest.describe as TestHarness['describe'],
    it: nodeTest.it as TestHarness['it'],
    beforeAll: nodeTest.before as TestHarness['beforeAll'],
    afterAll: nodeTest.after as TestHarness['afterAll'],
  }
}

/** Registers a skipped suite that says loudly why it did not run. */
export function describeSkipped(harness: TestHarness, name: string, reason: string): void {
  const banner = `\n!!! SKIPPED: ${name}: ${reason}\n`
  console.warn(banner)
  const skip = (harness.describe as { skip?: TestHarness['describe'] }).skip
  if (skip) skip(`${name} (SKIPPED: ${reason})`, () => harness.it('needs its server', () => {}))
}
