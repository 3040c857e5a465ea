/**
 * What the tests that install the packed tarball share (test/package-consumer.test.ts,
 * test/next-app.test.ts, test/package-managers.test.ts): running a command in a scratch project with a clean environment, and making
 * sure dist/ is current before `npm pack`.
 */
import { spawn } from 'node:child_process'
import { existsSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'

const ROOT = join(import.meta.dirname, '..', '..')

export interface Result {
  code: number | null
  stdout: string
  stderr: string
}

/** The environment of a child: npm's own variables dropped, so an outer `npm test` cannot redirect a nested npm. */
export function childEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {}
  for (const [name, value] of Object.entries(process.env)) {
    if (!/^npm_/i.test(name) && name !== 'INIT_CWD' && name !== 'NODE_OPTIONS') env[name] = value
  }
  return { ...env, ...extra }
}

/** Runs a command to its end (a non-zero exit is a result, not a throw); kills it after `timeoutMs`. */
export function run(command: string, args: string[], cwd: string, options: { env?: Record<string, string>; timeoutMs?: number } = {}) {
  return new Promise<Result>((resolve, reject) => {
    const child = spawn(command, args, { cwd, env: childEnv(options.env), stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    child.stderr.on('data', (chunk) => (stderr += chunk))
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs ?? 120_000)
    child.once('error', reject)
    child.once('close', (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })
}

export const show = (r: Result) => `exit ${r.code}\n--- stdout\n${r.stdout.slice(-4000)}\n--- stderr\n${r.stderr.slice(-4000)}`

/** Newest modification time of the files under `dir` that `keep` accepts. */
function newest(dir: string, keep: (path: string) => boolean): number {
  let latest = 0
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    const path = join(entry.parentPath, entry.name)
    if (entry.isFile() && keep(path)) latest = Math.max(latest, statSync(path).mtimeMs)
  }
  return latest
}

/**
 * `npm test` builds before vitest starts, so the tarball is packed from that build (rebuilding here
 * would rewrite dist/ under the feet of the CLI suites running beside this one). Run alone after an
 * edit, this file builds first, as `npm pack`'s prepack step would.
 */
export async function ensureBuilt(): Promise<void> {
  const dist = join(ROOT, 'dist')
  const sources = Math.max(
    newest(join(ROOT, 'src'), (p) => /\.(ts|lua)$/.test(p) && !/\.test(-d)?\.ts$/.test(p) && !p.endsWith('lua.generated.ts')),
    newest(join(ROOT, 'scripts'), () => true),
    ...readdirSync(ROOT)
      .filter((name) => /^tsconfig.*\.json$/.test(name))
      .map((name) => statSync(join(ROOT, name)).mtimeMs),
  )
  if (existsSync(join(dist, 'index.js')) && newest(dist, () => true) >= sources) return
  const build = await run('npm', ['run', 'build'], ROOT, { timeoutMs: 180_000 })
  if (build.code !== 0) throw new Error(`npm run build failed\n${show(build)}`)
}
