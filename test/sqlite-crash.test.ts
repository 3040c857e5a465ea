import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { SqliteDriverName } from '../src/backends/sqlite/driver.js'
import { openDatabase, SQLITE_DRIVERS, storeOn } from './helpers/sqlite-drivers.js'

const WORKER = join(import.meta.dirname, 'fixtures/sqlite/crash-worker.ts')

interface Effect {
  key: string
  token: number
  pid: number
  started_at: number
  finished_at: number | null
}

/** Runs a worker to its end; returns whether it was killed. */
function runWorker(driver: SqliteDriverName, dbPath: string, keys: number, crash: number, seed: number): Promise<'done' | 'killed'> {
  return new Promise((resolve, reject) => {
    const child: ChildProcess = spawn(
      process.execPath,
      ['--import', 'tsx', WORKER, dbPath, String(keys), String(crash), String(seed), driver],
      {
        stdio: ['ignore', 'inherit', 'inherit'],
      },
    )
    child.once('error', reject)
    child.once('exit', (code, signal) => {
      if (signal === 'SIGKILL') resolve('killed')
      else if (code === 0) resolve('done')
      else reject(new Error(`worker exited with ${code ?? signal}`))
    })
  })
}

describe.each(SQLITE_DRIVERS)('SQLite store on %s across crashing processes', (driver) => {
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-crash-'))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  it('runs each key to one completion: crashed holders are taken over with the next token, never two holders at once', async () => {
    const dbPath = join(dir, `shared-${driver.replace(':', '-')}.db`)
    await storeOn(driver, { path: dbPath }).close() // create the schema once
    const db = openDatabase(driver, dbPath)
    db.exec('CREATE TABLE effects (key TEXT, token INTEGER, pid INTEGER, started_at INTEGER, finished_at INTEGER)')
    const KEYS = 12
    let kills = 0
    // The first life of slot 1 dies in its first execution for sure, so every run exercises a takeover. It
    // runs alone: started beside the others on a loaded machine, it could come up after they had run
    // every key, execute nothing and not die.
    if ((await runWorker(driver, dbPath, KEYS, 1, 1_000)) === 'killed') kills++
    // Three worker slots; a killed worker is replaced by a new process, as a supervisor would.
    await Promise.all(
      [1, 2, 3].map(async (slot) => {
        for (let life = slot === 1 ? 1 : 0; ; life++) {
          const crash = life >= 4 ? 0 : 0.15
          const outcome = await runWorker(driver, dbPath, KEYS, crash, slot * 1_000 + life)
          if (outcome === 'done') return
          kills++
        }
      }),
    )

    const records = storeOn(driver, { path: dbPath })
    const effects = db.prepare('SELECT * FROM effects ORDER BY key, token').all() as Effect[]
    for (let i = 0; i < KEYS; i++) {
      const key = `key-${i}`
      const record = await records.get('crash-test', key)
      expect(record?.status, key).toBe('completed')
      const runs = effects.filter((e) => e.key === key)
      const finished = runs.filter((e) => e.finished_at !== null)
      // One execution finished, and it is the one whose token the record holds.
      expect(finished.length, key).toBe(1)
      expect(finished[0]?.token, key).toBe(record?.token)
      // Every other execution was killed mid-way and had an older token: one token, one holder.
      expect(new Set(runs.map((e) => e.token)).size, key).toBe(runs.length)
      for (const run of runs.filter((e) => e.finished_at === null)) expect(run.token, key).toBeLessThan(record?.token as number)
      expect(record?.attempts, key).toBe(runs.length)
    }
    const killedRuns = effects.filter((e) => e.finished_at === null).length
    expect(killedRuns).toBe(kills)
    expect(kills).toBeGreaterThan(0) // the test did exercise crashes
    await records.close()
    db.close()
  })
})
