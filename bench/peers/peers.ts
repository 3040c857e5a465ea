/**
 * idemkey and the libraries users would pick instead, in front of the same Express 4 endpoint, in one
 * run: new keys (a fresh Idempotency-Key per request) and replays (one key answered from the store).
 * Each library's requests/s is divided by a bare Express app's, measured in alternating slices right
 * beside it (bare, library, library, bare, …), so the machine's drift cancels out of the ratio.
 *
 *   npm run bench:peers [-- --adapters idemkey-memory,node-idempotency-memory] [--duration 2] [--runs 4]
 *
 * --duration: seconds per slice (2); --runs: slices per side and scenario (4), the ratio being the median of adjacent pairs; --connections (50); --warmup (1 s).
 * Each app runs in its own process (server.ts); autocannon drives the load from this one. Writes
 * docs/benchmarks/peers.md and rebuilds docs/benchmarks.md. See bench/peers/README.md.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fmt, report, table } from '../lib.js'
import { ADAPTERS, type Adapter, IDEMKEY_POSTGRES_TABLE } from './adapters.js'
import { unlinkMatching } from './redis-cleanup.mjs'

interface CannonResult {
  requests: { total: number }
  duration: number
  latency: { p50: number; p99: number }
  '2xx': number
  non2xx: number
  errors: number
  timeouts: number
}
interface CannonRequest {
  headers: Record<string, string>
}
const require = createRequire(import.meta.url)
// autocannon ships no types: the little of it used here is declared above.
const autocannon = require('autocannon') as (options: Record<string, unknown>) => Promise<CannonResult>

const ROOT = join(import.meta.dirname, '..', '..')
const flag = (name: string): string | undefined => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : undefined
}
const number = (name: string, fallback: number): number => {
  const value = Number(flag(name) ?? fallback)
  if (!Number.isFinite(value) || value <= 0) throw new Error(`--${name} must be a positive number, got "${flag(name)}"`)
  return value
}
const DURATION = number('duration', 2)
const RUNS = number('runs', 4)
const CONNECTIONS = number('connections', 50)
const WARMUP = number('warmup', 1)
const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379'
const POSTGRES_URL = process.env.POSTGRES_URL ?? 'postgres://root@127.0.0.1:5432/test'
const BODY = JSON.stringify({ amount: 4200 })

const libraries = ADAPTERS.filter((a) => a.name !== 'bare')
const wanted = flag('adapters')?.split(',').filter(Boolean)
for (const name of wanted ?? []) {
  if (!libraries.some((a) => a.name === name)) {
    throw new Error(`--adapters: unknown "${name}"; known: ${libraries.map((a) => a.name).join(', ')}`)
  }
}
// The floors (not libraries) run only when named.
const selected = wanted ? libraries.filter((a) => wanted.includes(a.name)) : libraries.filter((a) => !a.name.startsWith('floor-'))

interface Server {
  name: string
  port: number
  child: ChildProcess
}
const children = new Set<ChildProcess>()
const sqliteDir = mkdtempSync(join(tmpdir(), 'idemkey-peers-'))

function start(name: string): Promise<Server> {
  const child = spawn(process.execPath, ['--import', 'tsx', join(import.meta.dirname, 'server.ts'), name], {
    cwd: ROOT,
    env: {
      ...process.env,
      REDIS_URL,
      POSTGRES_URL,
      PEERS_SQLITE_DIR: sqliteDir,
      // What a deployment sets for idemkey's default scope (a keyed hash of Authorization).
      IDEMKEY_SCOPE_SECRET: process.env.IDEMKEY_SCOPE_SECRET ?? 'peers-bench-scope-secret',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  children.add(child)
  let stderr = ''
  child.stderr?.on('data', (chunk) => {
    stderr += chunk
  })
  return new Promise((resolve, reject) => {
    let out = ''
    child.stdout?.on('data', (chunk) => {
      out += chunk
      const match = /"port":(\d+)/.exec(out)
      if (match) resolve({ name, port: Number(match[1]), child })
    })
    child.once('exit', (code) => {
      children.delete(child)
      reject(new Error(`${name} exited with ${code} before listening: ${stderr.trim().split('\n').slice(-3).join(' / ')}`))
    })
  })
}

async function stop(server: Server): Promise<void> {
  if (server.child.exitCode !== null) return
  const exited = new Promise((resolve) => server.child.once('exit', resolve))
  server.child.kill('SIGTERM')
  const timer = setTimeout(() => server.child.kill('SIGKILL'), 3_000)
  await exited
  clearTimeout(timer)
  children.delete(server.child)
}

async function executions(server: Server): Promise<number> {
  const response = await fetch(`http://127.0.0.1:${server.port}/__stats`)
  return ((await response.json()) as { executions: number }).executions
}

async function post(server: Server, key: string): Promise<number> {
  const response = await fetch(`http://127.0.0.1:${server.port}/charges`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: BODY,
  })
  await response.arrayBuffer()
  return response.status
}

const runId = Date.now().toString(36)
let sequence = 0

/** One slice of load: fresh keys (`new`) or one key completed before (`replay`). */
async function slice(server: Server, scenario: 'new' | 'replay', seconds: number, replayKey: string): Promise<CannonResult> {
  const prefix = `peers-${runId}-${server.name}-${++sequence}-`
  let i = 0
  const result = await autocannon({
    url: `http://127.0.0.1:${server.port}`,
    connections: CONNECTIONS,
    duration: seconds,
    requests: [
      {
        method: 'POST',
        path: '/charges',
        headers: { 'content-type': 'application/json', 'idempotency-key': replayKey },
        body: BODY,
        ...(scenario === 'new'
          ? {
              setupRequest: (req: CannonRequest) => {
                req.headers['idempotency-key'] = `${prefix}${i++}`
                return req
              },
            }
          : {}),
      },
    ],
  })
  return result
}

