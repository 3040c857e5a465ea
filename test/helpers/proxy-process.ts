import { type ChildProcess, spawn } from 'node:child_process'
import { join } from 'node:path'

/** The built CLI, as users run it (`npm test` builds first). */
export const BIN = join(import.meta.dirname, '..', '..', 'bin/idemkey.js')

/** A running `idemkey proxy` child process. */
export interface ProxyProcess {
  child: ChildProcess
  port: number
  /** Everything it wrote to stderr so far. */
  stderr: () => string
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
}

/** Options of {@link startProxy}. */
export interface StartProxyOptions {
  /** Environment variables to set; `undefined` removes one from the child's environment. */
  env?: Record<string, string | undefined>
  /** Run under this open-file limit (`ulimit -n`); `exec` keeps the pid, so /proc/<pid> is the proxy's own. */
  openFiles?: number
}

/**
 * Starts the built `idemkey proxy` on a free port with `args`, and resolves once it prints its
 * listening line. Every child is added to `children`, so the suite can kill what is left in afterAll.
 *
 * @example
 * const proxy = await startProxy(['--upstream', url, '--store', 'memory:'], children)
 */
export function startProxy(args: string[], children: ChildProcess[], options: StartProxyOptions = {}): Promise<ProxyProcess> {
  const env = { ...process.env }
  for (const [name, value] of Object.entries(options.env ?? {})) {
    if (value === undefined) delete env[name]
    else env[name] = value
  }
  const argv = [BIN, 'proxy', '--port', '0', ...args]
  const child =
    options.openFiles === undefined
      ? spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'], env })
      : spawn('sh', ['-c', `ulimit -n ${options.openFiles} && exec "$0" "$@"`, process.execPath, ...argv], {
          stdio: ['ignore', 'pipe', 'pipe'],
          env,
        })
  children.push(child)
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((done) =>
    child.once('exit', (code, signal) => done({ code, signal })),
  )
  return new Promise((resolve, reject) => {
    let out = ''
    let err = ''
    child.stderr?.on('data', (chunk) => (err += chunk))
    child.stdout?.on('data', (chunk) => {
      out += chunk
      const match = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out)
      if (match) resolve({ child, port: Number(match[1]), stderr: () => err, exited })
    })
    child.once('exit', (code) => reject(new Error(`proxy exited with ${code}: ${err}`)))
  })
}
