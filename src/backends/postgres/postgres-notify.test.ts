import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { eventually } from '../../../test/helpers/eventually.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { systemClock } from '../../core/clock.js'
import { Ledger } from '../../core/ledger.js'
import { fp, sampleOutcome } from '../../testing/index.js'
import { PostgresStore } from './postgres-store.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const table = `idemkey_notify_${randomUUID().slice(0, 8)}`

/** Resolves when `check` turns true, polling every few ms; rejects after `ms`. */
const until = (check: () => boolean | Promise<boolean>, what: string, ms = 5_000) => eventually(check, what, ms, 5)

describe.skipIf(skip !== undefined)('PostgresStore wake-ups (LISTEN/NOTIFY)', () => {
  const admin = new pg.Pool({ connectionString: URL, max: 2 })
  // Two stores on two pools: a waiter in one process, the holder in another.
  const holder = new PostgresStore({ connectionString: URL, table, max: 3 })
  const waiter = new PostgresStore({ connectionString: URL, table, max: 3 })
  const listeners = async () =>
    (await admin.query(`SELECT pid FROM pg_stat_activity WHERE datname = 'test' AND query = $1`, [`LISTEN "${waiter.channel}"`])).rows.map(
      (r) => r.pid as number,
    )

  const flagged = async (scope: string) =>
    (await admin.query(`SELECT count(*)::int AS n FROM "${table}" WHERE scope = $1 AND waiters`, [scope])).rows[0].n > 0

  beforeAll(() => holder.migrate())
  afterAll(async () => {
    await holder.close()
    await waiter.close()
    await admin.query(`DROP TABLE IF EXISTS "${table}"`)
    await admin.end()
  })

  it('wakes waiters of another pool when the holder completes, releases or evicts, over one LISTEN connection', async () => {
    const scope = `notify-${randomUUID()}`
    const calls = new Map<string, number>()
    // As the ledger does: the records are in progress (held by another process) when waiters watch them.
    const t0 = (await holder.acquire(scope, 'k0', fp('a'), 60_000)) as { token: number }
    const t1 = (await holder.acquire(scope, 'k1', fp('a'), 60_000)) as { token: number }
    await holder.acquire(scope, 'k2', fp('a'), 60_000)
    await holder.acquire(scope, 'k3', fp('a'), 60_000)
    const stops = Array.from({ length: 50 }, (_, i) =>
      waiter.watch?.(scope, `k${i % 5}`, () => calls.set(`k${i % 5}`, (calls.get(`k${i % 5}`) ?? 0) + 1)),
    )
    expect(await waiter.listening()).toBe(true)
    expect(await listeners()).toHaveLength(1)
    // The first LISTEN wakes every waiter once (a notice sent before it would be lost), and so does a
    // watch of a record not in progress (k4): count from here.
    await until(
      async () => (await admin.query(`SELECT count(*)::int AS n FROM "${table}" WHERE scope = $1 AND waiters`, [scope])).rows[0].n === 4,
      'the waiters flags',
    )
    await new Promise((resolve) => setTimeout(resolve, 20))
    calls.clear()
    await holder.complete(scope, 'k0', t0.token, sampleOutcome(), 60_000)
    await holder.release(scope, 'k1', t1.token)
    await holder.evict(scope, 'k2')
    await until(() => (calls.get('k0') ?? 0) >= 10 && (calls.get('k1') ?? 0) >= 10 && (calls.get('k2') ?? 0) >= 10, 'notifications')
    expect(calls.get('k3')).toBeUndefined()
    expect(calls.get('k4')).toBeUndefined()
    for (const stop of stops) stop?.()
  })

  it('sends no notice when the write was fenced out', async () => {
    const scope = `notify-${randomUUID()}`
    let calls = 0
    const { token } = (await holder.acquire(scope, 'k', fp('a'), 60_000)) as { token: number }
    const stop = waiter.watch?.(scope, 'k', () => calls++)
    expect(await waiter.listening()).toBe(true)
    await until(async () => (await holder.list({ scope }))[0]?.status === 'in_progress' && (await flagged(scope)), 'the flag')
    expect(await holder.complete(scope, 'k', token + 1, sampleOutcome(), 60_000)).toBe(false)
    // A later, real completion is the first notice this watcher sees.
    await holder.complete(scope, 'k', token, sampleOutcome(), 60_000)
    await until(() => calls > 0, 'the real notice')
    expect(calls).toBe(1)
    stop?.()
  })

  it('reconnects the LISTEN connection after it is killed and wakes its waiters meanwhile', async () => {
    const scope = `notify-${randomUUID()}`
    let calls = 0
    const { token } = (await holder.acquire(scope, 'k', fp('a'), 60_000)) as { token: number }
    const stop = waiter.watch?.(scope, 'k', () => calls++)
    expect(await waiter.listening()).toBe(true)
    await until(() => flagged(scope), 'the flag')
    const [pid] = await listeners()
    const before = calls
    await admin.query('SELECT pg_terminate_backend($1)', [pid])
    // Notices sent while nobody listened are lost, so the waiters are told to look again.
    await until(() => calls > before, 'a wake-up after the connection was lost')
    await until(async () => {
      const now = await listeners()
      return now.length === 1 && now[0] !== pid
    }, 'a new LISTEN connection')
    const seen = calls
    await holder.complete(scope, 'k', token, sampleOutcome(), 60_000)
    await until(() => calls > seen, 'a notice on the new connection')
    stop?.()
  })

  it('a waiting ledger replays as soon as another process completes the key: woken by the notice, not by polling', async () => {
    const scope = `notify-${randomUUID()}`
    const { token } = (await holder.acquire(scope, 'order', fp('a'), 60_000)) as { token: number }
    // The waiter's clock never ends a poll sleep early: only a notification (which aborts the sleep)
    // can wake it before 30 s, so a store whose notices do not arrive fails here instead of polling through.
    const ledger = new Ledger({
      store: waiter,
      wait: '60s',
      clock: { ...systemClock, sleep: (_ms, signal) => systemClock.sleep(30_000, signal) },
    })
    let answeredAt = 0
    const waiting = ledger
      .run({ scope, key: 'order', fingerprint: fp('a') }, () => 'ran again')
      .then((result) => {
        answeredAt = Date.now()
        return result
      })
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(answeredAt, 'still waiting while the holder works').toBe(0)
    await holder.complete(scope, 'order', token, sampleOutcome('completed', new TextEncoder().encode('"done once"')), 60_000)
    const completedAt = Date.now()
    await until(() => answeredAt > 0, 'the replay', 5_000)
    expect(await waiting).toMatchObject({ kind: 'replayed', value: 'done once' })
    expect(answeredAt - completedAt, 'ms from the completion to the replay').toBeLessThan(2_000)
  })
})
