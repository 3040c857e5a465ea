// Brings what a source checkout runs up to date with its sources: run by the tests' set-up
// (test/setup/fresh-build.ts), `npm run typecheck` (bench/ and the consumer fixtures import the package
// by name, which resolves to dist/) and bin/idemkey.js in a checkout (npm install builds nothing: the
// package has no install script, and is built by `prepack` for `npm pack` and `npm publish`).
// - src/backends/redis/lua.generated.ts, regenerated when any src/backends/redis/lua/*.lua is newer;
// - with `--dist`, dist/ (the CLI, the proxy, the package), rebuilt with `npm run build` when it is
//   missing or any file it is built from is newer than the last finished build.
// A build runs under the machine's build lock (`flock /tmp/build.lock`, where flock exists), so two test
// runs, a test run and a command, never build over each other; what is current takes no lock.
// Exits non-zero when a build fails; its output is on stderr.
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = join(import.meta.dirname, '..')
/** The lock every build on this machine takes. */
const LOCK = '/tmp/build.lock'

/** The newest modification time (ms) of the files under `dir` that `keep` accepts, 0 when none. */
function newest(dir, keep) {
  let latest = 0
  if (!existsSync(dir)) return latest
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile()) continue
    const path = join(entry.parentPath ?? entry.path, entry.name)
    if (keep(path)) latest = Math.max(latest, statSync(path).mtimeMs)
  }
  return latest
}

const mtime = (path) => (existsSync(join(ROOT, path)) ? statSync(join(ROOT, path)).mtimeMs : 0)

/** Paths of src/ that go into dist/: not tests, not the generated Lua (the build writes it itself). */
const built = (path) => !/\.test(-d)?\.ts$/.test(path) && !path.endsWith('lua.generated.ts')

const LUA = 'src/backends/redis/lua.generated.ts'
const luaStale = () => newest(join(ROOT, 'src/backends/redis/lua'), (p) => p.endsWith('.lua')) > mtime(LUA)

/** Whether dist/ has a finished build (`missing` when not), and whether it is older than its sources. */
export function distState() {
  // dist/cjs/package.json is the last file a build writes: its time is when that build finished.
  const finished = mtime('dist/cjs/package.json')
  if (finished === 0) return 'missing'
  const sources = Math.max(
    newest(join(ROOT, 'src'), built),
    ...['scripts/build.mjs', 'scripts/gen-lua.mjs', 'tsconfig.json', 'tsconfig.build.json', 'tsconfig.build.cjs.json'].map(mtime),
  )
  return sources > finished || luaStale() ? 'stale' : 'current'
}

function run(command, args) {
  const result = spawnSync(command, args, { cwd: ROOT, stdio: ['ignore', 2, 2] })
  if (result.status !== 0) process.exit(result.status ?? 1)
}

function main(args) {
  const dist = args.includes('--dist')
  const stale = () => (dist ? distState() !== 'current' : luaStale())
  if (!stale()) return
  if (!args.includes('--locked') && spawnSync('flock', ['--version'], { stdio: 'ignore' }).status === 0) {
    // Again under the lock, which sees what a build that held it meanwhile left.
    run('flock', [LOCK, process.execPath, fileURLToPath(import.meta.url), ...args, '--locked'])
    return
  }
  if (dist) {
    const state = distState()
    if (state === 'current') return
    process.stderr.write(
      state === 'missing'
        ? 'idemkey: no finished build in dist/ (npm install builds nothing), building it…\n'
        : 'idemkey: src/ changed since dist/ was built, rebuilding…\n',
    )
    run('npm', ['run', '--silent', 'build'])
  } else if (luaStale()) {
    run(process.execPath, ['scripts/gen-lua.mjs'])
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) main(process.argv.slice(2))
