/**
 * The partitioned layout's upkeep, rule by rule: partition names, bounds and listing, what a rotation
 * creates ahead and what it drops (ended partitions whose records all expired) or keeps, the
 * statements it sends and how its transactions end, and the `gc` loop of PostgresTasks (its options,
 * its rounds, its error reports, stop()). Against the PostgreSQL at 127.0.0.1:5432, on tables of its own;
 * the loop's own rules run on fake timers with a fake store.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { inTransaction as inClientTransaction } from '../../../test/fixtures/messaging/pg.js'
import { eventually } from '../../../test/helpers/eventually.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { TcpFaultProxy } from '../../../test/helpers/tcp-fault-proxy.js'
import { IdempotencyError } from '../../errors.js'
import { fp } from '../../testing/index.js'
import {
  assertPartitionedName,
  createPartitions,
  intervalOf,
  layoutComment,
  listPartitions,
  PARTITIONED_TABLE_MAX,
  partitionedTableDdl,
  serverNow,
  slotOf,
} from './partitions.js'
import type { PgClientLike, PgPoolLike, PgQueryConfig, PgQueryResult } from './pool.js'
import { PostgresStore } from './postgres-store.js'
import { dropExpiredPartitions, ensurePartitions, inTransaction } from './rotation.js'
import { PostgresTasks } from './tasks.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
if (skip) console.warn(`\n!!! SKIPPED: partition rotation rules against PostgreSQL: ${skip}\n`)
const suffix = randomUUID().slice(0, 8)
const DAY = 86_400_000
const HOUR = 3_600_000

/** A pool that needs no server: every statement fails (for checks that never reach one). */
const offline: PgPoolLike = {
  query: (() => Promise.reject(new Error('offline'))) as PgPoolLike['query'],
  connect: () => Promise.reject(new Error('offline')),
}

/**
 * A pool that logs the statements sent on it and its clients, and the release of each client; `fail`
 * can make a statement fail and `answer` answer it instead of the server.
 */
function spyPool(pool: pg.Pool) {
  const sent: Array<{ text: string; values?: unknown[]; on: 'pool' | 'client' }> = []
  const released: Array<boolean | Error | undefined> = []
  const hooks: {
    fail?: (text: string) => unknown
    answer?: (text: string) => PgQueryResult | undefined
  } = {}
  const through = async (
    text: string | PgQueryConfig,
    values: unknown[] | undefined,
    on: 'pool' | 'client',
    run: (c: PgQueryConfig) => Promise<PgQueryResult>,
  ) => {
    const config = typeof text === 'string' ? { text, values } : text
    sent.push({ text: config.text, values: config.values, on })
    const failure = hooks.fail?.(config.text)
    if (failure !== undefined) throw failure
    return hooks.answer?.(config.text) ?? run(config)
  }
  const wrapped: PgPoolLike = {
    query: ((text: string | PgQueryConfig, values?: unknown[]) =>
      through(text, values, 'pool', (c) => pool.query(c) as Promise<PgQueryResult>)) as PgPoolLike['query'],
    connect: async () => {
      const client = await pool.connect()
      return {
        query: ((text: string | PgQueryConfig, values?: unknown[]) =>
          through(text, values, 'client', (c) => client.query(c) as Promise<PgQueryResult>)) as PgClientLike['query'],
        release: (destroy?: boolean | Error) => {
          released.push(destroy)
          client.release(destroy)
        },
      }
    },
  }
  return { pool: wrapped, sent, released, hooks }
}

