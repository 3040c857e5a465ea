import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import mysql from 'mysql2/promise'
import type { AcquireResult } from '../src/core/store.js'
import { MySqlStore } from '../src/stores/mysql/index.js'
import { expectRaced } from './helpers/race-rounds.js'
import { serviceSkipReason } from './helpers/services.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
if (skip) console.warn(`\n!!! SKIPPED: MySqlStore multi-process race: ${skip}\n`)
const table = `idemkey_procs_${process.pid}_${Date.now().toString(36)}`
const PROCESSES = 4
const KEYS = 1_000

interface Racer {
  child: ChildProcess
  lines: AsyncIterator<string>
}

async function startRacer(scope: string, index: number): Promise<Racer> {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      join(import.meta.dirname, 'mysql-race-worker.ts'),
      URI,
      table,
      scope,
      String(KEYS),
      String((index * KEYS) / PROCESSES),
    ],
    {
      stdio: ['pipe', 'pipe', 'inherit'],
    },
  )
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream })[Symbol.asyncIterator]()
  const first = await lines.next()
  if (first.value !== 'ready') throw new Error(`racer ${child.pid} did not start: ${String(first.value)}`)
  return { child, lines }
}

describe.skipIf(skip !== undefined)('MySqlStore across processes', () => {
  const pool = mysql.createPool({ uri: URI, connectionLimit: 2 })
  beforeAll(() => new MySqlStore({ pool, table }).migrate())
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
    await pool.end()
  })

  it(`gives exactly one winner per key when ${PROCESSES} processes acquire the same ${KEYS} keys at once`, async () => {
    await expectRaced(raceRound)
  })

  /** One race of every process over the same keys in a fresh scope; returns how many processes won some. */
  async function raceRound(): Promise<number> {
    const scope = `procs-${Date.now()}-${Math.random().toString(36).slice(2)}`
    const racers = await Promise.all(Array.from({ length: PROCESSES }, (_, i) => startRacer(scope, i)))
    for (const racer of racers) racer.child.stdin?.write('go\n')
    const reports = await Promise.all(
      racers.map(async ({ child, lines }) => {
        const line = await lines.next()
        const [code] = await once(child, 'exit')
        expect(code).toBe(0)
        return JSON.parse(line.value as string) as { pid: number; results: Array<{ key: string; result: AcquireResult }> }
      }),
    )
    const winners = new Map<string, number[]>()
    for (const report of reports) {
      expect(report.results).toHaveLength(KEYS)
      for (const { key, result } of report.results) {
        if (result.kind === 'acquired') {
          expect(result.token).toBe(1)
          winners.set(key, [...(winners.get(key) ?? []), report.pid])
        } else expect(result.kind).toBe('in_progress')
      }
    }
    expect(winners.size).toBe(KEYS)
    for (const [key, pids] of winners) expect(pids, key).toHaveLength(1)
    const [rows] = await pool.query(`SELECT COUNT(*) AS n, MAX(token) AS maxToken FROM \`${table}\` WHERE scope = ?`, [Buffer.from(scope)])
    expect(rows).toEqual([{ n: KEYS, maxToken: 1 }])
    return new Set([...winners.values()].flat()).size
  }
})
