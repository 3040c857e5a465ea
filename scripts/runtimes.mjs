/**
 * The runtimes and package managers idemkey is tested on, fetched from the npm registry on first use
 * into node_modules/.cache/idemkey-runtimes/ (the registry publishes Node.js itself as
 * `node-<platform>-<arch>`, and Bun, Deno, npm and pnpm as packages). Nothing is installed globally and
 * no install script runs: each package holds its binary.
 *
 * Used by scripts/with-node.mjs (the tests on a maintained Node.js when the machine's own is older),
 * scripts/test-runtimes.mjs (the other lines, Bun and Deno), the package-manager test, and bin/idemkey.js
 * in a source checkout.
 */
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..')
export const CACHE = process.env.IDEMKEY_RUNTIMES_CACHE ?? join(ROOT, 'node_modules/.cache/idemkey-runtimes')

/** The Node.js line the whole suite runs on when the machine's Node.js is older than the oldest supported. */
export const MAIN_LINE = 24
/** Every supported Node.js line, and the exact release tested on each (bumped on purpose, not by drift). */
export const NODE_LINES = { 22: '22.23.3', 24: '24.21.0', 26: '26.10.0' }
/** The oldest Node.js idemkey supports: node:sqlite unflagged with isOpen/isTransaction, module.registerHooks. */
export const MINIMUM_NODE = '22.16.0'
export const TOOLS = { npm: '12.2.0', npm11: '11.19.1', pnpm: '12.21.0', bun: '1.4.5', deno: '2.9.6' }

/** Whether this Node.js is a supported line (>= MINIMUM_NODE). */
export function isSupportedNode(version = process.versions.node) {
  const [major, minor] = version.split('.').map(Number)
  const [minMajor, minMinor] = MINIMUM_NODE.split('.').map(Number)
  return major > minMajor || (major === minMajor && minor >= minMinor)
}

/**
 * Installs `spec` (a registry package at an exact version) into its own folder of the cache, once,
 * with the npm that runs this script, and returns that folder. A half-done install never counts: it
 * goes into a temporary folder renamed into place at the end.
 */
function installOnce(name, spec) {
  const dir = join(CACHE, name)
  const marker = join(dir, '.installed')
  if (existsSync(marker) && readFileSync(marker, 'utf8') === spec) return dir
  const temp = `${dir}.tmp-${process.pid}`
  rmSync(temp, { recursive: true, force: true })
  mkdirSync(temp, { recursive: true })
  writeFileSync(join(temp, 'package.json'), '{"private":true}\n')
  process.stderr.write(`idemkey: fetching ${spec} from the npm registry into ${dir} (once)\n`)
  const npm = process.env.npm_execpath?.endsWith('npm-cli.js') ? [process.execPath, process.env.npm_execpath] : ['npm']
  execFileSync(
    npm[0],
    [...npm.slice(1), 'install', '--no-audit', '--no-fund', '--ignore-scripts', '--no-package-lock', '--loglevel=error', spec],
    { cwd: temp, stdio: ['ignore', 'ignore', 'inherit'], env: withoutNpmConfig(process.env) },
  )
  writeFileSync(join(temp, '.installed'), spec)
  rmSync(dir, { recursive: true, force: true })
  renameSync(temp, dir)
  return dir
}

/** The environment without the variables an outer `npm run` sets, which would redirect a nested npm. */
export function withoutNpmConfig(env) {
  const out = {}
  for (const [name, value] of Object.entries(env)) {
    if (!/^npm_/i.test(name) && name !== 'INIT_CWD') out[name] = value
  }
  return out
}

/** The `node` binary of a supported line (22, 24, 26), fetched on first use. */
export function nodeBinary(line) {
  const version = NODE_LINES[line]
  if (!version) throw new Error(`idemkey: no Node.js ${line} in NODE_LINES (${Object.keys(NODE_LINES).join(', ')})`)
  if (process.platform === 'win32') throw new Error('idemkey: fetching Node.js is supported on Linux and macOS only')
  const pkg = `node-${process.platform}-${process.arch}`
  const dir = installOnce(`node-${line}`, `${pkg}@${version}`)
  return join(dir, 'node_modules', pkg, 'bin', 'node')
}

/** Where a tool's entry point is: [the command, ...its leading arguments]. npm and pnpm run on `node`. */
export function toolCommand(tool, node = process.execPath) {
  // npm11: the npm line before 12 (Node 24's own), as the package `npm` at that version.
  const dir = installOnce(tool, `${tool === 'npm11' ? 'npm' : tool}@${TOOLS[tool]}`)
  const modules = join(dir, 'node_modules')
  switch (tool) {
    case 'npm':
    case 'npm11':
      return [node, join(modules, 'npm/bin/npm-cli.js')]
    case 'pnpm':
      return [node, join(modules, 'pnpm/bin/pnpm.mjs')]
    case 'bun':
      return [join(modules, `@oven/bun-${process.platform}-${process.arch}`, 'bin/bun')]
    case 'deno': {
      const arch = process.arch === 'arm64' ? 'arm64' : 'x64'
      const platform = process.platform === 'darwin' ? `darwin-${arch}` : `linux-${arch}-glibc`
      return [join(modules, `@deno/${platform}`, 'deno')]
    }
    default:
      throw new Error(`idemkey: unknown tool ${tool}`)
  }
}
