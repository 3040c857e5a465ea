#!/usr/bin/env node
// The idemkey command: the compiled CLI lives in dist/, built by `prepack` into the published package. In a
// source checkout (npm install builds nothing: the package has no install script) it is built here first
// when missing or older than src/, so `npm install && npx idemkey demo` on a fresh clone runs the sources.
import { existsSync } from 'node:fs'

const [major, minor] = process.versions.node.split('.').map(Number)
const checkout = new URL('../scripts/runtimes.mjs', import.meta.url)
if ((major < 22 || (major === 22 && minor < 16)) && !process.versions.bun && !process.versions.deno && existsSync(checkout)) {
  // A source checkout on a Node.js older than the oldest supported (this machine's Node 20, say):
  // run the same command on the project's tested Node.js, fetched once from the npm registry.
  const { MAIN_LINE, nodeBinary } = await import(checkout.href)
  const { spawn } = await import('node:child_process')
  const node = nodeBinary(MAIN_LINE)
  process.stderr.write(
    `idemkey: Node.js ${process.version} is not supported (22.16+, 24, 26 are); running on Node.js ${MAIN_LINE} (${node}).\n`,
  )
  // The IPC channel tells the command when this process is gone, even by SIGKILL (see below).
  const child = spawn(node, [new URL(import.meta.url).pathname, ...process.argv.slice(2)], {
    stdio: ['inherit', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, IDEMKEY_WRAPPED: '1' },
  })
  // A supervisor's SIGTERM or SIGHUP is for the command: pass it on (a proxy drains, then exits).
  for (const signal of ['SIGTERM', 'SIGHUP']) process.on(signal, () => child.kill(signal))
  // Ctrl-C at a terminal already reaches the command (same process group); passing it on as well
  // would be a second SIGINT, which ends a draining proxy at once. Without a terminal, a SIGINT can
  // only be sent to this process (PM2 stops an app so): pass it on.
  const terminal = process.stdin.isTTY || process.stdout.isTTY || process.stderr.isTTY
  process.on('SIGINT', () => {
    if (!terminal) child.kill('SIGINT')
  })
  child.on('error', (error) => {
    process.stderr.write(`idemkey: could not start Node.js ${MAIN_LINE} (${node}): ${error.message}\n`)
    process.exit(1)
  })
  child.on('exit', (code, signal) => {
    if (signal === null) process.exit(code ?? 1)
    // Ended by a signal: end the same way, so a shell or supervisor sees what the command saw.
    process.removeAllListeners(signal)
    process.kill(process.pid, signal)
  })
} else {
  if (process.env.IDEMKEY_WRAPPED === '1' && process.channel) {
    // Run by the wrapper above: when it is gone (killed, even by SIGKILL), stop as on SIGTERM rather
    // than run on orphaned, holding a port or a store. The channel itself keeps nothing alive.
    delete process.env.IDEMKEY_WRAPPED
    process.channel.unref()
    process.once('disconnect', () => process.kill(process.pid, 'SIGTERM'))
  }
  const build = new URL('../scripts/build-if-stale.mjs', import.meta.url)
  if (existsSync(build)) {
    const { distState } = await import(build.href)
    if (distState() !== 'current') {
      const { spawnSync } = await import('node:child_process')
      // Its output goes to stderr: the command's stdout (--json) stays its own.
      const result = spawnSync(process.execPath, [new URL(build).pathname, '--dist'], { stdio: ['ignore', 2, 2] })
      if (result.status !== 0) {
        process.stderr.write('idemkey: building dist/ from this checkout failed (the output is above); fix it, or run `npm run build`.\n')
        process.exit(1)
      }
    }
  }
  await import('../dist/cli/main.js')
}
