/**
 * The doctor's report where operators look: the proxy's admin server puts it in `/readyz`'s body (never
 * changing the status) and the operator page shows it as a table in `/api/summary` and the page. Read
 * from real SQLite files and an unreachable Redis port, at most once per interval.
 */

import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, rmSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { MemoryStore } from '../src/backends/memory/index.js'
import { readDurability } from '../src/cli/commands/doctor-read.js'
import { createAdminServer } from '../src/cli/proxy/admin-server.js'
import { Registry } from '../src/cli/proxy/metrics-text.js'
import { parseStoreUrl } from '../src/cli/store-url.js'
import { cachedDurability, type DurabilityReport } from '../src/core/durability.js'
import { operatorPage } from '../src/observability/operator-page.js'
import { startProxy } from './helpers/proxy-process.js'
import { freePort } from './helpers/services.js'

let dir: string
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'idemkey-doctor-readyz-'))
})
const servers: Server[] = []
afterAll(async () => {
  for (const server of servers) await new Promise((resolve) => server.close(resolve))
  rmSync(dir, { recursive: true, force: true })
})

function walFile(name: string): string {
  const path = join(dir, name)
  const db = new DatabaseSync(path)
  db.exec('PRAGMA journal_mode = WAL; CREATE TABLE t (x)')
  db.close()
  return path
}

async function serve(server: Server): Promise<string> {
  servers.push(server)
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

describe("the doctor's report in /readyz and on the operator page", () => {
  it("/readyz stays 200 and carries the verdict, the failures that lose and each row's verdict", async () => {
    const path = walFile('readyz.db')
    const store = new MemoryStore()
    const durability = cachedDurability(() => readDurability(parseStoreUrl(`sqlite:${path}`)))
    const page = operatorPage({ store, durability })
    const base = await serve(createAdminServer({ registry: new Registry(), ready: async () => {}, page, durability }))
    const response = await fetch(`${base}/readyz`)
    expect(response.status).toBe(200)
    expect(await response.json()).toEqual({
      status: 'ready',
      durability: {
        status: 'unsafe',
        losing: ['machine-crash'],
        unproven: [],
        unchecked: [],
        verdicts: { 'process-crash': 'safe', 'machine-crash': 'loses', failover: 'n/a', eviction: 'n/a', expiry: 'safe' },
      },
    })
    await store.close()
  })

  it("idemkey proxy --admin-port puts its store's report in /readyz and on its operator page", async () => {
    const path = walFile('proxy.db')
    const children: ChildProcess[] = []
    const upstream = await serve(createServer((_req, res) => res.end('ok')))
    const adminPort = await freePort()
    try {
      await startProxy(['--upstream', upstream, '--store', `sqlite:${path}`, '--admin-port', String(adminPort)], children, {
        env: { IDEMKEY_SCOPE_SECRET: 'test-secret-for-the-doctor-readyz' },
      })
      const admin = `http://127.0.0.1:${adminPort}`
      const body = (await (await fetch(`${admin}/readyz`)).json()) as { status: string; durability: Record<string, unknown> }
      expect(body).toMatchObject({ status: 'ready', durability: { status: 'unsafe', losing: ['machine-crash'] } })
      const summary = (await (await fetch(`${admin}/api/summary`)).json()) as { durability: { status: string } }
      expect(summary.durability.status).toBe('unsafe')
    } finally {
      for (const child of children) child.kill('SIGKILL')
    }
  })

  it('a server the report cannot reach is "unproven" in /readyz, named, while readiness is the store\'s own', async () => {
    const port = await freePort()
    const durability = cachedDurability(() => readDurability(parseStoreUrl(`redis://127.0.0.1:${port}`), { timeoutMs: 1_000 }))
    const page = operatorPage({ store: new MemoryStore() })
    const base = await serve(createAdminServer({ registry: new Registry(), ready: async () => {}, page, durability }))
    const body = (await (await fetch(`${base}/readyz`)).json()) as { status: string; durability: Record<string, unknown> }
    expect(body.status).toBe('ready')
    expect(body.durability).toMatchObject({
      status: 'unproven',
      losing: [],
      unproven: ['process-crash', 'machine-crash', 'failover', 'eviction', 'expiry'],
      unchecked: [expect.stringMatching(/^the server: could not reach the server \(.*ECONNREFUSED/)],
    })
  })

  it('the operator page shows the report as a table: /api/summary has its rows, the page its section', async () => {
    const path = walFile('page.db')
    const page = operatorPage({
      store: new MemoryStore(),
      durability: cachedDurability(() => readDurability(parseStoreUrl(`sqlite:${path}`), { synchronous: 'full' })),
    })
    const base = await serve(createServer(page.handler))
    const summary = (await (await fetch(`${base}/api/summary`)).json()) as { durability: { status: string; report: DurabilityReport } }
    expect(summary.durability.status).toBe('safe')
    expect(summary.durability.report.findings.map((f) => [f.failure, f.verdict])).toEqual([
      ['process-crash', 'safe'],
      ['machine-crash', 'safe'],
      ['failover', 'n/a'],
      ['eviction', 'n/a'],
      ['expiry', 'safe'],
    ])
    const html = await (await fetch(`${base}/`)).text()
    expect(html).toContain('<section id="durability-section" hidden><h2>Durability <small>(idemkey doctor)</small></h2>')
    const without = await serve(createServer(operatorPage({ store: new MemoryStore() }).handler))
    expect(((await (await fetch(`${without}/api/summary`)).json()) as { durability: unknown }).durability).toBeNull()
  })

  it('asks the server at most once per interval, and a reader that throws is an unproven summary, not a crash', async () => {
    let reads = 0
    let clock = 0
    const report: DurabilityReport = { store: 'x', findings: [], unchecked: [], notes: [] }
    const cached = cachedDurability(
      async () => {
        reads++
        return report
      },
      60_000,
      [],
      () => clock,
    )
    await cached()
    await cached()
    expect(reads).toBe(1)
    clock = 60_000
    await cached()
    expect(reads).toBe(2)
    const failing = cachedDurability(() => {
      throw new Error('no driver')
    })
    expect(await failing()).toMatchObject({ status: 'unproven', error: 'no driver' })
  })
})