describe('partition naming, comments and option checks (no server needed)', () => {
  it('writes and reads back the layout comment, with the interval of a partitioned table', () => {
    expect(layoutComment(2, 'partitioned', 1_000)).toBe(
      'idemkey schema 2 partitioned 1000: idempotency records (scope, key) in time partitions of 1000 ms',
    )
    expect(layoutComment(2, 'plain', 1_000)).toBe('idemkey schema 2: idempotency records (scope, key)')
    expect(intervalOf(layoutComment(2, 'partitioned', 86_400_000))).toBe(86_400_000)
    expect(intervalOf(layoutComment(2, 'plain', 1_000))).toBeUndefined()
    expect(intervalOf(null)).toBeUndefined()
  })

  it(`accepts a partitioned table name of up to ${PARTITIONED_TABLE_MAX} characters and refuses a longer one, saying why`, () => {
    expect(PARTITIONED_TABLE_MAX).toBe(47)
    const longest = 't'.repeat(47)
    expect(() => assertPartitionedName(longest)).not.toThrow()
    expect(() => new PostgresStore({ pool: offline, table: longest, layout: 'partitioned' })).not.toThrow()
    const tooLong = 't'.repeat(48)
    let error: unknown
    try {
      new PostgresStore({ pool: offline, table: tooLong, layout: 'partitioned' })
    } catch (e) {
      error = e
    }
    expect(error).toBeInstanceOf(IdempotencyError)
    expect((error as IdempotencyError).code).toBe('INVALID_OPTION')
    expect((error as IdempotencyError).message).toBe(
      `PostgresStore table "${tooLong}" is too long for layout 'partitioned': its partitions are named <table>_p<ms>, so the table may have up to 47 characters.`,
    )
    // The plain layout names no partitions: the same name is fine there.
    expect(() => new PostgresStore({ pool: offline, table: tooLong })).not.toThrow()
  })

  it('refuses a gc interval that is not a duration, naming gc.interval', () => {
    expect(() => new PostgresStore({ pool: offline, gc: { interval: 'soon' } })).toThrow(
      'gc.interval "soon" is not a duration: use milliseconds or a number with a unit',
    )
    expect(() => new PostgresStore({ pool: offline, gc: { interval: -1 } })).toThrow(
      'gc.interval must be a non-negative number of milliseconds, got -1.',
    )
  })
})

describe('the gc loop (PostgresTasks, fake timers, a fake store)', () => {
  beforeEach(() => {
    vi.useFakeTimers()
  })
  afterEach(() => {
    vi.useRealTimers()
  })

  /** A store whose purges answer `answers` in turn (then 0), logging each limit; fails past 50 calls. */
  function fakeStore(answers: Array<number | Error> = []) {
    const limits: number[] = []
    return {
      limits,
      purgeExpired: async (limit?: number) => {
        limits.push(limit as number)
        if (limits.length > 50) throw new Error('too many purges')
        const answer = answers[limits.length - 1] ?? 0
        if (answer instanceof Error) throw answer
        return answer
      },
    }
  }

  it('runs no round without the option or with gc: false; with gc: true, a round every minute of batches of 1000', async () => {
    for (const options of [undefined, false] as const) {
      const store = fakeStore()
      const tasks = new PostgresTasks(store, options)
      await vi.advanceTimersByTimeAsync(180_000)
      expect(store.limits).toEqual([])
      await tasks.stop()
    }
    const store = fakeStore()
    const tasks = new PostgresTasks(store, true)
    await vi.advanceTimersByTimeAsync(59_999)
    expect(store.limits).toEqual([])
    await vi.advanceTimersByTimeAsync(1)
    expect(store.limits).toEqual([1_000])
    await vi.advanceTimersByTimeAsync(60_000)
    expect(store.limits).toEqual([1_000, 1_000])
    await tasks.stop()
  })

  it('a round purges batch after batch until one deletes fewer than its limit, and returns the total', async () => {
    const store = fakeStore([1_000, 1_000, 999, 1_000])
    const tasks = new PostgresTasks(store, undefined)
    expect(await tasks.round()).toBe(2_999)
    expect(store.limits).toEqual([1_000, 1_000, 1_000])
    const sized = fakeStore([7, 7, 0])
    expect(await new PostgresTasks(sized, { batchSize: 7, interval: '1h' }).round()).toBe(14)
    expect(sized.limits).toEqual([7, 7, 7])
    const short = fakeStore([6])
    expect(await new PostgresTasks(short, { batchSize: 7, interval: '1h' }).round()).toBe(6)
    expect(short.limits).toEqual([7])
  })

  it('on the partitioned layout a round rotates instead of purging', async () => {
    const store = fakeStore([5])
    let rotations = 0
    const tasks = new PostgresTasks(store, { interval: 100 }, async () => {
      rotations++
      return { created: [], dropped: [] }
    })
    expect(await tasks.round()).toBe(0)
    await vi.advanceTimersByTimeAsync(250)
    expect(rotations).toBe(3)
    expect(store.limits).toEqual([])
    await tasks.stop()
  })

  it('reports a failing round to onError and keeps going', async () => {
    const boom = new Error('purge failed')
    const store = fakeStore([boom, 0, 0])
    const errors: unknown[] = []
    const tasks = new PostgresTasks(store, { interval: 100, onError: (e) => errors.push(e) })
    await vi.advanceTimersByTimeAsync(100)
    expect(errors).toEqual([boom])
    await vi.advanceTimersByTimeAsync(200)
    expect(store.limits).toHaveLength(3)
    expect(errors).toEqual([boom])
    await tasks.stop()
  })

  it('without onError a failing round is swallowed: no unhandled rejection, and stop() resolves', async () => {
    const store = fakeStore([new Error('one'), new Error('two')])
    const tasks = new PostgresTasks(store, { interval: 100 })
    await vi.advanceTimersByTimeAsync(100)
    expect(store.limits).toHaveLength(1)
    await expect(tasks.stop()).resolves.toBeUndefined()
  })

  it('stop() ends a round of full batches after the batch in flight, waits for it, and no round follows', async () => {
    const store = fakeStore(Array.from({ length: 60 }, () => 5))
    const errors: unknown[] = []
    const tasks = new PostgresTasks(store, { interval: 100, batchSize: 5, onError: (e) => errors.push(e) })
    let stopping: Promise<void> | undefined
    const purge = store.purgeExpired
    store.purgeExpired = async (limit?: number) => {
      const n = await purge(limit)
      if (store.limits.length === 3) stopping = tasks.stop()
      return n
    }
    await vi.advanceTimersByTimeAsync(100)
    await stopping
    expect(store.limits).toEqual([5, 5, 5])
    await vi.advanceTimersByTimeAsync(1_000)
    expect(store.limits).toEqual([5, 5, 5])
    expect(errors).toEqual([])
  })

  it('stop() between rounds: no round runs after it', async () => {
    const store = fakeStore()
    const tasks = new PostgresTasks(store, { interval: 100 })
    await vi.advanceTimersByTimeAsync(250)
    expect(store.limits).toHaveLength(2)
    await tasks.stop()
    await vi.advanceTimersByTimeAsync(1_000)
    expect(store.limits).toHaveLength(2)
  })
})