interface Side {
  requests: number
  seconds: number
  failed: number
  p99: number[]
}
interface Row {
  adapter: Adapter
  scenario: 'new' | 'replay'
  library: Side
  bare: Side
  /** Library requests/s over bare requests/s, one per adjacent pair of slices. */
  pairs: number[]
  /** Charges run by the library's app during the measured replay slices (must be 0). */
  replayExecutions: number
}

const emptySide = (): Side => ({ requests: 0, seconds: 0, failed: 0, p99: [] })
const add = (side: Side, result: CannonResult) => {
  side.requests += result['2xx']
  side.seconds += result.duration
  side.failed += result.non2xx + result.errors + result.timeouts
  side.p99.push(result.latency.p99)
}
const rate = (side: Side) => side.requests / side.seconds
/** The median: one slice hit by another process's burst of work does not move it. */
const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2
}

async function measure(bare: Server, library: Server, adapter: Adapter, scenario: 'new' | 'replay'): Promise<Row> {
  const replayKey = `peers-${runId}-${adapter.name}-replay`
  if (scenario === 'replay') {
    for (const server of [bare, library]) {
      const status = await post(server, replayKey)
      if (status !== 201) throw new Error(`${server.name}: the first request of the replay key answered ${status}, not 201`)
    }
    await new Promise((resolve) => setTimeout(resolve, 200)) // completion writes some peers do not await
  }
  await slice(library, scenario, WARMUP, replayKey)
  await slice(bare, scenario, WARMUP, replayKey)
  const row: Row = { adapter, scenario, library: emptySide(), bare: emptySide(), pairs: [], replayExecutions: 0 }
  const before = await executions(library)
  for (let run = 0; run < RUNS; run++) {
    // bare, library, library, bare, …: a drift in the machine's speed weighs on both sides alike.
    const order = run % 2 === 0 ? (['bare', 'library'] as const) : (['library', 'bare'] as const)
    const rates = { bare: 0, library: 0 }
    for (const side of order) {
      const result = await slice(side === 'bare' ? bare : library, scenario, DURATION, replayKey)
      add(row[side], result)
      rates[side] = result['2xx'] / result.duration
    }
    row.pairs.push(rates.library / rates.bare)
  }
  if (scenario === 'replay') row.replayExecutions = (await executions(library)) - before
  const ratio = median(row.pairs)
  console.log(
    `${adapter.name.padEnd(28)} ${scenario.padEnd(6)} ${fmt(rate(row.library)).padStart(7)} req/s, bare ${fmt(rate(row.bare)).padStart(7)} req/s: x${ratio.toFixed(2)}`,
  )
  return row
}

