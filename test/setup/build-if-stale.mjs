// Brings what the tests run up to date with the sources, run by test/setup/fresh-build.ts under the
// build lock (so two test runs, or a test run and a build, never build over each other):
// - src/stores/redis/lua.generated.ts, regenerated when any src/stores/redis/lua/*.lua is newer;
// - with `--dist`, dist/ (the CLI, the proxy, the package), rebuilt with `npm run build` when any
//   file it is built from is newer than the last finished build.
// Exits non-zero when a build fails; its output is on stderr.
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'

const ROOT = join(import.meta.dirname, '..', '..')
process.chdir(ROOT)

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

const mtime = (path) => (existsSync(path) ? statSync(path).mtimeMs : 0)

/** Paths of src/ that go into dist/: not tests, not the generated Lua (the build writes it itself). */
const built = (path) => !/\.test(-d)?\.ts$/.test(path) && !path.endsWith('lua.generated.ts')

function run(command, args) {
  const result = spawnSync(command, args, { stdio: ['ignore', 2, 2] })
  if (result.status !== 0) process.exit(result.status ?? 1)
}

const LUA = 'src/stores/redis/lua.generated.ts'
const luaStale = () => newest('src/stores/redis/lua', (p) => p.endsWith('.lua')) > mtime(LUA)

if (process.argv.includes('--dist')) {
  // dist/cjs/package.json is the last file a build writes: its time is when that build finished.
  const finished = mtime('dist/cjs/package.json')
  const sources = Math.max(
    newest('src', built),
    ...['scripts/build.mjs', 'scripts/gen-lua.mjs', 'tsconfig.json', 'tsconfig.build.json', 'tsconfig.build.cjs.json'].map(mtime),
  )
  if (finished === 0 || sources > finished || luaStale()) {
    process.stderr.write(
      finished === 0
        ? 'idemkey tests: no finished build in dist/, building it…\n'
        : 'idemkey tests: src/ changed since dist/ was built, rebuilding…\n',
    )
    run('npm', ['run', '--silent', 'build'])
  }
} else if (luaStale()) {
  run(process.execPath, ['scripts/gen-lua.mjs'])
}
