/**
 * How users install in late 2026: the packed tarball into a fresh project with npm 12 and with pnpm 12,
 * with their default script policies (dependency install scripts are not run, nothing approved), on
 * every supported Node.js line (22, 24, 26). Each install must succeed, and then `idemkey demo` and a
 * ledger on the embedded SQLite store, from code, must work: the embedded store needs no native build.
 * Neither npm 12 nor npm 11 may list an install script of idemkey's own (it is built by `prepack`).
 *
 * The Node.js releases, npm and pnpm come from the registry (scripts/runtimes.mjs, cached under
 * node_modules/.cache/idemkey-runtimes); the projects install from the registry like a user's would.
 */
import { spawn } from 'node:child_process'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { MAIN_LINE, NODE_LINES, nodeBinary, ROOT, TOOLS, toolCommand, withoutNpmConfig } from '../scripts/runtimes.mjs'
import { ensureBuilt } from './helpers/packed.js'

interface Result {
  code: number | null
  stdout: string
  stderr: string
}

function run(command: string, args: string[], cwd: string, options: { node: string; timeoutMs?: number }): Promise<Result> {
  return new Promise((resolve, reject) => {
    // The line's node first on PATH: npm, pnpm, the bin's `#!/usr/bin/env node` and the demo's workers all run on it.
    const env = { ...withoutNpmConfig(process.env), PATH: `${dirname(options.node)}${delimiter}${process.env.PATH}`, NODE_OPTIONS: '' }
    const child = spawn(command, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    child.stderr.on('data', (chunk) => (stderr += chunk))
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 240_000)
    child.once('error', reject)
    child.once('close', (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })
}

const show = (r: Result) => `exit ${r.code}\n--- stdout\n${r.stdout.slice(-3000)}\n--- stderr\n${r.stderr.slice(-3000)}`

/** A ledger on the embedded store, as a user's first file would have it. */
const LEDGER_FROM_CODE = `import { Ledger } from 'idemkey'
import { SqliteStore } from 'idemkey/sqlite'

const store = new SqliteStore({ path: 'ledger.db' })
const ledger = new Ledger({ store })
let charges = 0
const charge = () => ledger.run({ key: 'order-1', scope: 'billing', payload: { amount: 500 } }, async () => ({ charge: ++charges }))
const first = await charge()
const retry = await charge()
console.log(JSON.stringify({ driver: store.driver, charges, first: first.kind, retry: retry.kind, value: retry.kind === 'replayed' ? retry.value : null }))
await store.close()
`

const work = mkdtempSync(join(tmpdir(), 'idemkey-managers-'))
let tarball: string

beforeAll(async () => {
  // Fetched once into the cache (a first run downloads about 200 MB; later runs find them there).
  for (const line of Object.keys(NODE_LINES)) nodeBinary(Number(line))
  for (const tool of ['npm', 'npm11', 'pnpm'] as const) toolCommand(tool)
  await ensureBuilt()
  const pack = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], ROOT, { node: process.execPath })
  if (pack.code !== 0) throw new Error(`npm pack failed\n${show(pack)}`)
  tarball = join(work, (JSON.parse(pack.stdout) as Array<{ filename: string }>)[0]?.filename as string)
}, 900_000)
afterAll(() => rmSync(work, { recursive: true, force: true }))

const lines = Object.keys(NODE_LINES).map(Number)
/** npm 11 and 12 name each installed package with a script they hold back: `npm warn install-scripts   idemkey@0.1.0 (prepare: ...)`. */
const INSTALL_SCRIPT_OF_IDEMKEY = /install-scripts\s+idemkey@/

describe('the packed tarball declares no install-time script', () => {
  it(`installs with npm ${TOOLS.npm11} (on Node.js ${MAIN_LINE}) without an install-scripts warning naming idemkey (it listed prepare: npm run build)`, async () => {
    const node = nodeBinary(MAIN_LINE)
    const [command, ...prefix] = toolCommand('npm11', node)
    const dir = join(work, 'npm11')
    mkdirSync(dir)
    writeFileSync(join(dir, 'package.json'), `${JSON.stringify({ name: 'app-npm11', private: true, type: 'module' })}\n`)
    const install = await run(command, [...prefix, 'install', '--no-audit', '--no-fund', '--prefer-offline', tarball], dir, { node })
    expect(install.code, show(install)).toBe(0)
    expect(`${install.stdout}${install.stderr}`).not.toMatch(INSTALL_SCRIPT_OF_IDEMKEY)
  })
})

describe.each(['npm', 'pnpm'] as const)(`idemkey installed with %s (defaults: no install scripts run)`, (manager) => {
  describe.each(lines)('on Node.js %i', (line) => {
    let dir: string
    let node: string

    it(`installs with ${manager} ${TOOLS[manager]} and exits 0`, async () => {
      node = nodeBinary(line)
      const [command, ...prefix] = toolCommand(manager, node)
      dir = join(work, `${manager}-${line}`)
      mkdirSync(dir)
      writeFileSync(join(dir, 'package.json'), `${JSON.stringify({ name: `app-${manager}-${line}`, private: true, type: 'module' })}\n`)
      const args = manager === 'npm' ? ['install', '--no-audit', '--no-fund', '--prefer-offline', tarball] : ['add', tarball]
      const install = await run(command, [...prefix, ...args], dir, { node })
      expect(install.code, show(install)).toBe(0)
      expect(`${install.stdout}${install.stderr}`).not.toMatch(/ERR_PNPM_IGNORED_BUILDS|EBADENGINE|better-sqlite3/)
      expect(`${install.stdout}${install.stderr}`).not.toMatch(INSTALL_SCRIPT_OF_IDEMKEY)
    })

    it('runs `idemkey demo` on the embedded store', async () => {
      const [command, ...prefix] = toolCommand(manager, node)
      const demo = await run(command, [...prefix, 'exec', '--', 'idemkey', 'demo', '--intents', '12', '--workers', '1', '--json'], dir, {
        node,
        timeoutMs: 120_000,
      })
      expect(demo.code, show(demo)).toBe(0)
      expect(JSON.parse(demo.stdout)).toMatchObject({ passed: true, intents: 12, protected: { doubleCharges: 0 } })
    })

    it('runs a ledger on the embedded store from code: one charge, the retry replayed', async () => {
      writeFileSync(join(dir, 'ledger.mjs'), LEDGER_FROM_CODE)
      const out = await run(node, ['ledger.mjs'], dir, { node })
      expect(out.code, show(out)).toBe(0)
      expect(JSON.parse(out.stdout)).toEqual({
        driver: 'node:sqlite',
        charges: 1,
        first: 'executed',
        retry: 'replayed',
        value: { charge: 1 },
      })
    })
  })
})
