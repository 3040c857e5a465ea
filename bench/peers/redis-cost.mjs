/**
 * What each Redis-backed peers-bench app costs Redis: `node bench/peers/redis-cost.mjs idemkey-redis
 * node-idempotency-redis [...] [--seconds 6]`. Each app in turn gets new keys from autocannon while
 * `INFO commandstats` (reset before) counts the commands it sends, and /proc gives the CPU time of the
 * Redis process and of the app per request. Uses the Redis at 127.0.0.1:6379 (its statistics are reset).
 * Needs `npm run build` first; Linux only.
 */
import { execFileSync, spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { unlinkMatching } from './redis-cleanup.mjs'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const autocannon = createRequire(join(ROOT, 'package.json'))('autocannon')
const args = process.argv.slice(2)
const at = args.indexOf('--seconds')
const seconds = at < 0 ? 6 : Number(args.splice(at, 2)[1])
const cpuMicros = (pid) => {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')
  return (Number(fields[11]) + Number(fields[12])) * 10_000
}
const redisPid = Number(execFileSync('pgrep', ['-f', 'redis-server 127.0.0.1:6379']).toString().trim().split('\n')[0])
const BODY = JSON.stringify({ amount: 1299, currency: 'eur' })

for (const name of args) {
  const app = spawn(process.execPath, ['--import', 'tsx', 'bench/peers/server.ts', name], {
    cwd: ROOT,
    env: { ...process.env, IDEMKEY_SCOPE_SECRET: 'redis-cost-scope-secret-0123456789abcdef' },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const port = await new Promise((resolve) => app.stdout.once('data', (data) => resolve(JSON.parse(String(data)).port)))
  let n = 0
  const load = (duration) =>
    autocannon({
      url: `http://127.0.0.1:${port}/charges`,
      connections: 32,
      duration,
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: BODY,
      requests: [
        { setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': `cost-${name}-${Date.now()}-${n++}` } }) },
      ],
    })
  await load(2) // warm-up
  execFileSync('redis-cli', ['config', 'resetstat'])
  const redisBefore = cpuMicros(redisPid)
  const appBefore = cpuMicros(app.pid)
  const result = await load(seconds)
  const requests = result.requests.total
  const redisCpu = (cpuMicros(redisPid) - redisBefore) / requests
  const appCpu = (cpuMicros(app.pid) - appBefore) / requests
  const stats = execFileSync('redis-cli', ['info', 'commandstats']).toString()
  const commands = [...stats.matchAll(/cmdstat_([^:]+):calls=(\d+),usec=(\d+)/g)].filter(
    (m) => m[1] !== 'info' && m[1] !== 'config|resetstat',
  )
  const perRequest = commands.map((m) => `${m[1]} ${(Number(m[2]) / requests).toFixed(2)}`).join(', ')
  console.log(
    `${name.padEnd(28)} ${Math.round(requests / seconds)} req/s; commands a request: ${perRequest}; Redis CPU ${redisCpu.toFixed(1)} µs, app CPU ${appCpu.toFixed(1)} µs a request`,
  )
  app.kill('SIGTERM')
  await new Promise((resolve) => app.once('exit', resolve))
}

// The records the apps wrote (tens of thousands a run): idemkey's under its bench prefix, the peers'
// under this script's `cost-` keys.
await unlinkMatching(['peers-idemkey:*', 'cost-*', '*:cost-*'])
