import { mkdtempSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { openDatabase, SQLITE_DRIVERS, storeOn } from '../../../test/helpers/sqlite-drivers.js'
import type { Outcome } from '../../core/store.js'

const dir = mkdtempSync(join(tmpdir(), 'idemkey-sqlite-group-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const outcome: Outcome = {
  status: 'completed',
  response: { status: 201, headers: { 'content-type': 'application/json' }, body: new TextEncoder().encode('{"id":1}') },
}

describe.each(SQLITE_DRIVERS)('SqliteStore group commit on %s', (driver) => {
  it('commits the outcomes of requests answered in one event-loop turn together, and each is on disk when its complete resolves', async () => {
    const path = join(dir, `turn-${driver}.db`)
    const store = storeOn(driver, { path })
    const frames = () => (statSync(`${path}-wal`).size - 32) / (1024 + 24)
    const tokens: number[] = []
    for (const key of ['a', 'b', 'c']) {
      const acquired = await store.acquire('s', key, 'f'.repeat(64), 30_000)
      tokens.push(acquired.kind === 'acquired' ? acquired.token : Number.NaN)
    }
    let before = frames()
    expect(await store.complete('s', 'a', tokens[0] as number, outcome, 60_000)).toBe(true)
    const alone = frames() - before
    expect(alone).toBeGreaterThan(0)

    // Two upstream answers read in one turn (their callbacks run in one macrotask; two separate timers
    // are not reliably due in the same turn on a loaded machine): their outcomes share one commit, so
    // the pages they change are written to the WAL once, as for a single outcome.
    before = frames()
    const done = await new Promise<boolean[]>((resolve) => {
      setTimeout(() => {
        const results = [
          store.complete('s', 'b', tokens[1] as number, outcome, 60_000),
          store.complete('s', 'c', tokens[2] as number, outcome, 60_000),
        ]
        void Promise.all(results).then(resolve)
      }, 0)
    })
    expect(done).toEqual([true, true])
    expect(frames() - before).toBe(alone)

    // Durable on resolve: another connection, as another process, reads both outcomes.
    const other = openDatabase(driver, path, { readOnly: true })
    const rows = other.prepare("SELECT key, status FROM idemkey_records WHERE key IN ('b', 'c') ORDER BY key").all()
    other.close()
    expect(rows).toEqual([
      { key: 'b', status: 'completed' },
      { key: 'c', status: 'completed' },
    ])
    await store.close()
  })
})
