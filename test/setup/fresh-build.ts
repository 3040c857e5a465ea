/**
 * Vitest globalSetup: whatever way the tests are run (`npm test`, `npx vitest run some.test.ts`, an
 * editor's test runner), they test the current sources. The Redis store runs Lua generated from
 * src/backends/redis/lua; the CLI, proxy and package tests run dist/. Both are brought up to date here
 * when older than their sources (dist/ only when a selected test file runs it), by
 * scripts/build-if-stale.mjs, under the build lock that every build on this machine takes. When a build
 * fails the run stops with the reason, rather than test the code of an older build.
 */
import { spawnSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { join, relative } from 'node:path'

const ROOT = join(import.meta.dirname, '..', '..')
const SCRIPT = join(ROOT, 'scripts', 'build-if-stale.mjs')
/** A test file that runs the build: the CLI binary, the proxy helper, or dist/ itself. */
const USES_DIST = /\bdist\/|bin\/idemkey|proxy-process/
/** Vitest's commands, which are bare words too. */
const COMMANDS = new Set(['run', 'watch', 'dev', 'related', 'bench', 'list'])

function testFiles(): string[] {
  return ['src', 'test'].flatMap((dir) =>
    readdirSync(join(ROOT, dir), { recursive: true, encoding: 'utf8' })
      .filter((path) => /\.test\.ts$/.test(path))
      .map((path) => join(dir, path)),
  )
}

/**
 * Whether the selected test files need dist/. The command line's bare words are vitest's file
 * filters (a path or part of one); words that match no test file are option values, ignored.
 * No filter at all is the whole suite.
 */
export function needsDist(argv: string[], files = testFiles(), read = (path: string) => readFileSync(join(ROOT, path), 'utf8')): boolean {
  const words = argv
    .filter((word) => !word.startsWith('-') && !COMMANDS.has(word))
    .map((word) => relative(ROOT, join(process.cwd(), word)) || word)
  const selected = files.filter((file) => words.some((word) => file.includes(word)))
  const chosen = selected.length > 0 ? selected : files
  return chosen.some((file) => USES_DIST.test(read(file)))
}

export default function setup(): void {
  const args = [SCRIPT, ...(needsDist(process.argv.slice(2)) ? ['--dist'] : [])]
  const result = spawnSync(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'] })
  if (result.status !== 0) {
    throw new Error(
      'idemkey tests: building the current sources failed (the build output is above), so the tests would run an older build. Fix the build error, then run the tests again.',
    )
  }
}
