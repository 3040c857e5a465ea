import { connect } from 'node:net'

/**
 * Whether a service answers on a loopback port. Store tests that need a server use this:
 * on a user's machine a missing server skips the suite with a loud message; in CI (CI=true) it is
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
 * Returns `undefined` when the service is up, or the reason to skip. Throws in CI.
 *
 * @example
 * const skip = await serviceSkipReason('PostgreSQL', 5432)
 * describeStore('postgres', factory, { skip })
 */
export async function serviceSkipReason(name: string, port: number, host = '127.0.0.1'): Promise<string | undefined> {
  if (await portOpen(port, host)) return undefined
  const reason = `${name} is not answering on ${host}:${port}. Start it (see README, "Running the tests") to run these tests.`
  if (process.env.CI === 'true' || process.env.CI === '1') {
    throw new Error(`CI=true and ${reason}`)
  }
  // Loud in every file that skips, so a missing server is never mistaken for a green run.
  console.warn(`\n!!! SKIPPED (${name} down): ${reason}\n`)
  return reason
}
