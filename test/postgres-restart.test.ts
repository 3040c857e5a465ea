import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { isIdempotencyError } from '../src/errors.js'
import { canStartThrowaway, startThrowaway, type ThrowawayServer } from './fixtures/postgres/throwaway-server.js'
import { isCI } from './helpers/services.js'

const KEYS = 60
const reason = canStartThrowaway() ? undefined : 'the PostgreSQL 15 binaries (initdb, pg_ctl) are not in /usr/lib/postgresql/15/bin'
if (reason && isCI()) throw new Error(`CI=${process.env.CI} and ${reason}`)
if (reason) console.warn(`\n!!! SKIPPED: PostgresStore server restart: ${reason}\n`)

describe.skipIf(reason !== undefined)('PostgresStore when its server crashes and restarts mid-run', () => {
  let server: ThrowawayServer
  let store: PostgresStore<pg.PoolClient>
  let pool: pg.Pool

  beforeAll(async () => {
    server = await startThrowaway()
    pool = new pg.Pool({ connectionString: server.url, max: 4, connectionTimeoutMillis: 2_000 })
    pool.on('error', () => {})
    store = new PostgresStore<pg.PoolClient>({ pool })
    await store.migrate()
    await pool.query('CREATE TABLE orders (intent text NOT NULL)')
  })
  afterAll(async () => {
    await store?.close()
    await pool?.end()
    await server?.destroy()
  })

  it('fails closed with STORE_UNAVAILABLE while down, recovers, and runs every key exactly once', async () => {
    const ledger = new Ledger({ store, lease: '1s', wait: '3s', storeTimeout: '2s' })
    const codes = new Map<string, number>()
    let done = 0
    const runAll = async () => {
      for (let i = 0; i < KEYS; i++) {
        for (let attempt = 0; ; attempt++) {
          expect(attempt, `key ${i} kept failing`).toBeLessThan(400)
          try {
            const result = await ledger.runInTransaction({ key: `k${i}`, payload: i }, async ({ tx }) => {
              await tx.query('INSERT INTO orders (intent) VALUES ($1)', [`k${i}`])
              // Slow enough that the crash lands inside some transactions.
              await new Promise((resolve) => setTimeout(resolve, 10))
              return i
            })
            if (result.kind === 'executed' && result.outcome !== 'completed') continue
            if (result.kind === 'executed' || result.kind === 'replayed') break
          } catch (error) {
            const code = isIdempotencyError(error) ? error.code : `raw:${(error as { code?: string }).code}`
            codes.set(code, (codes.get(code) ?? 0) + 1)
            await new Promise((resolve) => setTimeout(resolve, 50))
          }
        }
        done++
      }
    }
    const running = runAll()
    while (done < 15) await new Promise((resolve) => setTimeout(resolve, 10))
    await server.stop('immediate')
    // Down: the store answers, and answers no.
    await expect(store.get('default', 'k0')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    await expect(ledger.run({ key: 'while-down', payload: 1 }, () => 'ran unprotected')).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
    })
    await new Promise((resolve) => setTimeout(resolve, 300))
    await server.start()
    await running
    expect(done).toBe(KEYS)
    expect([...codes.keys()].every((code) => code === 'STORE_UNAVAILABLE')).toBe(true)
    expect(codes.get('STORE_UNAVAILABLE')).toBeGreaterThan(0)
    const { rows } = await pool.query('SELECT intent, count(*)::int AS n FROM orders GROUP BY intent HAVING count(*) <> 1')
    expect(rows).toEqual([])
    expect((await pool.query('SELECT count(DISTINCT intent)::int AS n FROM orders')).rows[0].n).toBe(KEYS)
    expect(await store.get('default', 'while-down')).toBeNull()
  })
})