describe.skipIf(skip !== undefined)('partitions and their rotation, against PostgreSQL', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 6 })
  const tables: string[] = []
  const table = (name: string) => {
    const t = `rot_${name}_${suffix}`
    tables.push(t)
    return t
  }
  afterAll(async () => {
    for (const t of tables) await pool.query(`DROP TABLE IF EXISTS "${t}"`)
    await pool.end()
  })

  /** A partitioned table made from its DDL, with `comment` (or none). */
  async function bare(name: string, comment?: string) {
    const t = table(name)
    for (const ddl of partitionedTableDdl('public', t)) await pool.query(ddl)
    if (comment) await pool.query(`COMMENT ON TABLE "${t}" IS '${comment}'`)
    return t
  }
  /** `fn` in a transaction of its own on the test's pool. */
  const inTx = <R>(fn: (client: pg.PoolClient) => Promise<R>) => inClientTransaction(pool, fn)

  /** A record written straight into the table, created at `createdAt`, expiring at `expiresAt`. */
  async function insert(t: string, key: string, createdAt: number, expiresAt: number) {
    await pool.query(
      `INSERT INTO "${t}" (scope, "key", fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at)
       VALUES ('s', $1, $2, 'completed', 1, NULL, 1, $3, $3, $4)`,
      [key, fp('a'), createdAt, expiresAt],
    )
  }
  const exists = async (name: string) => (await pool.query('SELECT to_regclass($1) AS r', [`public."${name}"`])).rows[0].r !== null

  it('creates the partitions of given slots once each, in order, skipping any that overlaps one already there; lists them oldest first', async () => {
    const t = await bare('create')
    const made = await inTx((c) => createPartitions(c, 'public', t, 1_000, [3_000, 1_000, 3_000, 5_000]))
    expect(made).toEqual([`${t}_p1000`, `${t}_p3000`, `${t}_p5000`])
    // 2_500 overlaps [3000, 4000) and 1_000 exists; 2_000 and 0 are new (made after the others: listing sorts them).
    const more = await inTx((c) => createPartitions(c, 'public', t, 1_000, [2_500, 1_000, 0]))
    expect(more).toEqual([`${t}_p0`])
    expect(await inTx((c) => createPartitions(c, 'public', t, 1_000, [2_000]))).toEqual([`${t}_p2000`])
    expect(await listPartitions(pool, 'public', t)).toEqual([
      { name: `${t}_p0`, fromMs: 0, toMs: 1_000 },
      { name: `${t}_p1000`, fromMs: 1_000, toMs: 2_000 },
      { name: `${t}_p2000`, fromMs: 2_000, toMs: 3_000 },
      { name: `${t}_p3000`, fromMs: 3_000, toMs: 4_000 },
      { name: `${t}_p5000`, fromMs: 5_000, toMs: 6_000 },
    ])
  })

  it('migrate on the partitioned layout makes the indexes on the parent and the partition of now and two ahead', async () => {
    const t = table('migrate')
    const store = new PostgresStore({ pool, table: t, layout: 'partitioned', partitionInterval: '1d' })
    await store.migrate()
    const indexes = (
      await pool.query(`SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND tablename = $1 ORDER BY indexname`, [t])
    ).rows
    expect(indexes.map((r) => r.indexname)).toEqual([`${t}_expires_at`, `${t}_in_progress`, `${t}_pkey`])
    const slot = slotOf(await serverNow(pool), DAY)
    expect(await listPartitions(pool, 'public', t)).toEqual(
      [slot, slot + DAY, slot + 2 * DAY].map((from) => ({ name: `${t}_p${from}`, fromMs: from, toMs: from + DAY })),
    )
    await store.close()
  })

  it("ensurePartitions cuts by the interval in the table's comment, else the fallback; on a missing table it fails with the server's error", async () => {
    const commented = await bare('commented', layoutComment(2, 'partitioned', DAY))
    const slot = slotOf(await serverNow(pool), DAY)
    expect(await ensurePartitions(pool, 'public', commented, 60_000)).toEqual([0, 1, 2].map((i) => `${commented}_p${slot + i * DAY}`))
    expect((await listPartitions(pool, 'public', commented)).map((p) => p.toMs - p.fromMs)).toEqual([DAY, DAY, DAY])
    const uncommented = await bare('uncommented')
    const made = await ensurePartitions(pool, 'public', uncommented, DAY)
    expect(made).toEqual([0, 1, 2].map((i) => `${uncommented}_p${slot + i * DAY}`))
    // Nothing left to make.
    expect(await ensurePartitions(pool, 'public', uncommented, DAY)).toEqual([])
    await expect(ensurePartitions(pool, 'public', `rot_missing_${suffix}`, DAY)).rejects.toMatchObject({ code: '42P01' })
  })

  it('ensurePartitions sends, in one transaction: a lock timeout, the per-table partition lock, then its creations', async () => {
    const t = await bare('ensure_sql', layoutComment(2, 'partitioned', DAY))
    const spy = spyPool(pool)
    await ensurePartitions(spy.pool, 'public', t, DAY)
    const onClient = spy.sent.filter((s) => s.on === 'client')
    expect(onClient[0]?.text).toBe('BEGIN ISOLATION LEVEL READ COMMITTED')
    expect(onClient[1]?.text).toBe(`SET LOCAL lock_timeout = '500ms'`)
    expect(onClient[2]).toEqual({
      text: 'SELECT pg_advisory_xact_lock(hashtext($1))',
      values: [`idemkey:partitions:public.${t}`],
      on: 'client',
    })
    expect(onClient.filter((s) => s.text.startsWith('ALTER TABLE')).length).toBe(3)
    expect(onClient[onClient.length - 1]?.text).toBe('COMMIT')
    expect(spy.released).toEqual([false])
  })

  it('rotation drops each ended partition whose records all expired, keeps one with a live record and those not ended (empty or not), and returns both lists', async () => {
    const t = table('rotate')
    const store = new PostgresStore({ pool, table: t, layout: 'partitioned', partitionInterval: '1d' })
    await store.migrate()
    const current = await listPartitions(pool, 'public', t)
    await inTx((c) => createPartitions(c, 'public', t, DAY, [DAY, 2 * DAY, 3 * DAY]))
    const now = await serverNow(pool)
    await insert(t, 'expired-1', DAY + 5, now - 1_000)
    await insert(t, 'expired-2', DAY + 6, 2 * DAY)
    await insert(t, 'live', 2 * DAY + 5, now + HOUR)
    const spy = spyPool(pool)
    const rotation = await new PostgresStore({
      pool: spy.pool,
      table: t,
      layout: 'partitioned',
      partitionInterval: '1d',
    }).rotatePartitions()
    expect(rotation).toEqual({ created: [], dropped: [`${t}_p${DAY}`, `${t}_p${3 * DAY}`] })
    expect((await listPartitions(pool, 'public', t)).map((p) => p.name)).toEqual([`${t}_p${2 * DAY}`, ...current.map((p) => p.name)])
    expect(await exists(`${t}_p${DAY}`)).toBe(false)
    expect(await exists(`${t}_p${3 * DAY}`)).toBe(false)
    expect((await pool.query(`SELECT "key" FROM "${t}"`)).rows).toEqual([{ key: 'live' }])
    // The drop of p<DAY>: under the locks, the live-record check, then detach and drop.
    const p = `"public"."${t}_p${DAY}"`
    const texts = spy.sent.filter((s) => s.on === 'client').map((s) => s.text.replace(/\s+/g, ' '))
    const at = texts.indexOf(`LOCK TABLE ONLY "public"."${t}" IN ACCESS EXCLUSIVE MODE`)
    expect(at).toBeGreaterThan(0)
    expect(texts.slice(at - 3, at + 6)).toEqual([
      'BEGIN ISOLATION LEVEL READ COMMITTED',
      `SET LOCAL lock_timeout = '500ms'`,
      'SELECT pg_advisory_xact_lock(hashtext($1))',
      `LOCK TABLE ONLY "public"."${t}" IN ACCESS EXCLUSIVE MODE`,
      `LOCK TABLE ${p} IN ACCESS EXCLUSIVE MODE`,
      `SELECT 1 FROM ${p} WHERE expires_at > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint LIMIT 1`,
      `ALTER TABLE "public"."${t}" DETACH PARTITION ${p}`,
      `DROP TABLE ${p}`,
      'COMMIT',
    ])
    expect(spy.released.every((r) => r === false)).toBe(true)
    // A second round has nothing to do.
    expect(await store.rotatePartitions()).toEqual({ created: [], dropped: [] })
  })

  it('a rotation creates the partitions of now and ahead that are missing, and names them', async () => {
    const t = await bare('ahead', layoutComment(2, 'partitioned', DAY))
    const slot = slotOf(await serverNow(pool), DAY)
    await inTx((c) => createPartitions(c, 'public', t, DAY, [slot + DAY]))
    const rotation = await new PostgresStore({ pool, table: t, layout: 'partitioned', partitionInterval: '1h' }).rotatePartitions()
    expect(rotation).toEqual({ created: [`${t}_p${slot}`, `${t}_p${slot + 2 * DAY}`], dropped: [] })
  })

  it('a partition that ends exactly at the present has ended', async () => {
    const t = await bare('edge', layoutComment(2, 'partitioned', DAY))
    await inTx((c) => createPartitions(c, 'public', t, DAY, [DAY, 2 * DAY]))
    const spy = spyPool(pool)
    spy.hooks.answer = (text) => (text.includes('AS ms') ? { rows: [{ ms: String(3 * DAY) }], rowCount: 1 } : undefined)
    expect(await dropExpiredPartitions(spy.pool, 'public', t)).toEqual([`${t}_p${DAY}`, `${t}_p${2 * DAY}`])
  })

  it('a drop whose locks are busy (55P03) is left for the next round and the newer ones still go; any other error fails the rotation', async () => {
    const t = await bare('busy', layoutComment(2, 'partitioned', DAY))
    await inTx((c) => createPartitions(c, 'public', t, DAY, [DAY, 2 * DAY, 3 * DAY]))
    const spy = spyPool(pool)
    spy.hooks.fail = (text) =>
      text === `LOCK TABLE "public"."${t}_p${DAY}" IN ACCESS EXCLUSIVE MODE`
        ? Object.assign(new Error('lock timeout'), { code: '55P03' })
        : undefined
    expect(await dropExpiredPartitions(spy.pool, 'public', t)).toEqual([`${t}_p${2 * DAY}`, `${t}_p${3 * DAY}`])
    expect((await listPartitions(pool, 'public', t)).map((p) => p.name)).toEqual([`${t}_p${DAY}`])
    const denied = Object.assign(new Error('permission denied'), { code: '42501' })
    spy.hooks.fail = (text) => (text.startsWith('LOCK TABLE ONLY') ? denied : undefined)
    await expect(dropExpiredPartitions(spy.pool, 'public', t)).rejects.toBe(denied)
    expect((await listPartitions(pool, 'public', t)).map((p) => p.name)).toEqual([`${t}_p${DAY}`])
  })

  describe('inTransaction: how its connection goes back', () => {
    it('commits and pools the connection on success', async () => {
      const spy = spyPool(pool)
      expect(await inTransaction(spy.pool, async (tx) => (await tx.query('SELECT 7 AS n')).rows)).toEqual([{ n: 7 }])
      expect(spy.sent.map((s) => s.text)).toEqual(['BEGIN ISOLATION LEVEL READ COMMITTED', 'SELECT 7 AS n', 'COMMIT'])
      expect(spy.released).toEqual([false])
    })

    it("rolls back and pools the connection after the server's own error (a SQLSTATE)", async () => {
      const spy = spyPool(pool)
      await expect(inTransaction(spy.pool, (tx) => tx.query('SELECT 1/0'))).rejects.toMatchObject({ code: '22012' })
      expect(spy.sent.map((s) => s.text)).toEqual(['BEGIN ISOLATION LEVEL READ COMMITTED', 'SELECT 1/0', 'ROLLBACK'])
      expect(spy.released).toEqual([false])
    })

    it('destroys the connection, without a ROLLBACK, after an error that is not a SQLSTATE', async () => {
      const failures: unknown[] = [
        new Error('query timeout'),
        Object.assign(new Error('reset'), { code: 'ECONNRESET' }),
        Object.assign(new Error('short'), { code: '2201' }),
        Object.assign(new Error('lowercase'), { code: '22p01' }),
        Object.assign(new Error('numeric'), { code: 22012 }),
        null,
      ]
      for (const failure of failures) {
        const spy = spyPool(pool)
        const outcome = await inTransaction(spy.pool, () => Promise.reject(failure)).then(
          () => 'resolved',
          (error: unknown) => error,
        )
        expect(outcome).toBe(failure)
        expect(spy.sent.map((s) => s.text)).toEqual(['BEGIN ISOLATION LEVEL READ COMMITTED'])
        expect(spy.released, String((failure as { code?: unknown } | null)?.code)).toEqual([true])
      }
    })

    it('destroys the connection when the ROLLBACK fails too, and reports the first error', async () => {
      const spy = spyPool(pool)
      const first = Object.assign(new Error('serialization'), { code: '40001' })
      spy.hooks.fail = (text) => (text === 'ROLLBACK' ? new Error('gone') : undefined)
      await expect(inTransaction(spy.pool, () => Promise.reject(first))).rejects.toBe(first)
      expect(spy.sent.map((s) => s.text)).toEqual(['BEGIN ISOLATION LEVEL READ COMMITTED', 'ROLLBACK'])
      expect(spy.released).toEqual([true])
    })

    it('keeps the process up when its connection is cut mid-statement, and destroys that connection', async () => {
      const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: 5432 })
      const proxied = new pg.Pool({ connectionString: URL.replace(':5432/', `:${proxy.port}/`), max: 1 })
      proxied.on('error', () => {})
      try {
        await proxied.query('SELECT 1') // one idle connection, through the proxy
        proxy.blackhole()
        const running = inTransaction(proxied as unknown as PgPoolLike, (tx) => tx.query('SELECT 1')).catch((error: unknown) => error)
        await proxy.held() // its BEGIN sent, unanswered
        // node-postgres emits the loss as 'error' on the client: with no listener, the process would crash.
        expect(proxy.cut()).toBe(1)
        expect(await running).toMatchObject({ message: 'Connection terminated unexpectedly' })
        expect(proxied.totalCount).toBe(0) // destroyed, not pooled
      } finally {
        await proxied.end()
        await proxy.close()
      }
    }, 10_000)
  })

  it("the store's gc loop on the plain layout purges, reports a failing round to onError and goes on, and sends nothing after close()", async () => {
    const t = table('loop')
    await new PostgresStore({ pool, table: t }).migrate()
    const now = await serverNow(pool)
    for (let i = 0; i < 3; i++) await insert(t, `k${i}`, now - 10_000, now - 5_000)
    const spy = spyPool(pool)
    let failNext = true
    spy.hooks.fail = (text) => {
      if (!text.includes('DELETE') || !failNext) return undefined
      failNext = false
      return Object.assign(new Error('purge refused'), { code: '57014' })
    }
    const errors: unknown[] = []
    const store = new PostgresStore({ pool: spy.pool, table: t, gc: { interval: 30, batchSize: 2, onError: (e) => errors.push(e) } })
    const count = async () => Number((await pool.query(`SELECT count(*) AS n FROM "${t}"`)).rows[0].n)
    await eventually(async () => (await count()) === 0, 'the loop purges every expired row', 5_000, 20)
    expect(errors).toHaveLength(1)
    expect((errors[0] as Error).message).toContain('purge refused')
    // Still going: more rounds come.
    const seen = spy.sent.length
    await eventually(() => spy.sent.length >= seen + 2, 'more rounds', 5_000, 20)
    await store.close()
    const after = spy.sent.length
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(spy.sent.length).toBe(after)
  })
})
