// The package build, run by `npm run build` (and so by `npm pack` and `npm publish`, through prepack):
// - dist/: ESM, every subpath plus the CLI and the demo;
// - dist/cjs/: CommonJS, every library subpath, for require() and TypeScript's CommonJS settings
//   (its package.json says so, and its .d.ts files are read as CommonJS declarations).
// The JavaScript is emitted without comments and the declarations with them, in two passes per build
// (tsc's removeComments would strip the declarations' doc comments too): the doc comments reach users'
// editors through the .d.ts files, and the code's own comments would be a quarter of the tarball. The
// declaration passes type-check; the JavaScript passes skip it (--noCheck), having nothing to add.
// Declarations no export reaches are then removed (scripts/prune-declarations.mjs).
// dist/ is emptied first, so a module that was removed from src/ is never shipped.
import { spawn } from 'node:child_process'
import { rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { pruneDeclarations } from './prune-declarations.mjs'

process.chdir(join(import.meta.dirname, '..'))
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc')

function run(args) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { stdio: 'inherit' })
    child.once('error', reject)
    child.once('exit', (code, signal) => (code === 0 ? resolve() : reject(new Error(`${args.join(' ')} failed (${signal ?? code})`))))
  })
}

try {
  rmSync('dist', { recursive: true, force: true })
  await run(['scripts/gen-lua.mjs'])
  const passes = ['tsconfig.build.json', 'tsconfig.build.cjs.json'].flatMap((project) => [
    [tsc, '-p', project, '--removeComments', '--declaration', 'false', '--noCheck'],
    [tsc, '-p', project, '--emitDeclarationOnly'],
  ])
  const builds = await Promise.allSettled(passes.map(run))
  const failed = builds.find((result) => result.status === 'rejected')
  if (failed) throw failed.reason
  // Declarations no public subpath reaches (internal modules, the CLI) are never read by a user's compiler.
  pruneDeclarations('dist')
  writeFileSync('dist/cjs/package.json', `${JSON.stringify({ type: 'commonjs' }, null, 2)}\n`)
} catch (error) {
  process.stderr.write(`build: ${error.message}\n`)
  process.exit(1)
}
