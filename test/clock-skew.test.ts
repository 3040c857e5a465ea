/**
 * Clock skew between processes on the stores that judge leases by the caller's clock (SQLite shared
 * by several processes, DynamoDB): each worker process runs under Debian's libfaketime with its own
 * offset (FAKETIME="+0.2" / "-0.2": Date.now() and the wall clock move, the monotonic clock does not,
 * so timers keep their real length). The multi-process suite then holds as without skew: a holder
 * killed mid-work is taken over once its lease ended, by the taker's clock, never two holders at
 * once, each key run to one completion, each key of a race run once. docs/ledger.md, "Clock skew",
 * says how much skew each store absorbs.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DynamoDbStore } from '../src/backends/dynamodb/index.js'
import { runNode } from './helpers/cli.js'
import { startDynamoDb } from './helpers/dynalite.js'
import { describeLedgerProcesses, type Line, startWorker } from './helpers/ledger-processes.js'
import { toolPath } from './helpers/services.js'
import { sqliteUrl, storeOn } from './helpers/sqlite-drivers.js'

const LIBFAKETIME = toolPath({
  name: 'faketime',
  suite: 'clock-skew tests',
  paths: ['/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1', '/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1'],
  install: 'apt-get install faketime',
})
const skip = LIBFAKETIME === undefined ? 'libfaketime is not installed' : undefined

/** The environment that runs a process `offsetMs` away from the real wall clock. */
function skewed(offsetMs: number): NodeJS.ProcessEnv {
  return {
    LD_PRELOAD: LIBFAKETIME,
    FAKETIME: `${offsetMs >= 0 ? '+' : '-'}${Math.abs(offsetMs) / 1000}`,
    // Timers run on the monotonic clock: leave it real so that a 500 ms renewal interval stays 500 ms.
    FAKETIME_DONT_FAKE_MONOTONIC: '1',
    // Not cached: each clock_gettime reads the offset (it never changes here, but the cache would also
    // make libfaketime reread a file per process).
    FAKETIME_NO_CACHE: '1',
  }
}

const dynamoDb = skip
  ? undefined
  : await (async () => {
      const dynamo = await startDynamoDb()
      const table = dynamo.table('skew')
      const store = new DynamoDbStore({ table, client: dynamo.client() })
      await store.migrate()
      return { dynamo, table, store }
    })()

/** Workers alternate ahead and behind: the first two of every test disagree by 2 x `offsetMs`. */
const alternating = (offsetMs: number) => (n: number) => skewed(n % 2 === 0 ? offsetMs : -offsetMs)

describe.skipIf(skip !== undefined)('clock skew between processes (libfaketime)', () => {
  it('moves a process wall clock by the offset while its timers keep real time', async () => {
    const script = `const t0 = Date.now(); const m0 = performance.now(); setTimeout(() => console.log(JSON.stringify({ wall: t0, elapsed: Date.now() - t0, timer: performance.now() - m0 })), 300)`
    const before = Date.now()
    const run = await runNode(['-e', script], { env: { ...process.env, ...skewed(5_000) } })
    expect(run.code, run.stderr).toBe(0)
    const out = JSON.parse(run.stdout) as {
      wall: number
      elapsed: number
      timer: number
    }
    expect(out.wall - before, 'the child started 5 s ahead of this process').toBeGreaterThan(4_000)
    expect(out.wall - before).toBeLessThan(10_000)
    expect(out.timer, 'a 300 ms timer still takes about 300 ms').toBeGreaterThanOrEqual(290)
    expect(out.elapsed, 'and the faked wall clock advances with it').toBeGreaterThanOrEqual(290)
  })

  it('takes over a live holder when the clocks disagree by more than the lease allows: why the bound in docs/ledger.md exists', async () => {
    // The control: the same workers with a taker 3 s ahead of a holder, on a 2 s lease. By the taker's
    // clock the holder's lease (renewed every 667 ms by the holder's clock) always ended 1 s ago, so it
    // takes the key over while the holder still runs it. Without this, a faketime that did not reach
    // the store would pass every test below.
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-skew-'))
    const path = join(dir, 'beyond.db')
    const log: Line[] = []
    const config = { store: sqliteUrl('node:sqlite', path), scope: 'beyond', keys: ['order'], lanes: 1, leaseMs: 2_000 }
    const holder = startWorker({ ...config, workMs: 0, hold: true }, log, skewed(-1_500))
    try {
      expect((await holder.line((w) => w[0] === 'start')).words).toEqual(['start', 'order', '1', '0'])
      const taker = startWorker({ ...config, workMs: 10 }, log, skewed(1_500))
      expect((await taker.line((w) => w[0] === 'start')).words, 'the taker ran the key with token 2 as a takeover').toEqual([
        'start',
        'order',
        '2',
        '1',
      ])
      expect(holder.child.exitCode, 'while the holder, alive, still ran it').toBeNull()
      await taker.exited
    } finally {
      holder.child.kill('SIGKILL')
      await holder.exited
      rmSync(dir, { recursive: true, force: true })
    }
  })

  // Each body below runs when vitest collects it, even skipped: what it sets up waits for beforeAll.
  describe('SqliteStore: one file, processes 400 ms apart', () => {
    let dir: string
    let store: ReturnType<typeof storeOn>
    beforeAll(() => {
      dir = mkdtempSync(join(tmpdir(), 'idemkey-skew-'))
      store = storeOn('node:sqlite', { path: join(dir, 'shared.db') })
    })
    afterAll(async () => {
      await store?.close()
      if (dir) rmSync(dir, { recursive: true, force: true })
    })
    // Skew up to a third of the lease: a lease of 3 s renewed every second.
    describeLedgerProcesses({
      url: () => sqliteUrl('node:sqlite', join(dir, 'shared.db')),
      store: () => store,
      leaseMs: 3_000,
      crashKeys: 24,
      race: { processes: 4, keys: 150 },
      env: alternating(200),
    })
  })

  describe('DynamoDbStore (dynalite): processes 800 ms apart, within the 1 s clockSkew margin', () => {
    const started = () => dynamoDb as NonNullable<typeof dynamoDb>
    afterAll(() => dynamoDb?.dynamo.stop())
    describeLedgerProcesses({
      url: () => {
        const { dynamo, table } = started()
        return `dynamodb://${table}?region=us-east-1${dynamo.endpoint ? `&endpoint=${encodeURIComponent(dynamo.endpoint)}` : ''}`
      },
      store: () => started().store,
      leaseMs: 3_000,
      crashKeys: 16,
      race: { processes: 3, keys: 60 },
      env: (n) => ({ ...alternating(400)(n), AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test', AWS_REGION: 'us-east-1' }),
    })
  })
})
