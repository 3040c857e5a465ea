/**
 * A holder alive inside its transaction is not a stuck one (issue 55, item 2). After a transaction's first
 * step the record's row stays locked and its lease is no longer renewed (docs/steps.md), so 35 s into a
 * healthy request the lease has long ended. Every operator surface (idemkey list and inspect, as text and
 * JSON, the operator page's api/summary and api/record, the Prometheus and OpenTelemetry gauges behind the
 * "stuck holders" alert) must say it runs in its transaction, and still call STUCK a holder killed mid-transaction (rolled back) and one
 * whose lease ran out outside any transaction. Real processes on real PostgreSQL and MySQL/MariaDB.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { type DataPoint, MeterProvider, MetricReader } from '@opentelemetry/sdk-metrics'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { prometheusMetrics } from '../src/cli/proxy/prometheus.js'
import { openStore } from '../src/cli/store-url.js'
import type { IdempotencyStore } from '../src/core/store.js'
import { openTelemetry } from '../src/observability/opentelemetry.js'
import { type OperatorSummary, operatorPage } from '../src/observability/operator-page.js'
import { runNode } from './helpers/cli.js'
import { serviceSkipReason } from './helpers/services.js'

const ROOT = join(import.meta.dirname, '..')
const BIN = join(ROOT, 'bin/idemkey.js')
const HOLDER = join(import.meta.dirname, 'fixtures', 'processes', 'tx-holder.ts')
const LEASE_MS = 1_000
/** How long past its lease the live holder is read: the healthy 35 s request. */
const PAST_LEASE_MS = 35_000
const FP = 'a'.repeat(64)

const pgSkip = await serviceSkipReason('PostgreSQL', 5432)
const mysqlSkip = await serviceSkipReason('MariaDB', 3306)

const DATABASES = [
  {
    name: 'PostgreSQL',
    base: 'postgres://root@127.0.0.1:5432/test',
    skip: pgSkip,
    drop: async (t: string) => {
      const client = new pg.Client({ connectionString: 'postgres://root@127.0.0.1:5432/test' })
      await client.connect()
      await client.query(`DROP TABLE IF EXISTS "${t}"`)
      await client.end()
    },
  },
  {
    name: 'MySQL/MariaDB',
    base: 'mysql://root@127.0.0.1:3306/test',
    skip: mysqlSkip,
    drop: async (t: string) => {
      const connection = await mysql.createConnection({ uri: 'mysql://root@127.0.0.1:3306/test' })
      await connection.query(`DROP TABLE IF EXISTS \`${t}\`, \`${t}_meta\``)
      await connection.end()
    },
  },
]

const cli = async (...args: string[]) => {
  const { IDEMKEY_STORE: _, ...env } = process.env
  const result = await runNode([BIN, ...args], { cwd: ROOT, env })
  if (result.code !== 0) throw new Error(`idemkey ${args.join(' ')} exited ${result.code}: ${result.stderr}`)
  return result.stdout
}

/** Starts the holder process on `key`; resolves once its first step is recorded in its open transaction. */
async function holder(store: string, scope: string, key: string): Promise<{ child: ChildProcess; lines: string[] }> {
  const child = spawn(process.execPath, ['--import', 'tsx', HOLDER, JSON.stringify({ store, scope, key, leaseMs: LEASE_MS })], {
    cwd: ROOT,
    stdio: ['pipe', 'pipe', 'inherit'],
  })
  const lines: string[] = []
  const stepped = new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (line) => {
      lines.push(line)
      if (line === 'stepped') resolve()
    })
    child.once('exit', (code, signal) => reject(new Error(`holder of ${key} exited (${signal ?? code}) before its first step`)))
  })
  await stepped
  return { child, lines }
}

/** The operator page's api/summary, and its api/record of each key given (in `scope`). */
async function pageOf(store: IdempotencyStore, scope: string, keys: string[]) {
  const page = operatorPage({ store })
  const server = createServer((req, res) => page.handler(req, res))
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  try {
    const { port } = server.address() as AddressInfo
    const get = async (path: string) => (await fetch(`http://127.0.0.1:${port}${path}`)).json()
    const summary = (await get('/api/summary')) as OperatorSummary
    const records: Record<string, { leaseEnded: string | null }> = {}
    for (const key of keys)
      records[key] = (await get(`/api/record?${new URLSearchParams({ key, scope })}`)) as { leaseEnded: string | null }
    return { summary, records }
  } finally {
    server.close()
  }
}

