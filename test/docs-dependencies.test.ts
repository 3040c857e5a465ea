/**
 * docs/cli.md's table of what installing idemkey installs names exactly the package's `dependencies`:
 * it listed fastify-plugin (no dependency) and left out pino and prom-client.
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'

const ROOT = join(import.meta.dirname, '..')

/** The packages named (in backticks) in the first column of the table under `header`. */
function tablePackages(markdown: string, header: string): string[] {
  const start = markdown.indexOf(header)
  if (start === -1) throw new Error(`docs/cli.md has no table headed "${header}"`)
  const rows = markdown.slice(start).split('\n').slice(2)
  const table = rows.slice(
    0,
    rows.findIndex((row) => !row.startsWith('|')),
  )
  return table.flatMap((row) => [...(row.split('|')[1] ?? '').matchAll(/`([^`]+)`/g)].map((match) => match[1] as string))
}

describe('docs/cli.md: what installing idemkey installs', () => {
  it("lists exactly package.json's dependencies", () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string> }
    const listed = tablePackages(readFileSync(join(ROOT, 'docs/cli.md'), 'utf8'), '| package | why it is a dependency |')
    expect(listed.sort()).toEqual(Object.keys(pkg.dependencies).sort())
  })
})
