import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { expectRaced } from './helpers/race-rounds.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
if (skip) console.warn(`\n!!! SKIPPED: PostgresStore multi-process race: ${skip}\n`)
const PROCESSES = 4
const KEYS = 200
/** Both layouts; the partitioned one with 1 s partitions, so a race straddles boundaries. */
const LAYOUTS = [
  { name: 'plain', prefix: 'idemkey_procs', options: {} },
  { name: 'partitioned', prefix: 'h3_procs', options: { layout: 'partitioned', partitionInterval: '1s' } as const },
]

interface Racer {
  child: ChildProcess
  lines: AsyncIterator<string>
}

async function startRacer(table: string, orders: string, layout: string, scope: string, index: number): Promise<Racer> {
  const worker = join(import.meta.dirname, 'fixtures', 'postgres', 'race-worker.ts')
  const args = ['--import', 'tsx', worker, URL, table, orders, scope, String(KEYS), String((index * KEYS) / PROCESSES), layout]
  const child = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'] })
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream })[Symbol.asyncIterator]()
  const first = await lines.next()
  if (first.value !== 'ready') throw new Error(`racer ${child.pid} did not start: ${String(first.value)}`)
  return { child, lines }
}

for (const { name, prefix, options } of LAYOUTS) describeRace(name, prefix, options)

function describeRace(layout: string, prefix: string, options: object): void {
  describe.skipIf(skip !== undefined)(`PostgresStore (${layout}) across processes`, () => {
    const suffix = randomUUID().slice(0, 8)
    const table = `${prefix}_${suffix}`
    const orders = `${prefix}_orders_${suffix}`
    const pool = new pg.Pool({ connectionString: URL, max: 2 })
    beforeAll(async () => {
      await new PostgresStore({ pool, table, ...options }).migrate()
      await pool.query(`CREATE TABLE "${orders}" (scope text NOT NULL, intent text NOT NULL, pid integer NOT NULL)`)
    })
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}", "${orders}"`)
      await pool.end()
    })

    it(`runs each of ${KEYS} keys exactly once when ${PROCESSES} processes with their own pools run them all at once`, async () => {
      await expectRaced(raceRound)
    })

    /** One race of every process over the same keys in a fresh scope; returns how many processes executed some. */
    async function raceRound(): Promise<number> {
      const scope = `procs-${randomUUID()}`
      const racers = await Promise.all(Array.from({ length: PROCESSES }, (_, i) => startRacer(table, orders, layout, scope, i)))
      for (const racer of racers) racer.child.stdin?.write('go\n')
      const reports = await Promise.all(
        racers.map(async ({ child, lines }) => {
          const line = await lines.next()
          const [code] = await once(child, 'exit')
          expect(code).toBe(0)
          return JSON.parse(line.value as string) as { pid: number; results: Array<{ key: string; kind: string; value?: number }> }
        }),
      )
      const { rows } = await pool.query(`SELECT intent, array_agg(pid) AS pids FROM "${orders}" WHERE scope = $1 GROUP BY intent`, [scope])
      const executor = new Map(rows.map((r) => [r.intent as string, r.pids as number[]]))
      expect(executor.size).toBe(KEYS)
      for (const [key, pids] of executor) expect(pids, `business rows of ${key}`).toHaveLength(1)
      for (const report of reports) {
        expect(report.results).toHaveLength(KEYS)
        for (const { key, kind, value } of report.results) {
          expect(['executed', 'replayed']).toContain(kind)
          // Whoever answered, the answer is the one execution's: replays carry the executor's pid.
          expect(value, key).toBe(executor.get(key)?.[0])
        }
      }
      const tokens = await pool.query(`SELECT max(token)::int AS max, count(*)::int AS n FROM "${table}" WHERE scope = $1`, [scope])
      expect(tokens.rows[0]).toEqual({ max: 1, n: KEYS })
      return new Set([...executor.values()].flat()).size
    }
  })
}
