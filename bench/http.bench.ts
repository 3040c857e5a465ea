/**
 * HTTP benchmark (issue 3): requests/s of the same Express and Fastify apps without idemkey and with
 * it (MemoryStore, SqliteStore), on unique keys (every request runs the handler) and on replays of one
 * key (every request is answered from the store), in one run. Each app runs in its own process;
 * autocannon drives the load from this one.
 * Run alone: npm run build && npx tsx bench/http.bench.ts [--seconds 3] [--connections 32]
 * (The same file is the app server when started with --serve <framework> <store>.)
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fmt, numberArg, report, table } from './lib.js'

interface CannonResult {
  requests: { average: number; total: number }
  latency: { p50: number; p99: number }
  non2xx: number
  errors: number
  timeouts: number
}
interface CannonRequest {
  method: string
  path: string
  headers: Record<string, string>
  body: string
}
type Cannon = (options: Record<string, unknown>) => Promise<CannonResult>
// autocannon ships no types: the little of it used here is declared above.
const autocannon = createRequire(import.meta.url)('autocannon') as Cannon

type Framework = 'express' | 'fastify'
type StoreKind = 'none' | 'spin' | 'memory' | 'sqlite' | 'memory+otel' | 'memory+metrics'

/** The calibration row's extra CPU per request: what any per-request work of that size costs here. */
const SPIN_US = 10

const ROOT = join(import.meta.dirname, '..')
const SECONDS = numberArg('--seconds', 3)
const CONNECTIONS = numberArg('--connections', 32)
const BODY = JSON.stringify({ amount: 1200, currency: 'eur', customer: 'cus_42' })

/** The app under test, in this (child) process: the same handler with or without idemkey. */
async function serve(framework: Framework, storeKind: StoreKind, dbPath: string): Promise<void> {
  // The built package, as users install it (npm run bench builds first).
  const { Ledger } = await import('idemkey')
  let ledger: InstanceType<typeof Ledger> | undefined
  if (storeKind === 'memory') {
    const { MemoryStore } = await import('idemkey/memory')
    ledger = new Ledger({ store: new MemoryStore() })
  } else if (storeKind === 'memory+otel' || storeKind === 'memory+metrics') {
    const { MemoryStore } = await import('idemkey/memory')
    ledger = new Ledger({ store: new MemoryStore(), telemetry: await benchTelemetry(storeKind === 'memory+otel') })
  } else if (storeKind === 'sqlite') {
    const { SqliteStore } = await import('idemkey/sqlite')
    ledger = new Ledger({ store: new SqliteStore({ path: dbPath }) })
  }
  let n = 0
  const spin = () => {
    const end = performance.now() + SPIN_US / 1_000
    while (performance.now() < end) {}
  }
  const charge = (body: { amount?: number }) => {
    if (storeKind === 'spin') spin()
    return { id: `ch_${++n}`, amount: body?.amount, status: 'succeeded' }
  }
  let port: number
  if (framework === 'express') {
    const { default: express } = await import('express')
    const { idempotency } = await import('idemkey/express')
    const app = express()
    app.use(express.json())
    if (ledger) app.use(idempotency({ ledger }))
    app.post('/charges', (req, res) => {
      res.status(201).json(charge(req.body))
    })
    const server = app.listen(0, '127.0.0.1')
    await new Promise((resolve) => server.once('listening', resolve))
    port = (server.address() as { port: number }).port
  } else {
    const { default: Fastify } = await import('fastify')
    const { idempotency } = await import('idemkey/fastify')
    const app = Fastify()
    if (ledger) await app.register(idempotency, { ledger })
    app.post('/charges', async (request, reply) => reply.code(201).send(charge(request.body as { amount?: number })))
    await app.listen({ port: 0, host: '127.0.0.1' })
    port = (app.server.address() as { port: number }).port
  }
  process.stdout.write(`port ${port}\n`)
}

/**
 * idemkey/opentelemetry as a production app sets it up: spans through a batch processor (to an exporter
 * that drops them, as a collector would take them off the process), metrics aggregated by the SDK.
 */
async function benchTelemetry(traces: boolean) {
  const { openTelemetry } = await import('idemkey/opentelemetry')
  const { BasicTracerProvider, BatchSpanProcessor } = await import('@opentelemetry/sdk-trace-base')
  const { MeterProvider, MetricReader } = await import('@opentelemetry/sdk-metrics')
  const exporter = { export: (_spans: unknown, done: (result: { code: 0 }) => void) => done({ code: 0 }), shutdown: async () => {} }
  class HeldReader extends MetricReader {
    protected async onForceFlush(): Promise<void> {}
    protected async onShutdown(): Promise<void> {}
  }
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new BatchSpanProcessor(exporter)] })
  const meterProvider = new MeterProvider({ readers: [new HeldReader()] })
  return openTelemetry({ tracerProvider, meterProvider, traces })
}

const children: ChildProcess[] = []

