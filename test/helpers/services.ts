import { existsSync } from 'node:fs'
import { connect, createServer } from 'node:net'

/**
 * Whether a service answers on a loopback port. Store tests that need a server use this:
 * on a user's machine a missing server skips the suite with a loud message; in CI (see {@link isCI}) it is
 * a failure, so a missing service can never turn into a silent green.
 */
export async function portOpen(port: number, host = '127.0.0.1', timeoutMs = 1_000): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ port, host })
    const done = (open: boolean) => {
      socket.destroy()
      resolve(open)
    }
    socket.setTimeout(timeoutMs, () => done(false))
    socket.once('connect', () => done(true))
    socket.once('error', () => done(false))
  })
}

/**
 * Whether the tests run in CI, read the way CI systems set it: GitHub Actions, GitLab, CircleCI,
 * Travis and Buildkite set `CI=true`; others set `CI=1`, `CI=yes` or a name. Any non-empty value but
 * `false`/`0`/`no`/`off` counts, so a missing service is a failure there, never a skip.
 */
export function isCI(env: NodeJS.ProcessEnv = process.env): boolean {
  const value = env.CI?.trim().toLowerCase()
  return value !== undefined && value !== '' && !['false', '0', 'no', 'off'].includes(value)
}

/**
 * Returns `undefined` when the service is up, or the reason to skip. Throws in CI.
 *
 * @example
 * const skip = await serviceSkipReason('PostgreSQL', 5432)
 * describeStore('postgres', factory, { skip })
 */
export async function serviceSkipReason(name: string, port: number, host = '127.0.0.1'): Promise<string | undefined> {
  if (!hidden(name) && (await portOpen(port, host))) return undefined
  const reason = `${name} is not answering on ${host}:${port}. Start it (see README, "Running the tests") to run these tests.`
  if (isCI()) {
    throw new Error(`CI=${process.env.CI} and ${reason}`)
  }
  // Loud in every file that skips, so a missing server is never mistaken for a green run.
  console.warn(`\n!!! SKIPPED (${name} down): ${reason}\n`)
  return reason
}

/** A loopback port free right now (the OS picks it), for a server a test starts itself. */
export async function freePort(): Promise<number> {
  for (;;) {
    const port = await new Promise<number>((resolve, reject) => {
      const server = createServer()
      server.once('error', reject)
      server.listen(0, '127.0.0.1', () => {
        const { port } = server.address() as { port: number }
        server.close(() => resolve(port))
      })
    })
    // The kernel may hand a port just closed to the next caller: tests that start servers at once (the docs'
    // quick starts run concurrently, each curling `localhost`, which tries ::1 first) would then reach each
    // other's. A port is handed out once per process, and only when ::1 has it free too.
    if (handedOut.has(port) || !(await freeOn('::1', port))) continue
    handedOut.add(port)
    return port
  }
}

const handedOut = new Set<number>()

/** Whether `port` can be bound on `host` now (true when the host has no such address, as ::1 without IPv6). */
function freeOn(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer()
    server.once('error', (error: NodeJS.ErrnoException) => resolve(error.code !== 'EADDRINUSE'))
    server.listen(port, host, () => server.close(() => resolve(true)))
  })
}

/**
 * Whether `IDEMKEY_TEST_WITHOUT` (a comma-separated list: `faketime,chromium,Redis`) names this tool or
 * service: the suites then behave as on a machine without it (test/optional-tools.test.ts collects them
 * so, proving that a missing tool skips loudly rather than crashing).
 */
function hidden(name: string): boolean {
  const names = (process.env.IDEMKEY_TEST_WITHOUT ?? '').split(',').map((word) => word.trim().toLowerCase())
  return names.includes(name.toLowerCase())
}

/**
 * The first of `paths` that exists, for a suite that needs an optional tool (libfaketime, Chromium), or
 * `undefined` to skip it: loudly on a developer's machine, and a failure in CI (where .ci/run installs
 * it). A suite skipped so must run nothing at collection that needs the tool (vitest runs the body of a
 * `describe.skipIf` to collect it): set up in `beforeAll`.
 */
export function toolPath(tool: {
  name: string
  suite: string
  paths: readonly (string | undefined)[]
  install: string
}): string | undefined {
  const path = hidden(tool.name) ? undefined : tool.paths.find((candidate): candidate is string => !!candidate && existsSync(candidate))
  if (path) return path
  const reason = `${tool.suite}: no ${tool.name} (${tool.install})`
  if (isCI()) throw new Error(`CI=${process.env.CI} and ${reason}; .ci/run installs it.`)
  console.warn(`\n!!! SKIPPED (${tool.name} missing): ${reason}\n`)
  return undefined
}
