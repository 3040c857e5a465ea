/**
 * `npm test` on a machine without an optional tool (libfaketime, Chromium): the suites that need one
 * skip with a loud `!!! SKIPPED` banner and the rest of their files pass; in CI the same absence fails
 * the run. Proven by running those files in a child vitest with the tools hidden
 * (`IDEMKEY_TEST_WITHOUT`, honoured by test/helpers/services.ts), as on a laptop or a bare CI image: the
 * clock-skew file crashed at collection (`Cannot destructure property 'dynamo' of 'dynamoDb'`), since
 * vitest runs a skipped describe's body to collect it.
 */
import { join } from 'node:path'
import { isSupportedNode, MAIN_LINE, nodeBinary, ROOT } from '../scripts/runtimes.mjs'
import { runNode } from './helpers/cli.js'

/** Every suite that needs an optional tool, by the name IDEMKEY_TEST_WITHOUT hides it under. */
const SUITES = { faketime: 'test/clock-skew.test.ts', chromium: 'test/operator-page.test.ts' }

/** vitest on these files in a child, on a supported Node.js (node:sqlite), with `env` over a clean CI. */
async function vitestWithout(env: NodeJS.ProcessEnv) {
  const node = isSupportedNode() ? process.execPath : nodeBinary(MAIN_LINE)
  const args = [join(ROOT, 'node_modules/vitest/vitest.mjs'), 'run', ...Object.values(SUITES)]
  const { CI: _ci, ...rest } = process.env
  return runNode(args, { cwd: ROOT, env: { ...rest, IDEMKEY_TEST_WITHOUT: Object.keys(SUITES).join(','), ...env }, node })
}

describe('suites that need libfaketime or Chromium, on a machine without them', () => {
  it('skip with a loud message, and the rest of their files pass (the clock-skew file crashed at collection)', async () => {
    const out = await vitestWithout({})
    const output = `${out.stdout}${out.stderr}`
    expect(out.code, output).toBe(0)
    expect(output).toContain('!!! SKIPPED (faketime missing): clock-skew tests')
    expect(output).toContain('!!! SKIPPED (chromium missing): operator page browser test')
    expect(output).not.toMatch(/TypeError|Cannot destructure/)
  })

  it('fail the run in CI, saying what to install', async () => {
    const out = await vitestWithout({ CI: 'true' })
    const output = `${out.stdout}${out.stderr}`
    expect(out.code, output).not.toBe(0)
    expect(output).toContain('CI=true and clock-skew tests: no faketime (apt-get install faketime)')
    expect(output).toContain('CI=true and operator page browser test: no chromium')
  })
})
