/**
 * `idemkey relay --health-port`: its `/readyz` body carries the durability report of its source
 * PostgreSQL, as `idemkey doctor` gives it. A throwaway server with wal_level = logical and fsync = off
 * (deliberately weak), the shared Redis as the broker.
 */
import { spawn } from 'node:child_process'
import { join } from 'node:path'
import pg from 'pg'
import { PgOutbox } from '../src/messaging/outbox/index.js'
import { eventually } from './fixtures/messaging/pg.js'
import { canStartThrowaway, startThrowaway, type ThrowawayServer } from './fixtures/postgres/throwaway-server.js'
import { isCI, serviceSkipReason } from './helpers/services.js'

const BIN = join(import.meta.dirname, '..', 'bin/idemkey.js')
const pgReason = canStartThrowaway() ? undefined : 'the PostgreSQL 15 binaries (initdb, pg_ctl) are not in /usr/lib/postgresql/15/bin'
if (pgReason && isCI()) throw new Error(`CI=${process.env.CI} and ${pgReason}`)
if (pgReason) console.warn(`\n!!! SKIPPED (idemkey relay /readyz durability): ${pgReason}\n`)
const reason = pgReason ?? (await serviceSkipReason('Redis', 6379))

describe.skipIf(reason !== undefined)("idemkey relay's /readyz", () => {
  let server: ThrowawayServer
  beforeAll(async () => {
    server = await startThrowaway({ settings: { wal_level: 'logical' } })
  }, 60_000)
  afterAll(async () => {
    await server?.destroy()
  })

  it("carries the source database's durability report: fsync = off loses commits to a machine crash", { timeout: 40_000 }, async () => {
    const pool = new pg.Pool({ connectionString: server.url, max: 2 })
    await new PgOutbox({ pool, table: 'doctor_outbox' }).migrate()
    const child = spawn(
      process.execPath,
      [BIN, 'relay', '--from', server.url, '--to', 'redis://127.0.0.1:6379', '--table', 'doctor_outbox', '--health-port', '0'],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    )
    let stderr = ''
    child.stderr?.on('data', (chunk: Buffer) => {
      stderr += chunk.toString()
    })
    try {
      await eventually(() => /streaming from slot/.test(stderr), `the relay to stream. stderr:\n${stderr}`)
      const port = Number(/health on http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr)?.[1])
      const ready = await fetch(`http://127.0.0.1:${port}/readyz`)
      expect(ready.status).toBe(200)
      expect(await ready.json()).toMatchObject({
        status: 'ready',
        exists: true,
        durability: {
          status: 'unsafe',
          losing: ['machine-crash'],
          verdicts: { 'process-crash': 'safe', 'machine-crash': 'loses', failover: 'n/a', eviction: 'n/a', expiry: 'safe' },
        },
      })
    } finally {
      child.kill('SIGKILL')
      await pool.end()
    }
  })
})
