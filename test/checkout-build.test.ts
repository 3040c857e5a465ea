/**
 * A fresh clone: `npm install` builds nothing (the package has no install script; `prepack` builds the
 * published one), so `npm install && npx idemkey demo` works because bin/idemkey.js builds dist/ from
 * the checkout's sources on its first run. Proven on a copy of the checkout without dist/ (its
 * node_modules linked to this one's, as `npm install` would have filled it).
 */
import { execFileSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { MAIN_LINE, nodeBinary, ROOT } from '../scripts/runtimes.mjs'
import { run, show } from './helpers/packed.js'

const clone = mkdtempSync(join(tmpdir(), 'idemkey-clone-'))
afterAll(() => rmSync(clone, { recursive: true, force: true }))

beforeAll(() => {
  // The files a clone has: tracked, and new ones not ignored (dist/ and node_modules/ are ignored).
  const files = execFileSync('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' })
  for (const file of files.split('\0').filter(Boolean)) {
    if (!existsSync(join(ROOT, file))) continue
    mkdirSync(dirname(join(clone, file)), { recursive: true })
    cpSync(join(ROOT, file), join(clone, file))
  }
  symlinkSync(join(ROOT, 'node_modules'), join(clone, 'node_modules'))
})

describe('a fresh clone after npm install (no dist/)', () => {
  it('builds dist/ on the first idemkey command, says so on stderr, then runs the demo', async () => {
    expect(existsSync(join(clone, 'dist'))).toBe(false)
    const node = nodeBinary(MAIN_LINE)
    const env = { PATH: `${dirname(node)}${delimiter}${process.env.PATH}` }
    const args = ['bin/idemkey.js', 'demo', '--intents', '6', '--workers', '1', '--json']
    const first = await run(node, args, clone, { env, timeoutMs: 400_000 })
    expect(first.code, show(first)).toBe(0)
    expect(first.stderr).toContain('no finished build in dist/ (npm install builds nothing), building it')
    expect(JSON.parse(first.stdout)).toMatchObject({ passed: true, intents: 6, protected: { doubleCharges: 0 } })
    const second = await run(node, [...args.slice(0, 2), '--intents', '4', '--workers', '1', '--json'], clone, { env })
    expect(second.code, show(second)).toBe(0)
    expect(second.stderr).not.toContain('building it')
  })
})
