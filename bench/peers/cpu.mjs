/**
 * CPU time per request of peers-bench apps, loaded side by side: `node bench/peers/cpu.mjs
 * idemkey-memory node-idempotency-memory [--seconds 6] [--rounds 3] [--connections 16] [--together]
 * [--prof]`. Each app runs in its own process (bench/peers/server.ts) and gets new keys from
 * autocannon; the figure is the process's user + system CPU (from /proc) over the requests it
 * answered, and its read and write system calls per request (/proc/<pid>/io). With `--together` every app is loaded at the same time, so all of them share whatever
 * else the machine does: the comparison moves least that way. `--prof` writes a V8 CPU profile per
 * app to bench/peers/profiles/. Needs `npm run build` first; Linux only (/proc).
 */
import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { unlinkMatching } from './redis-cleanup.mjs'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const autocannon = createRequire(join(ROOT, 'package.json'))('autocannon')
const args = process.argv.slice(2)
const flag = (name) => {
  const at = args.indexOf(name)
  if (at < 0) return false
  args.splice(at, 1)
  return true
}
const option = (name, fallback) => {
  const at = args.indexOf(name)
  if (at < 0) return fallback
  const value = Number(args[at + 1])
  args.splice(at, 2)
  return value
}
const seconds = option('--seconds', 6)
const rounds = option('--rounds', 3)
const connections = option('--connections', 16)
const together = flag('--together')
const prof = flag('--prof')
if (args.length === 0) {
  console.error(
    'usage: node bench/peers/cpu.mjs <adapter> [<adapter> ...] [--together] [--seconds s] [--rounds n] [--connections n] [--prof]',
  )
  process.exit(2)
}
const TICKS_PER_SECOND = 100
/** The process's CPU so far in seconds: user (JavaScript, V8, libuv) and system (the kernel: sockets, epoll). */
const cpuSeconds = (pid) => {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')
  return { user: Number(fields[11]) / TICKS_PER_SECOND, system: Number(fields[12]) / TICKS_PER_SECOND }
}
/** The process's read and write system calls so far (each socket read or write, writev included). */
const syscalls = (pid) => {
  const io = Object.fromEntries(
    readFileSync(`/proc/${pid}/io`, 'utf8')
      .trim()
      .split('\n')
      .map((line) => line.split(': ')),
  )
  return { reads: Number(io.syscr), writes: Number(io.syscw) }
}
const BODY = JSON.stringify({ amount: 1299, currency: 'eur' })

const servers = []
for (const name of args) {
  const child = spawn(
    process.execPath,
    [
      ...(prof ? ['--cpu-prof', `--cpu-prof-dir=${join(ROOT, 'bench', 'peers', 'profiles')}`] : []),
      '--import',
      'tsx',
      'bench/peers/server.ts',
      name,
    ],
    {
      cwd: ROOT,
      env: { ...process.env, IDEMKEY_SCOPE_SECRET: 'cpu-bench-scope-secret-0123456789abcdef' },
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  )
  const port = await new Promise((resolve) => child.stdout.once('data', (data) => resolve(JSON.parse(String(data)).port)))
  servers.push({ name, child, port })
}

function load(server, duration) {
  let n = 0
  const prefix = `cpu-${server.name}-${Date.now()}-`
  return autocannon({
    url: `http://127.0.0.1:${server.port}/charges`,
    connections,
    duration,
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': 'x' },
    body: BODY,
    requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': `${prefix}${n++}` } }) }],
  })
}

async function measure(group) {
  const before = group.map((server) => cpuSeconds(server.child.pid))
  const callsBefore = group.map((server) => syscalls(server.child.pid))
  const results = await Promise.all(group.map((server) => load(server, seconds)))
  return group.map((server, i) => {
    const requests = results[i].requests.total
    const calls = syscalls(server.child.pid)
    const cpu = cpuSeconds(server.child.pid)
    const user = ((cpu.user - before[i].user) / requests) * 1e6
    const system = ((cpu.system - before[i].system) / requests) * 1e6
    return {
      name: server.name,
      rate: Math.round(requests / seconds),
      micros: user + system,
      user,
      system,
      writes: (calls.writes - callsBefore[i].writes) / requests,
      reads: (calls.reads - callsBefore[i].reads) / requests,
      failed: results[i].non2xx + results[i].errors,
    }
  })
}

for (const server of servers) await load(server, 2) // warm-up
const rows = Object.fromEntries(servers.map((server) => [server.name, []]))
for (let round = 0; round < rounds; round++) {
  const groups = together ? [servers] : (round % 2 ? [...servers].reverse() : servers).map((server) => [server])
  for (const group of groups) for (const row of await measure(group)) rows[row.name].push(row)
}
console.log(
  `CPU per request, new keys, ${connections} connections, ${rounds} round(s) of ${seconds} s${together ? ', all apps loaded at once' : ''}:`,
)
for (const [name, measured] of Object.entries(rows)) {
  const cells = measured.map(
    (row) =>
      `${row.rate} req/s ${row.micros.toFixed(1)} µs (${row.user.toFixed(0)} user, ${row.system.toFixed(0)} sys), ${row.writes.toFixed(2)} writes ${row.reads.toFixed(2)} reads${row.failed ? ` (${row.failed} failed)` : ''}`,
  )
  console.log(`${name.padEnd(28)} ${cells.join('  |  ')}`)
}
for (const server of servers) server.child.kill('SIGTERM')

// The Redis records the apps wrote (a few hundred thousand a run, kept for a day by their TTL): idemkey's
// under its bench prefix, the peers' under the `cpu-` keys of this script (node-idempotency adds a prefix).
// Left behind, they slow every SCAN on the server, the test suites' included.
if (args.some((name) => name.endsWith('redis') || name.endsWith('redis-node'))) {
  await unlinkMatching(['peers-idemkey:*', 'cpu-*', '*:cpu-*'])
}
