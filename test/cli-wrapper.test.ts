/**
 * bin/idemkey.js on a Node.js older than 22.16 in a source checkout (this machine's Node 20): it runs
 * the command on the project's Node.js as a child. Signals meant for the command must reach it, and
 * the command must not outlive the wrapper.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { eventually } from './helpers/eventually.js'

const ROOT = join(import.meta.dirname, '..')
const BIN = join(ROOT, 'bin/idemkey.js')

/** The machine's own Node.js when it is one the wrapper takes over from, else why not. */
function oldNode(): { path?: string; skip?: string } {
  for (const path of ['/usr/bin/node', '/usr/local/bin/node']) {
    if (!existsSync(path)) continue
    const [major, minor] = execFileSync(path, ['-p', 'process.versions.node'], { encoding: 'utf8' }).trim().split('.').map(Number)
    if ((major as number) < 22 || (major === 22 && (minor as number) < 16)) return { path }
  }
  return { skip: 'no Node.js older than 22.16 on this machine (/usr/bin/node, /usr/local/bin/node): the wrapper is not used here' }
}

const node = oldNode()
if (node.skip) console.warn(`\n*** SKIPPED test/cli-wrapper.test.ts: ${node.skip}\n`)

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

interface Wrapped {
  wrapper: ChildProcess
  /** The command's own process (the child the wrapper started), from the proxy's log. */
  commandPid: number
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
  output: () => string
}

const started: number[] = []

function startWrappedProxy(): Promise<Wrapped> {
  const wrapper = spawn(node.path as string, [BIN, 'proxy', '--port', '0', '--upstream', 'http://127.0.0.1:9', '--store', 'memory:'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((done) =>
    wrapper.once('exit', (code, signal) => done({ code, signal })),
  )
  let out = ''
  return new Promise((resolve, reject) => {
    // The listening line is on stdout, the log (with the command's pid) on stderr: either may come last.
    const onData = (chunk: Buffer) => {
      out += chunk
      const pid = /"pid":(\d+)/.exec(out)
      if (pid && /listening on http:\/\/127\.0\.0\.1:\d+/.test(out)) {
        if (!started.includes(Number(pid[1]))) started.push(Number(pid[1]))
        resolve({ wrapper, commandPid: Number(pid[1]), exited, output: () => out })
      }
    }
    wrapper.stdout?.on('data', onData)
    wrapper.stderr?.on('data', onData)
    wrapper.once('exit', (code) => reject(new Error(`the wrapped proxy exited with ${code}: ${out}`)))
  })
}

describe.skipIf(node.skip !== undefined)('bin/idemkey.js on an older Node.js (the wrapper)', () => {
  beforeAll(() => {
    if (!existsSync(join(ROOT, 'dist/cli/main.js'))) throw new Error('dist/cli/main.js is missing: run `npm run build` first.')
  })

  afterAll(() => {
    for (const pid of started) if (alive(pid)) process.kill(pid, 'SIGKILL')
  })

  it('passes SIGTERM on to the command: the proxy drains and stops, and the wrapper exits as it did', async () => {
    const { wrapper, commandPid, exited, output } = await startWrappedProxy()
    expect(commandPid).not.toBe(wrapper.pid)
    wrapper.kill('SIGTERM')
    expect(await exited).toEqual({ code: 0, signal: null })
    expect(output()).toContain('idemkey proxy: SIGTERM, draining')
    await eventually(() => !alive(commandPid), "the command's process to be gone", 10_000)
  })

  it('passes SIGINT on to the command when there is no terminal (a supervisor such as PM2 stops an app so): the proxy drains and stops', async () => {
    const { wrapper, commandPid, exited, output } = await startWrappedProxy()
    wrapper.kill('SIGINT')
    expect(await exited).toEqual({ code: 0, signal: null })
    expect(output()).toContain('idemkey proxy: SIGINT, draining')
    await eventually(() => !alive(commandPid), "the command's process to be gone", 10_000)
  })

  it('stops the command when the wrapper is killed outright (SIGKILL), instead of leaving it running with its port', async () => {
    const { wrapper, commandPid, exited } = await startWrappedProxy()
    wrapper.kill('SIGKILL')
    expect((await exited).signal).toBe('SIGKILL')
    await eventually(() => !alive(commandPid), "the command's process to be gone", 10_000)
  })

  it("exits with the command's own status", async () => {
    const wrapper = spawn(node.path as string, [BIN, 'size', '--window', '0s'], { stdio: ['ignore', 'ignore', 'pipe'] })
    let err = ''
    wrapper.stderr.on('data', (chunk) => (err += chunk))
    const code = await new Promise<number | null>((done) => wrapper.once('exit', done))
    expect(err).toContain('is not supported (22.16+, 24, 26 are); running on Node.js 24')
    expect(code).not.toBe(0)
    const direct = spawn(process.execPath, [BIN, 'size', '--window', '0s'], { stdio: 'ignore' })
    expect(await new Promise<number | null>((done) => direct.once('exit', done))).toBe(code)
  })
})
