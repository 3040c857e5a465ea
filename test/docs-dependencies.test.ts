/**
 * `npm i idemkey` installs idemkey and nothing else: package.json has no `dependencies`, and docs/cli.md
 * says so instead of listing packages the command once needed.
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'

const ROOT = join(import.meta.dirname, '..')

describe('docs/cli.md: what installing idemkey installs', () => {
  it('package.json has no dependencies, and docs/cli.md says so', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { dependencies?: Record<string, string> }
    expect(pkg.dependencies).toBeUndefined()
    const doc = readFileSync(join(ROOT, 'docs/cli.md'), 'utf8')
    expect(doc).toContain('`npm i idemkey` installs idemkey and nothing else')
    for (const gone of ['commander', 'cli-progress', 'pino', 'prom-client', 'undici']) expect(doc).not.toContain(`\`${gone}\``)
  })
})
