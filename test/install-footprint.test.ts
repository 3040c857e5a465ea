/**
 * `npm i idemkey` installs idemkey and nothing else (issue 58): the packed tarball installed into an empty
 * project leaves one package in node_modules, and the command still runs from there (`idemkey --help`,
 * `idemkey demo`), on Node.js built-ins only.
 */
import { mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs'
import { rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ensureBuilt, run, show } from './helpers/packed.js'

const ROOT = join(import.meta.dirname, '..')
const work = mkdtempSync(join(tmpdir(), 'idemkey-footprint-'))
const project = join(work, 'app')

/** The packages in a node_modules folder (a scope's packages each count), without npm's own files. */
function packagesIn(dir: string): string[] {
  return readdirSync(dir)
    .filter((name) => !name.startsWith('.'))
    .flatMap((name) => (name.startsWith('@') ? readdirSync(join(dir, name)).map((inner) => `${name}/${inner}`) : [name]))
}

beforeAll(async () => {
  await ensureBuilt()
  const pack = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], ROOT)
  if (pack.code !== 0) throw new Error(`npm pack failed\n${show(pack)}`)
  const tarball = join(work, (JSON.parse(pack.stdout) as Array<{ filename: string }>)[0]?.filename as string)
  mkdirSync(project, { recursive: true })
  writeFileSync(join(project, 'package.json'), `${JSON.stringify({ name: 'footprint', version: '1.0.0', private: true }, null, 2)}\n`)
  const install = await run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', tarball], project, { timeoutMs: 240_000 })
  if (install.code !== 0) throw new Error(`npm install failed\n${show(install)}`)
}, 420_000)

afterAll(async () => {
  await rm(work, { recursive: true, force: true })
}, 120_000)

describe('npm i idemkey', () => {
  it('installs idemkey and no other package', () => {
    expect(packagesIn(join(project, 'node_modules')).filter((name) => name !== '.bin')).toEqual(['idemkey'])
  })

  it('runs `idemkey --help` and `idemkey demo` from the installed package', async () => {
    const bin = join(project, 'node_modules/.bin/idemkey')
    const help = await run(process.execPath, [bin, '--help'], project)
    expect(help.code, show(help)).toBe(0)
    expect(help.stdout).toContain('Usage: idemkey [options] [command]')
    const demo = await run(process.execPath, [bin, 'demo', '--intents', '12', '--workers', '1', '--json'], project, { timeoutMs: 120_000 })
    expect(demo.code, show(demo)).toBe(0)
    expect((JSON.parse(demo.stdout) as { passed: boolean }).passed).toBe(true)
    const npx = await run('npx', ['--no', '--', 'idemkey', 'size', '--writes', '100', '--json'], project)
    expect(npx.code, show(npx)).toBe(0)
  }, 180_000)
})