class TestReader extends MetricReader {
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

/** The points of `idemkey.holders.past_lease` from openTelemetry({ store }), by `idemkey.holder.state`. */
async function otelHolders(store: IdempotencyStore): Promise<Record<string, unknown>> {
  const reader = new TestReader()
  openTelemetry({ meterProvider: new MeterProvider({ readers: [reader] }), traces: false, store })
  const { resourceMetrics } = await reader.collect()
  const points = resourceMetrics.scopeMetrics
    .flatMap((s) => s.metrics)
    .filter((m) => m.descriptor.name === 'idemkey.holders.past_lease')
    .flatMap((m) => m.dataPoints as DataPoint<number>[])
  return Object.fromEntries(points.map((p) => [p.attributes['idemkey.holder.state'], p.value]))
}

/** The value of one sample of the Prometheus text, `undefined` when absent. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `))
  return line === undefined ? undefined : Number(line.slice(series.length + 1))
}

describe.concurrent('a holder inside its transaction, 35 s past its lease', () => {
  for (const db of DATABASES) {
    it.skipIf(db.skip !== undefined)(
      `on ${db.name}: running in its transaction on every surface, while a killed holder and an expired plain one are STUCK`,
      async () => {
        const table = `idemkey_live_${randomUUID().slice(0, 8)}`
        const url = `${db.base}?table=${table}`
        const scope = `live-${randomUUID()}`
        const opened = await openStore(url)
        const store = opened.store
        await opened.migrate()
        let live: { child: ChildProcess; lines: string[] } | undefined
        try {
          live = await holder(url, scope, 'live')
          // Killed mid-transaction: the database rolls its transaction back, nobody renews or releases.
          const killed = await holder(url, scope, 'killed')
          killed.child.kill('SIGKILL')
          await once(killed.child, 'exit')
          // Outside any transaction: a holder whose lease ran out.
          expect((await store.acquire(scope, 'plain', FP, LEASE_MS)).kind).toBe('acquired')

          const record = await store.get(scope, 'live')
          const endsAt = record?.lockedUntilMs as number
          // A timer may fire a millisecond before its delay by the wall clock: wait until the clock agrees.
          while (Date.now() - endsAt < PAST_LEASE_MS) await sleep(endsAt + PAST_LEASE_MS - Date.now() + 1)
          expect(Date.now() - endsAt).toBeGreaterThanOrEqual(PAST_LEASE_MS)

          // idemkey list, JSON and text
          const listed = JSON.parse(await cli('list', '--scope', scope, '--store', url, '--json')) as Array<Record<string, unknown>>
          const byKey = new Map(listed.map((r) => [r.key as string, r]))
          expect(byKey.get('live')).toMatchObject({ status: 'in_progress', stuck: false, leaseEnded: 'in_transaction' })
          expect(byKey.get('killed')).toMatchObject({ status: 'in_progress', stuck: true, leaseEnded: 'abandoned' })
          expect(byKey.get('plain')).toMatchObject({ status: 'in_progress', stuck: true, leaseEnded: 'abandoned' })
          const table_ = (await cli('list', '--scope', scope, '--store', url)).split('\n')
          const row = (key: string) => table_.find((l) => l.includes(` ${key} `)) ?? ''
          expect(row('live')).not.toMatch(/STUCK/)
          expect(row('live')).toMatch(/^in tx\s/)
          expect(row('live')).toContain('running in its transaction')
          expect(row('killed')).toMatch(/^STUCK\s/)
          expect(row('plain')).toMatch(/^STUCK\s/)
          // Stuck ones first, the running one after them.
          expect(table_.findIndex((l) => l.includes(' live '))).toBeGreaterThan(table_.findIndex((l) => l.includes(' plain ')))

          // idemkey inspect, text and JSON
          const inspected = await cli('inspect', 'live', '--scope', scope, '--store', url)
          expect(inspected).toMatch(
            /lease:\s+ended [\d.]+s ago: running in its transaction \(lease not renewed while the transaction holds the row;/,
          )
          expect(inspected).not.toContain('crashed')
          const inspectedJson = JSON.parse(await cli('inspect', 'live', '--scope', scope, '--store', url, '--json')) as {
            record: Record<string, unknown>
          }
          expect(inspectedJson.record).toMatchObject({ leaseEnded: 'in_transaction', stuck: false })
          expect(String(inspectedJson.record.leaseState)).toContain('running in its transaction')
          const killedJson = JSON.parse(await cli('inspect', 'killed', '--scope', scope, '--store', url, '--json')) as {
            record: Record<string, unknown>
          }
          expect(killedJson.record).toMatchObject({ leaseEnded: 'abandoned', stuck: true })
          expect(await cli('inspect', 'killed', '--scope', scope, '--store', url)).toContain('not renewed (holder crashed or hung')

          // The operator page's summary
          const { summary, records } = await pageOf(store, scope, ['live', 'killed'])
          expect(summary.stuck.map((r) => r.key).sort()).toEqual(['killed', 'plain'])
          expect(summary.inTransaction.map((r) => r.key)).toEqual(['live'])
          expect(summary.holdersUnchecked).toBeUndefined()
          expect(records.live?.leaseEnded).toBe('in_transaction')
          expect(records.killed?.leaseEnded).toBe('abandoned')

          // The gauges behind the "holders stuck past their lease" alert: the proxy's and OpenTelemetry's
          const metrics = prometheusMetrics({ store })
          const text = await metrics.registry.metrics()
          expect(sample(text, 'idemkey_holders_past_lease{state="stuck"}')).toBe(2)
          expect(sample(text, 'idemkey_holders_past_lease{state="in_transaction"}')).toBe(1)
          expect(await otelHolders(store)).toEqual({ stuck: 2, in_transaction: 1 })

          // The live holder was alive all along: it commits, and the record is completed.
          live.child.stdin?.write('go\n')
          await once(live.child, 'exit')
          expect(live.lines).toContain('done executed')
          expect((await store.get(scope, 'live'))?.status).toBe('completed')
        } finally {
          live?.child.kill('SIGKILL')
          await store.close()
          await db.drop(table)
        }
      },
      180_000,
    )
  }
})