function version(name: string): string {
  try {
    return (JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')) as { version: string }).version
  } catch {
    return 'not installed'
  }
}

async function cleanUp(): Promise<void> {
  // Records the libraries wrote: every key of this bench starts with `peers-` (node-idempotency adds its own prefix).
  if (selected.some((a) => a.storage === 'redis')) await unlinkMatching(['peers-*', '*:peers-*'], REDIS_URL)
  if (selected.some((a) => a.storage === 'postgres')) {
    const { default: pg } = await import('pg')
    const client = new pg.Client({ connectionString: POSTGRES_URL })
    await client.connect()
    try {
      await client.query(`DROP TABLE IF EXISTS ${IDEMKEY_POSTGRES_TABLE}`)
    } finally {
      await client.end()
    }
  }
}

async function main(): Promise<void> {
  const started = Date.now()
  const rows: Row[] = []
  const skipped: string[] = []
  console.log(
    `peers: ${selected.map((a) => a.name).join(', ')}; ${RUNS} slice(s) of ${DURATION} s per side and scenario, ${CONNECTIONS} connections`,
  )
  const bare = await start('bare')
  try {
    for (const adapter of selected) {
      let library: Server
      try {
        library = await start(adapter.name)
      } catch (error) {
        skipped.push(`${adapter.name}: ${(error as Error).message}`)
        console.warn(`skipped ${adapter.name}: ${(error as Error).message}`)
        continue
      }
      try {
        for (const scenario of ['new', 'replay'] as const) rows.push(await measure(bare, library, adapter, scenario))
      } finally {
        await stop(library)
      }
    }
  } finally {
    await stop(bare)
    await cleanUp().catch((error: unknown) => console.warn(`cleaning up: ${(error as Error).message}`))
  }

  const storeName: Record<Adapter['storage'], string> = {
    none: '-',
    memory: 'memory',
    sqlite: 'SQLite',
    redis: 'Redis',
    postgres: 'PostgreSQL',
  }
  const label = (a: Adapter) => {
    if (a.shown) return a.shown
    const library = a.name.replace(/-(memory|sqlite|redis|postgres)$/, '')
    const shown = library === 'idemkey' ? '**idemkey**' : library === 'powertools' ? 'Powertools' : library
    return `${shown}, ${storeName[a.storage]}`
  }
  const find = (a: Adapter, scenario: 'new' | 'replay') => rows.find((r) => r.adapter === a && r.scenario === scenario)
  const cell = (row: Row | undefined) => (row ? median(row.pairs).toFixed(2) : 'n/a')
  const rps = (row: Row | undefined) => (row ? `${fmt(rate(row.library))} / ${fmt(rate(row.bare))}` : 'n/a')
  const measured = selected
    .filter((a) => find(a, 'new'))
    .sort((a, b) => median((find(b, 'new') as Row).pairs) - median((find(a, 'new') as Row).pairs))
  // The targets of issue 18, checked on this run's ratios.
  const ratioOf = (name: string) => {
    const row = rows.find((r) => r.adapter.name === name && r.scenario === 'new')
    return row ? median(row.pairs) : undefined
  }
  const targets = (): string[] => {
    const peer = ratioOf('node-idempotency-memory')
    const best = Math.max(...['node-idempotency-redis', 'express-idempotency-redis', 'powertools-redis'].map((n) => ratioOf(n) ?? 0))
    const check = (ours: string, target: number | undefined, what: string) => {
      const mine = ratioOf(ours)
      if (mine === undefined || target === undefined || target === 0) return `${ours} against ${what}: not measured in this run`
      return `${ours} ${mine.toFixed(2)} against ${what} ${target.toFixed(2)}: ${mine >= target ? 'met' : 'NOT met'}`
    }
    return [
      `Targets on new keys, this run: ${[
        check('idemkey-memory', peer, "@node-idempotency's memory storage"),
        check('idemkey-sqlite', peer, "@node-idempotency's memory storage"),
        check('idemkey-redis', best || undefined, 'the best Redis peer'),
        check('idemkey-redis-node', best || undefined, 'the best Redis peer'),
      ].join('; ')}. Where the time goes and what is left: bench/peers/README.md.`,
    ]
  }
  const failures = rows.filter((r) => r.library.failed > 0 || r.bare.failed > 0 || r.replayExecutions > 0)
  const packages = [
    ...new Set(
      selected
        .flatMap((a) => a.packages)
        .concat(['autocannon', ...(selected.some((a) => a.name.startsWith('powertools')) ? ['@aws-lambda-powertools/idempotency'] : [])]),
    ),
  ].sort()
  const body = [
    table(
      ['library, store', 'new keys x bare', 'replays x bare', 'new keys req/s (library / bare)', 'replays req/s (library / bare)'],
      measured.map((a) => [label(a), cell(find(a, 'new')), cell(find(a, 'replay')), rps(find(a, 'new')), rps(find(a, 'replay'))]),
    ),
    '',
    `Every library sits in front of the same Express 4 endpoint (\`POST /charges\`, a ${BODY.length}-byte JSON body, a 201 JSON answer), each in its own process; autocannon drives ${CONNECTIONS} connections from another. "x bare" is the library's requests/s divided by a bare Express app's (no idempotency) measured in alternating slices right beside it (bare, library, library, bare, …; ${RUNS} slice(s) of ${DURATION} s per side, after a ${WARMUP} s warm-up each): the median of the ${RUNS} ratios of adjacent slices, so a burst of other work on the machine during one slice does not move it. Only these side-by-side ratios count; the req/s columns (totals over the slices) move with the machine's load. New keys: a fresh Idempotency-Key per request; replays: one key, completed before the slice. Rows are sorted by the new-keys ratio. Library defaults throughout; bench/peers/README.md says how each one is wired.`,
    '',
    ...targets(),
    '',
    failures.length === 0
      ? 'Every request of every measured slice answered 2xx, and no replay ran the handler.'
      : `Not clean: ${failures.map((r) => `${r.adapter.name} ${r.scenario}: ${r.library.failed} library / ${r.bare.failed} bare requests not 2xx, ${r.replayExecutions} replays ran the handler`).join('; ')}.`,
    ...(skipped.length > 0 ? ['', `Not measured: ${skipped.join('; ')}.`] : []),
    '',
    `Versions: ${packages.map((name) => `${name === 'express4' ? 'express' : name} ${version(name)}`).join(', ')}. The run took ${Math.round((Date.now() - started) / 1_000)} s.`,
  ].join('\n')
  const args = process.argv.slice(2)
  report('peers', 'idemkey and its peers (Express, side by side)', `npm run bench:peers${args.length ? ` -- ${args.join(' ')}` : ''}`, body)
  // docs/benchmarks.md collects every area's table, this one included.
  const { spawnSync } = await import('node:child_process')
  spawnSync(process.execPath, [join(ROOT, 'bench', 'run.mjs'), '--collect-only'], { stdio: 'inherit', cwd: ROOT })
}

process.on('SIGINT', () => {
  for (const child of children) child.kill('SIGKILL')
  process.exit(130)
})
try {
  await main()
} finally {
  for (const child of children) child.kill('SIGKILL')
  rmSync(sqliteDir, { recursive: true, force: true })
}