/** CPU time (user + system) a process has used, in µs, from /proc: unlike requests/s, other load on the machine hardly moves it. */
function cpuMicros(pid: number | undefined): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? []
  return ((Number(fields[11]) + Number(fields[12])) * 1_000_000) / CLOCK_TICKS
}
const CLOCK_TICKS = 100

function start(framework: Framework, storeKind: StoreKind, dbPath: string): Promise<{ port: number; child: ChildProcess }> {
  const child = spawn(process.execPath, ['--import', 'tsx', import.meta.filename, '--serve', framework, storeKind, dbPath], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  children.push(child)
  return new Promise((resolve, reject) => {
    let out = ''
    child.stdout?.on('data', (chunk) => {
      out += chunk
      const match = /port (\d+)/.exec(out)
      if (match) resolve({ port: Number(match[1]), child })
    })
    child.once('exit', (code) => reject(new Error(`${framework}/${storeKind} exited with ${code} before listening`)))
  })
}

/** Load with a fresh key per request (`unique`) or one key answered from the store (`replay`). */
async function load(port: number, mode: 'unique' | 'replay', seconds = SECONDS): Promise<CannonResult> {
  const run = randomUUID()
  const replayKey = `replay-${run}`
  let i = 0
  const result = await autocannon({
    url: `http://127.0.0.1:${port}`,
    connections: CONNECTIONS,
    duration: seconds,
    requests: [
      {
        method: 'POST',
        path: '/charges',
        setupRequest: (req: CannonRequest) => {
          const key = mode === 'replay' ? replayKey : `u-${run}-${i++}`
          return { ...req, headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: BODY }
        },
      },
    ],
  })
  if (result.non2xx > 0 || result.errors > 0) {
    console.warn(`  ${mode} on :${port}: ${result.non2xx} non-2xx, ${result.errors} errors, ${result.timeouts} timeouts`)
  }
  return result
}

/**
 * The HTTP layer alone, in this process, with no server and no load generator: CPU per covered request
 * (engine.handle, MemoryStore, a handler that answers at once) with telemetry off, metrics only, traces
 * and metrics. The best of 5 rounds of 20,000: the figure least moved by other load on the machine.
 */
async function inProcess(): Promise<Array<Array<string | number>>> {
  const { Ledger } = await import('idemkey')
  const { MemoryStore } = await import('idemkey/memory')
  const { createEngine } = await import('idemkey/http')
  const body = new TextEncoder().encode(BODY)
  const cpuPerRequest = async (telemetry: Awaited<ReturnType<typeof benchTelemetry>> | undefined, mode: 'unique' | 'replay') => {
    const engine = createEngine({
      ledger: new Ledger({ store: new MemoryStore(), telemetry }),
      scopeSecret: 'bench-secret-of-32-characters-ok',
    })
    const handler = async () => ({ status: 201, headers: { 'content-type': 'application/json' }, body })
    let best = Number.POSITIVE_INFINITY
    for (let round = 0; round < 5; round++) {
      const started = process.cpuUsage()
      for (let i = 0; i < 20_000; i++) {
        const key = mode === 'unique' ? `k-${round}-${i}` : 'replayed'
        await engine.handle(
          {
            method: 'POST',
            url: '/charges',
            headers: { 'content-type': 'application/json', 'idempotency-key': key },
            body: async () => body,
          },
          handler,
        )
      }
      const used = process.cpuUsage(started)
      best = Math.min(best, (used.user + used.system) / 20_000)
    }
    return best
  }
  const rows: Array<Array<string | number>> = []
  for (const mode of ['unique', 'replay'] as const) {
    const off = await cpuPerRequest(undefined, mode)
    const metrics = await cpuPerRequest(await benchTelemetry(false), mode)
    const both = await cpuPerRequest(await benchTelemetry(true), mode)
    rows.push([
      mode === 'unique' ? 'unique keys' : 'replays of one key',
      `${fmt(off, 1)} µs`,
      `${fmt(metrics, 1)} µs (+${fmt(metrics - off, 1)})`,
      `${fmt(both, 1)} µs (+${fmt(both - off, 1)})`,
    ])
  }
  return rows
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-bench-http-'))
  const rows: Array<Array<string | number>> = []
  const overhead: Array<Array<string | number>> = []
  const pct = (value: number, base: number) => `${fmt((100 * value) / base)}%`
  try {
    for (const framework of ['fastify', 'express'] as const) {
      const bare = await start(framework, 'none', '')
      await load(bare.port, 'unique', 1) // warm-up: JIT and connections
      const base = await load(bare.port, 'unique')
      bare.child.kill('SIGKILL')
      rows.push([framework, 'without idemkey', '-', fmt(base.requests.average), '100%', `${fmt(base.latency.p99)} ms`])
      const spun = await start(framework, 'spin', '')
      await load(spun.port, 'unique', 1)
      const calibration = await load(spun.port, 'unique')
      spun.child.kill('SIGKILL')
      rows.push([
        framework,
        `without idemkey, handler + ${SPIN_US} µs CPU`,
        '-',
        fmt(calibration.requests.average),
        pct(calibration.requests.average, base.requests.average),
        `${fmt(calibration.latency.p99)} ms`,
      ])
      const names: Record<Exclude<StoreKind, 'none' | 'spin'>, string> = {
        memory: 'MemoryStore',
        'memory+metrics': 'MemoryStore + OpenTelemetry metrics',
        'memory+otel': 'MemoryStore + OpenTelemetry (traces and metrics)',
        sqlite: 'SqliteStore (file, WAL)',
      }
      const measured: Partial<Record<StoreKind, Record<'unique' | 'replay', { rate: number; cpu: number }>>> = {}
      for (const storeKind of ['memory', 'memory+metrics', 'memory+otel', 'sqlite'] as const) {
        const app = await start(framework, storeKind, join(dir, `${framework}.db`))
        await load(app.port, 'unique', 1)
        for (const mode of ['unique', 'replay'] as const) {
          const cpuBefore = cpuMicros(app.child.pid)
          const result = await load(app.port, mode)
          const cpuPerRequest = (cpuMicros(app.child.pid) - cpuBefore) / Math.max(1, result.requests.total)
          measured[storeKind] ??= { unique: { rate: 0, cpu: 0 }, replay: { rate: 0, cpu: 0 } }
          measured[storeKind][mode] = { rate: result.requests.average, cpu: cpuPerRequest }
          rows.push([
            framework,
            names[storeKind],
            mode === 'unique' ? 'unique keys' : 'replays of one key',
            fmt(result.requests.average),
            pct(result.requests.average, base.requests.average),
            `${fmt(result.latency.p99)} ms`,
          ])
        }
        app.child.kill('SIGKILL')
      }
      for (const mode of ['unique', 'replay'] as const) {
        const off = measured.memory?.[mode] ?? { rate: 0, cpu: 0 }
        for (const kind of ['memory+metrics', 'memory+otel'] as const) {
          const on = measured[kind]?.[mode] ?? { rate: 0, cpu: 0 }
          overhead.push([
            framework,
            mode === 'unique' ? 'unique keys' : 'replays of one key',
            kind === 'memory+otel' ? 'traces and metrics' : 'metrics',
            fmt(off.rate),
            fmt(on.rate),
            pct(on.rate, off.rate),
            `${fmt(off.cpu, 1)} µs`,
            `${fmt(on.cpu, 1)} µs`,
            `${on.cpu >= off.cpu ? '+' : ''}${fmt(on.cpu - off.cpu, 1)} µs (${pct(on.cpu - off.cpu, off.cpu)})`,
          ])
        }
      }
    }
    const layerRows = await inProcess()
    const body = [
      table(['app', 'idempotency', 'keys', 'requests/s', 'of the bare app', 'p99'], rows),
      '',
      'The HTTP layer alone, in this process (engine.handle on MemoryStore, no server, no load generator), CPU per covered request, best of 5 × 20,000:',
      '',
      table(['keys', 'telemetry off', 'OpenTelemetry metrics', 'OpenTelemetry traces and metrics'], layerRows),
      '',
      'OpenTelemetry on against off in the apps (MemoryStore, the rows above, measured one after the other in this run):',
      '',
      table(
        [
          'app',
          'keys',
          'on',
          'off, requests/s',
          'on, requests/s',
          'on / off',
          'off, app CPU per request',
          'on, app CPU per request',
          'added',
        ],
        overhead,
      ),
      '',
      `${CONNECTIONS} connections, ${SECONDS} s per row after a 1 s warm-up, POST /charges with a ${BODY.length}-byte JSON body and a 201 JSON answer. Each app runs in its own process; autocannon runs in another. Both share the machine's 2 cores, so the ratios (measured side by side in this run) matter more than the absolute figures, and they fall steeply with any per-request work: the calibration row is the bare app whose handler burns ${SPIN_US} µs more CPU, nothing else. Targets: with MemoryStore at least 85% of the bare app on unique keys and at least 100% on replays; with SqliteStore at least 70% on unique keys; OpenTelemetry on at least 95% of off. The OpenTelemetry rows use the SDK's BasicTracerProvider with a BatchSpanProcessor (its exporter drops the spans, as a collector takes them off the process) and a MeterProvider that aggregates every measurement. CPU per request is the app process's own CPU time (user + system, from /proc) over the row's requests: other processes on the machine move requests/s much more than it.`,
    ].join('\n')
    report(
      'http',
      'HTTP adapters (Express, Fastify)',
      `npm run build && npx tsx bench/http.bench.ts --seconds ${SECONDS} --connections ${CONNECTIONS}`,
      body,
    )
  } finally {
    for (const child of children) child.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  }
}

const serveAt = process.argv.indexOf('--serve')
if (serveAt > 0) {
  const [framework, storeKind, dbPath] = process.argv.slice(serveAt + 1) as [Framework, StoreKind, string]
  await serve(framework, storeKind, dbPath)
} else {
  await main()
}
