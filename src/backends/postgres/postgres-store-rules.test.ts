/**
 * PostgresStore's rules, one by one: option checks and their messages, how driver errors are typed,
 * the statements it sends (named or not, bounded by queryTimeout), acquire's give-up, list and purge
 * bounds, filters and order, its own transactions (isolation, COMMIT and ROLLBACK failures), and what
 * close() leaves open. Against the PostgreSQL at 127.0.0.1:5432, each test on a table of its own.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { eventually } from '../../../test/helpers/eventually.js'
import { type SentOn, tapPool } from '../../../test/helpers/pg-pool-tap.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { hangMidTransaction, TcpFaultProxy } from '../../../test/helpers/tcp-fault-proxy.js'
import type { Outcome } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { fp } from '../../testing/index.js'
import { channelName } from './connect.js'
import { layoutComment, listPartitions, PARTITIONS_AHEAD, serverNow, slotOf } from './partitions.js'
import type { PgClientLike, PgPoolLike, PgQueryConfig, PgQueryResult } from './pool.js'
import { isTransientTransactionError, toStoreError } from './postgres-errors.js'
import { PostgresStore } from './postgres-store.js'
import { SCHEMA_VERSION } from './schema.js'
import { statements } from './statements.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
if (skip) console.warn(`\n!!! SKIPPED: PostgresStore rules against PostgreSQL: ${skip}\n`)
const suffix = randomUUID().slice(0, 8)
const LEASE = 30_000
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const outcome = (body = 'ok'): Outcome => ({
  status: 'completed',
  response: { status: 201, headers: { 'content-type': 'text/plain' }, body: new TextEncoder().encode(body) },
})

/** A pool that needs no server: every statement fails (for checks that never reach one). */
const offline: PgPoolLike = {
  query: (() => Promise.reject(new Error('offline'))) as PgPoolLike['query'],
  connect: () => Promise.reject(new Error('offline')),
}

/** What `fn` throws (fails the test when it does not). */
async function thrown(fn: () => unknown): Promise<IdempotencyError> {
  try {
    await fn()
  } catch (error) {
    return error as IdempotencyError
  }
  throw new Error('expected a throw')
}

/**
 * A pool that logs what the store sends (on the pool and on its clients: configs and plain strings)
 * and can answer a statement itself (`answer`) or fail it (`fail`), on the pool or on a client.
 */
function spyPool(pool: PgPoolLike) {
  const sent: Array<PgQueryConfig & { on: SentOn }> = []
  const released: Array<boolean | Error | undefined> = []
  let answer: ((config: PgQueryConfig, on: SentOn) => PgQueryResult | undefined) | undefined
  let fail: ((text: string, on: SentOn) => unknown) | undefined
  const wrapped = tapPool(pool, {
    async through(config, on, run) {
      sent.push({ ...config, on })
      const failure = fail?.(config.text, on)
      if (failure !== undefined) throw failure
      return answer?.(config, on) ?? run(config)
    },
    released: (destroy) => released.push(destroy),
  })
  return {
    pool: wrapped,
    sent,
    released,
    answerWith: (fn: typeof answer) => {
      answer = fn
    },
    failWith: (fn: typeof fail) => {
      fail = fn
    },
  }
}

describe('PostgresStore option checks (no server needed)', () => {
  it('needs exactly one of pool and connectionString, and says so', () => {
    const neither = () => new PostgresStore({} as never)
    const both = () => new PostgresStore({ pool: offline, connectionString: URL } as never)
    for (const make of [neither, both]) {
      expect(make).toThrow(IdempotencyError)
      expect(make).toThrow('PostgresStore needs exactly one of { pool } (a pg.Pool) or { connectionString }')
    }
  })

  it('is named postgres, on the server clock, and refuses no options at all with INVALID_OPTION (not a TypeError)', () => {
    const store = new PostgresStore({ pool: offline })
    expect(store.name).toBe('postgres')
    expect(store.serverClock).toBe(true)
    expect(() => new PostgresStore(undefined as never)).toThrow(IdempotencyError)
  })

  it("refuses a queryTimeout past 24.8 days, which pg's query_timeout timer would cut to 1 ms, and takes 0 (no bound)", () => {
    expect(() => new PostgresStore({ pool: offline, queryTimeout: 2 ** 31 })).toThrow(
      /^queryTimeout 2147483648ms is longer than 24\.8 days \(2147483647 ms\), the longest delay a Node timer keeps/,
    )
    expect(() => new PostgresStore({ pool: offline, queryTimeout: 0 })).not.toThrow()
  })

  it('says what a table or schema name must be', () => {
    expect(() => new PostgresStore({ pool: offline, table: 'no-dash' })).toThrow(
      'PostgresStore table "no-dash" must be a plain SQL identifier (letters, digits, underscore; up to 63).',
    )
    expect(() => new PostgresStore({ pool: offline, schema: '1st' })).toThrow('PostgresStore schema "1st" must be a plain SQL identifier')
  })

  it('refuses a transactions option that is not an adapter', () => {
    expect(() => new PostgresStore({ pool: offline, transactions: {} as never })).toThrow(
      'PostgresStore transactions must come from an adapter',
    )
  })

  it('names the argument a bad lease, TTL or purge limit is in', async () => {
    const store = new PostgresStore({ pool: offline })
    expect((await thrown(() => store.acquire('s', 'k', fp('a'), 0))).message).toContain('leaseMs')
    expect((await thrown(() => store.renew('s', 'k', 1, -5))).message).toContain('leaseMs')
    expect((await thrown(() => store.complete('s', 'k', 1, outcome(), 0))).message).toContain('ttlMs')
    expect((await thrown(() => store.purgeExpired(0))).message).toContain('limit')
  })

  it('names the failed operation in the error of each, batched or not', async () => {
    for (const groupCommit of [true, false]) {
      const store = new PostgresStore({ pool: offline, groupCommit })
      const calls: Array<[string, () => Promise<unknown>]> = [
        ['acquire', () => store.acquire('s', 'k', fp('a'), LEASE)],
        ['renew', () => store.renew('s', 'k', 1, LEASE)],
        ['complete', () => store.complete('s', 'k', 1, outcome(), 1_000)],
        ['recordStep', () => store.recordStep('s', 'k', 1, 'charge', 'r')],
        ['release', () => store.release('s', 'k', 1)],
        ['get', () => store.get('s', 'k')],
        ['list', () => store.list()],
        ['purgeExpired', () => store.purgeExpired(10)],
        ['evict', () => store.evict('s', 'k')],
        ['transaction', () => store.transaction(async () => 1)],
      ]
      for (const [operation, call] of calls) {
        const error = await thrown(call)
        expect(error.code, operation).toBe('STORE_UNAVAILABLE')
        expect(error.message, `groupCommit ${groupCommit}`).toMatch(new RegExp(`^postgres: ${operation} failed: offline\\.`))
      }
    }
  })

  it('has no watch and is not listening with notifications: false, and closes without a listener', async () => {
    const quiet = new PostgresStore({ pool: offline, notifications: false })
    expect(quiet.watch).toBeUndefined()
    expect(await quiet.listening()).toBe(false)
    await quiet.close()
    expect(typeof new PostgresStore({ pool: offline }).watch).toBe('function')
  })

  it('closes a store whose connection string never connected', async () => {
    const store = new PostgresStore({ connectionString: 'postgres://root@127.0.0.1:1/test', connectionTimeout: '1s' })
    await expect(store.get('s', 'k')).rejects.toThrow(IdempotencyError)
    await store.close()
  })

  it("names a table's NOTIFY channel after it, with its schema unless public, and a digest past 63 characters", () => {
    expect(channelName('public', 'records')).toBe('records')
    expect(channelName('app', 'records')).toBe('app.records')
    const long = 't'.repeat(63)
    expect(channelName('public', long)).toBe(long)
    const longer = channelName('public', `${long}x`)
    expect(longer).toMatch(/^idemkey_[0-9a-f]{32}$/)
    expect(longer).not.toBe(channelName('public', `${long}y`))
    expect(channelName('app', 't'.repeat(59))).toBe(`app.${'t'.repeat(59)}`)
    expect(channelName('app', 't'.repeat(60))).toMatch(/^idemkey_/)
    expect(new PostgresStore({ pool: offline, schema: 'app', table: 'records' }).channel).toBe('app.records')
  })

  it('refuses a layout other than plain or partitioned, naming what it got', async () => {
    const error = await thrown(() => new PostgresStore({ pool: offline, layout: 'sharded' as never }))
    expect(error?.code).toBe('INVALID_OPTION')
    expect(error?.message).toBe(`PostgresStore layout must be 'plain' or 'partitioned', got "sharded".`)
  })

  it('refuses an isolation level PostgreSQL does not have, and takes each one it has', async () => {
    const error = await thrown(() => new PostgresStore({ pool: offline, isolationLevel: 'read uncommitted' as never }))
    expect(error?.code).toBe('INVALID_OPTION')
    expect(() => new PostgresStore({ pool: offline, isolationLevel: 'read uncommitted' as never })).toThrow(
      `PostgresStore isolationLevel must be 'read committed', 'repeatable read' or 'serializable', got "read uncommitted".`,
    )
    for (const level of ['read committed', 'repeatable read', 'serializable'] as const) {
      expect(() => new PostgresStore({ pool: offline, isolationLevel: level })).not.toThrow()
    }
  })

  it('checks its durations: partitionInterval, abandonedRetention, queryTimeout and connectionTimeout', () => {
    for (const option of ['partitionInterval', 'abandonedRetention', 'queryTimeout', 'connectionTimeout'] as const) {
      const make = () => new PostgresStore({ connectionString: URL, [option]: 'soon' })
      expect(make, option).toThrow(IdempotencyError)
      expect(make, option).toThrow(option)
    }
  })

  it('names the default table idemkey_records in the public schema, and the notification channel after them', () => {
    const store = new PostgresStore({ pool: offline })
    expect([store.schema, store.table, store.layout]).toEqual(['public', 'idemkey_records', 'plain'])
    expect(store.channel).toEqual(expect.stringContaining('idemkey'))
    expect(new PostgresStore({ pool: offline, notifications: false }).channel).toBeNull()
  })

  it('refuses rotatePartitions() on the plain layout, pointing at purgeExpired', async () => {
    const error = await thrown(() => new PostgresStore({ pool: offline, table: 'plain_t' }).rotatePartitions())
    expect(error.code).toBe('INVALID_OPTION')
    expect(error.message).toContain(`table "public"."plain_t" is plain (use purgeExpired)`)
  })

  it('refuses a list limit that is not a non-negative integer before reaching the server', async () => {
    const store = new PostgresStore({ pool: offline })
    for (const limit of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      const error = await thrown(() => store.list({ limit }))
      expect(error.code).toBe('INVALID_ARGUMENT')
      expect(error.message).toBe(`list limit must be a non-negative integer, got ${String(limit)}.`)
    }
  })
})

describe('PostgreSQL driver errors, typed', () => {
  const driver = (code: string, message = 'server said no') => Object.assign(new Error(message), { code })

  it('answers STORE_SCHEMA naming migrate() and the table for each state that means a missing or foreign table', () => {
    for (const state of ['42P01', '42703', '3F000', '42883', '42804']) {
      const cause = driver(state)
      const error = toStoreError('acquire', cause, 'app', 'records')
      expect(error.code, state).toBe('STORE_SCHEMA')
      expect(error.message, state).toBe(
        'postgres: acquire failed: server said no. The table "app"."records" is missing or has another shape: create it with `await store.migrate()` or `idemkey migrate --store postgres://…` (or choose another table with the `table` option).',
      )
      expect(error.cause).toBe(cause)
    }
    expect(toStoreError('get', driver('42P01')).message).toContain('The table the idemkey table is missing')
    expect(toStoreError('get', driver('42P01'), undefined, 't').message).toContain('The table "public"."t" is missing')
  })

  it('names the likely layout mix-up for an ON CONFLICT with no matching unique index (42P10)', () => {
    const error = toStoreError('acquire', driver('42P10'), 'app', 'records')
    expect(error.code).toBe('STORE_SCHEMA')
    expect(error.message).toBe(
      'postgres: acquire failed: server said no. The table "app"."records" has no unique index on (scope, key) alone: it is likely in time partitions, and this store was made for the plain layout. Give the store layout: \'partitioned\' (?layout=partitioned in a store URL), or convert the table with `idemkey migrate --store … --layout plain`.',
    )
  })

  it('says which GRANT to run for a missing privilege, what to check for a login, and that a database is missing', () => {
    const privilege = toStoreError('complete', driver('42501'), 'public', 't')
    expect(privilege.code).toBe('STORE_UNAVAILABLE')
    expect(privilege.message).toContain('GRANT SELECT, INSERT, UPDATE, DELETE ON "public"."t" TO <app user>')
    for (const state of ['28P01', '28000']) {
      expect(toStoreError('get', driver(state)).message, state).toContain('Check the user and password in the connection string')
    }
    expect(toStoreError('get', driver('3D000')).message).toContain('The database does not exist')
  })

  it('says a serialization failure or deadlock was rolled back and may run again, and recognises it through any cause chain', () => {
    for (const state of ['40001', '40P01']) {
      const error = toStoreError('commit', driver(state))
      expect(error.code).toBe('STORE_UNAVAILABLE')
      expect(error.message).toContain('it is safe to run it again')
      expect(isTransientTransactionError(driver(state))).toBe(true)
      expect(isTransientTransactionError(new Error('orm', { cause: new Error('wrapper', { cause: driver(state) }) }))).toBe(true)
      expect(isTransientTransactionError(error)).toBe(true)
    }
    expect(isTransientTransactionError(driver('P2034'))).toBe(true)
    for (const other of [driver('23505'), driver('40000'), new Error('plain'), null, undefined, 'text', { code: 40001 }]) {
      expect(isTransientTransactionError(other), String((other as { code?: unknown } | null)?.code)).toBe(false)
    }
  })

  it('types a thrown null or string as STORE_UNAVAILABLE, never a TypeError', () => {
    for (const odd of [null, undefined, 'boom']) {
      const error = toStoreError('get', odd)
      expect(error.code).toBe('STORE_UNAVAILABLE')
      expect(error.message).toContain(`postgres: get failed: ${String(odd)}.`)
    }
  })

  it('passes an IdempotencyError through, and answers anything else STORE_UNAVAILABLE with the error as cause', () => {
    const own = new IdempotencyError('STORE_SCHEMA', 'already typed')
    expect(toStoreError('get', own)).toBe(own)
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' })
    const error = toStoreError('renew', refused)
    expect(error.code).toBe('STORE_UNAVAILABLE')
    expect(error.cause).toBe(refused)
    expect(error.message).toContain('renew')
  })
})

describe.skipIf(skip !== undefined)('PostgresStore statements and answers against PostgreSQL', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 4 })
  const tables: string[] = []
  let n = 0
  const table = () => {
    const name = `rules_${suffix}_${++n}`
    tables.push(name)
    return name
  }
  afterAll(async () => {
    for (const name of tables) await pool.query(`DROP TABLE IF EXISTS "${name}"`)
    await pool.end()
  })

  it('names its statements (prepared) on the plain layout, and bounds each by queryTimeout', async () => {
    const spy = spyPool(pool)
    const store = new PostgresStore({ pool: spy.pool, table: table(), groupCommit: false, queryTimeout: '7s' })
    await store.migrate()
    spy.sent.length = 0
    const got = (await store.acquire('s', 'k', fp('a'), LEASE)) as { token: number }
    await store.renew('s', 'k', got.token, LEASE)
    await store.complete('s', 'k', got.token, outcome(), 60_000)
    await store.get('s', 'k')
    expect(spy.sent.length).toBe(4)
    for (const config of spy.sent) {
      expect(config.name, config.text).toMatch(/^idemkey_/)
      expect(config.query_timeout).toBe(7_000)
    }
    await store.close()
  })

  it('sends its statements unnamed with preparedStatements: false, and on the partitioned layout whatever the option says', async () => {
    for (const options of [{ preparedStatements: false }, { layout: 'partitioned' as const, preparedStatements: true }]) {
      const spy = spyPool(pool)
      const store = new PostgresStore({ pool: spy.pool, table: table(), groupCommit: false, ...options })
      await store.migrate()
      spy.sent.length = 0
      const got = (await store.acquire('s', 'k', fp('a'), LEASE)) as { token: number }
      await store.complete('s', 'k', got.token, outcome(), 60_000)
      expect(spy.sent.filter((config) => config.values !== undefined).length).toBeGreaterThanOrEqual(2)
      for (const config of spy.sent) expect(config.name, `${JSON.stringify(options)}: ${config.text}`).toBeUndefined()
      await store.close()
    }
  })

  it('answers STORE_SCHEMA when an acquire comes back with no row', async () => {
    const spy = spyPool(pool)
    const store = new PostgresStore({ pool: spy.pool, table: table(), groupCommit: false })
    await store.migrate()
    spy.answerWith((config) => (config.text.includes('INSERT') ? { rows: [], rowCount: 0 } : undefined))
    const error = await thrown(() => store.acquire('s', 'k', fp('a'), LEASE))
    expect(error.code).toBe('STORE_SCHEMA')
    expect(error.message).toBe('postgres: acquire returned no row; is the table an idemkey table?')
    await store.close()
  })

  it('gives up an acquire after exactly 100 rounds that found neither a token nor a live record', async () => {
    const spy = spyPool(pool)
    const store = new PostgresStore({ pool: spy.pool, table: table(), groupCommit: false })
    await store.migrate()
    const empty = { taken: null, status: null, fingerprint: null }
    spy.answerWith((config) => (config.text.includes('INSERT') ? { rows: [empty], rowCount: 1 } : undefined))
    spy.sent.length = 0
    const error = await thrown(() => store.acquire('s', 'k', fp('a'), LEASE))
    expect(error.code).toBe('STORE_UNAVAILABLE')
    expect(error.message).toBe('postgres: acquire of "k" lost 100 races in a row to writers that kept changing it. Retry later.')
    expect(spy.sent.length).toBe(100)
    await store.close()
  })

  describe('the partitioned acquire, one caller at a time (groupCommit: false)', () => {
    const isPeek = (text: string) => text.includes('NULL::bigint AS taken')
    const isAcquire = (text: string, on: SentOn) => on === 'client' && text.includes('INSERT INTO')

    it('acquires and replays; a replay is answered by the lock-free read alone, with no transaction', async () => {
      const spy = spyPool(pool)
      const store = new PostgresStore({ pool: spy.pool, table: table(), layout: 'partitioned', groupCommit: false })
      await store.migrate()
      const got = (await store.acquire('s', 'k', fp('a'), LEASE)) as { token: number }
      expect(got).toEqual({ kind: 'acquired', token: 1 })
      await store.complete('s', 'k', got.token, outcome('first'), 60_000)
      spy.sent.length = 0
      const again = await store.acquire('s', 'k', fp('a'), LEASE)
      expect(again.kind).toBe('replay')
      expect(spy.sent.map((c) => [c.on, isPeek(c.text)])).toEqual([['pool', true]])
      await store.close()
    })

    it('answers STORE_SCHEMA when the locked acquire returns no row', async () => {
      const spy = spyPool(pool)
      const store = new PostgresStore({ pool: spy.pool, table: table(), layout: 'partitioned', groupCommit: false })
      await store.migrate()
      spy.answerWith((config, on) => (isAcquire(config.text, on) ? { rows: [], rowCount: 0 } : undefined))
      const error = await thrown(() => store.acquire('s', 'k', fp('a'), LEASE))
      expect(error.code).toBe('STORE_SCHEMA')
      await store.close()
    })

    it('gives up after exactly 100 rounds that found neither a token nor a live record', async () => {
      const spy = spyPool(pool)
      const store = new PostgresStore({ pool: spy.pool, table: table(), layout: 'partitioned', groupCommit: false })
      await store.migrate()
      const empty = { n: 1, taken: null, status: null, fingerprint: null }
      spy.answerWith((config, on) => (isAcquire(config.text, on) ? { rows: [empty], rowCount: 1 } : undefined))
      spy.sent.length = 0
      const error = await thrown(() => store.acquire('s', 'k', fp('a'), LEASE))
      expect(error.message).toBe('postgres: acquire of "k" lost 100 races in a row to writers that kept changing it. Retry later.')
      expect(spy.sent.filter((c) => isPeek(c.text)).length).toBe(100)
      await store.close()
    })

    it('creates the missing partitions and runs again when an insert found none, up to three times; other check failures are not retried', async () => {
      for (const [message, sends] of [
        ['no partition of relation "t" found for row', 4],
        ['new row for relation "t" violates check constraint "c"', 1],
      ] as const) {
        const spy = spyPool(pool)
        const store = new PostgresStore({ pool: spy.pool, table: table(), layout: 'partitioned', groupCommit: false })
        await store.migrate()
        const cause = Object.assign(new Error(message), { code: '23514' })
        spy.failWith((text, on) => (isAcquire(text, on) ? cause : undefined))
        spy.sent.length = 0
        const error = await thrown(() => store.acquire('s', 'k', fp('a'), LEASE))
        expect(error.code, message).toBe('STORE_UNAVAILABLE')
        expect(error.cause, message).toBe(cause)
        expect(spy.sent.filter((c) => isAcquire(c.text, c.on)).length, message).toBe(sends)
        await store.close()
      }
    })
  })

  it('batches what concurrent callers send by default (group commit), and sends one statement each with groupCommit: false', async () => {
    for (const [groupCommit, most] of [
      [undefined, 2],
      [false, 5],
    ] as const) {
      const spy = spyPool(pool)
      const store = new PostgresStore({ pool: spy.pool, table: table(), groupCommit })
      await store.migrate()
      spy.sent.length = 0
      await Promise.all(['a', 'b', 'c', 'd', 'e'].map((key) => store.get('s', key)))
      expect(spy.sent.length, `groupCommit ${groupCommit}`).toBeLessThanOrEqual(most)
      expect(spy.sent.length, `groupCommit ${groupCommit}`).toBeGreaterThanOrEqual(groupCommit === false ? 5 : 1)
      await store.close()
    }
  })

  it('notifies the watchers of every key a batch completes or releases, not only of a lone caller', async () => {
    const name = table()
    const writer = new PostgresStore({ pool, table: name })
    const watcher = new PostgresStore({ pool, table: name })
    await writer.migrate()
    for (const [end, label] of [
      [(key: string, token: number) => writer.complete('s', key, token, outcome(key), 60_000), 'complete'],
      [(key: string, token: number) => writer.release('s', key, token), 'release'],
    ] as const) {
      const keys = ['k1', 'k2', 'k3', 'k4'].map((k) => `${label}-${k}`)
      const tokens = await Promise.all(
        keys.map(async (key) => ((await writer.acquire('s', key, fp(key), LEASE)) as { token: number }).token),
      )
      const woken = new Set<string>()
      const stops = keys.map((key) => watcher.watch?.('s', key, () => woken.add(key)))
      await eventually(() => watcher.listening(), 'the LISTEN connection up')
      // Each record flagged as watched before it ends (the watch arms it).
      await eventually(
        async () =>
          (await pool.query(`SELECT count(*)::int AS n FROM "${name}" WHERE waiters AND "key" = ANY($1)`, [keys])).rows[0].n ===
          keys.length,
        'records flagged as watched',
      )
      expect((await Promise.all(keys.map((key, i) => end(key, tokens[i] as number)))).every(Boolean)).toBe(true)
      await eventually(() => woken.size === keys.length, `${label}: every watcher woken (${[...woken].join(', ')})`, 5_000)
      for (const stop of stops) stop?.()
    }
    await watcher.close()
    await writer.close()
  })

  it('wakes a watcher at once when its record is done or absent, and one of a record in progress only when it ends', async () => {
    const name = table()
    const flagWaiter = statements('public', name).flagWaiter.text
    /** Resolves, by key, once the watch's flag statement has answered the store. */
    const armed = new Map<string, () => void>()
    const tapped = tapPool(pool, {
      async through(config, _on, run) {
        const result = await run(config)
        if (config.text === flagWaiter) armed.get(String(config.values?.[1]))?.()
        return result
      },
    })
    const store = new PostgresStore({ pool: tapped, table: name })
    await store.migrate()
    const done = (await store.acquire('s', 'done', fp('d'), LEASE)) as { token: number }
    await store.complete('s', 'done', done.token, outcome(), 60_000)
    const running = (await store.acquire('s', 'running', fp('r'), LEASE)) as { token: number }
    try {
      // The LISTEN connection up first: when it comes up it wakes every watcher to look again.
      const first = store.watch?.('s', 'first', () => {})
      await eventually(() => store.listening(), 'the LISTEN connection up')
      const woken = new Set<string>()
      const flagged = new Promise<void>((resolve) => armed.set('running', resolve))
      const stops = ['done', 'absent', 'running'].map((key) => store.watch?.('s', key, () => woken.add(key)))
      await eventually(() => woken.has('done') && woken.has('absent'), 'the watchers of a done and an absent record woken at once')
      await flagged
      await pause(20)
      expect(woken.has('running')).toBe(false)
      await store.complete('s', 'running', running.token, outcome(), 60_000)
      await eventually(() => woken.has('running'), 'the watcher of the running record woken when it ends')
      for (const stop of [first, ...stops]) stop?.()
    } finally {
      await store.close()
    }
  })

  it('plans every statement when it runs on the pool it opens (plan_cache_mode force_custom_plan)', async () => {
    const store = new PostgresStore({ connectionString: URL, table: table(), max: 1 })
    const mode = await store.transaction(
      async (tx) => ((await (tx as PgClientLike).query('SHOW plan_cache_mode')).rows[0] as { plan_cache_mode: string }).plan_cache_mode,
    )
    expect(mode).toBe('force_custom_plan')
    await store.close()
  })

  describe('migrate and convertLayout', () => {
    it('creates a missing table in the store layout when asked to convert it, with nothing to copy', async () => {
      const name = table()
      const store = new PostgresStore({ pool, table: name, layout: 'partitioned', partitionInterval: '1h' })
      expect(await store.convertLayout()).toEqual({ from: 'partitioned', to: 'partitioned', records: 0 })
      expect((await pool.query('SELECT relkind FROM pg_class WHERE relname = $1', [name])).rows[0].relkind).toBe('p')
      await store.close()
    })

    it('converts to partitions: one for each interval the old records were made in, the one of now and the ones ahead, and records the layout in the comment', async () => {
      const name = table()
      const hour = 3_600_000
      const plain = new PostgresStore({ pool, table: name })
      await plain.migrate()
      const scope = `convert-${randomUUID()}`
      for (const key of ['old', 'new']) {
        const { token } = (await plain.acquire(scope, key, fp(key), LEASE)) as { token: number }
        await plain.complete(scope, key, token, outcome(key), 24 * hour)
      }
      await pool.query(`UPDATE "${name}" SET created_at = created_at - $1::bigint WHERE scope = $2 AND "key" = 'old'`, [5 * hour, scope])
      const parted = new PostgresStore({ pool, table: name, layout: 'partitioned', partitionInterval: '1h' })
      expect(await parted.convertLayout()).toEqual({ from: 'plain', to: 'partitioned', records: 2 })
      const now = slotOf(await serverNow(pool), hour)
      const starts = (await listPartitions(pool, 'public', name)).map((p) => p.fromMs).sort((a, b) => a - b)
      expect(starts).toEqual([now - 5 * hour, ...Array.from({ length: PARTITIONS_AHEAD + 1 }, (_, i) => now + i * hour)])
      const comment = (await pool.query(`SELECT obj_description('"${name}"'::regclass, 'pg_class') AS c`)).rows[0].c
      expect(comment).toBe(layoutComment(SCHEMA_VERSION, 'partitioned', hour))
      expect((await parted.acquire(scope, 'old', fp('old'), LEASE)).kind).toBe('replay')
      await parted.close()
      await plain.close()
    })

    it('refuses partitions of no length when the store is made, before a table could be created or converted with them', () => {
      for (const partitionInterval of [0, '0s'] as const) {
        expect(() => new PostgresStore({ pool, table: table(), layout: 'partitioned', partitionInterval })).toThrow(
          expect.objectContaining({
            code: 'INVALID_OPTION',
            message: `PostgresStore partitionInterval must be longer than 0 with layout 'partitioned' (e.g. '1d'), got ${JSON.stringify(partitionInterval)}.`,
          }),
        )
      }
    })

    it('refuses a table of the other layout at migrate, saying how to convert it', async () => {
      const name = table()
      await new PostgresStore({ pool, table: name, layout: 'partitioned', partitionInterval: '1h' }).migrate()
      const error = await thrown(() => new PostgresStore({ pool, table: name }).migrate())
      expect(error.code).toBe('STORE_SCHEMA')
      expect(error.message).toContain(
        `postgres: table "public"."${name}" has the partitioned layout, and the store was given layout 'plain'. Convert it with \`idemkey migrate --store … --layout plain\``,
      )
    })

    it('says the layout is the likely cause when a store made plain writes to a partitioned table', async () => {
      const name = table()
      const parted = new PostgresStore({ pool, table: name, layout: 'partitioned', partitionInterval: '1h' })
      await parted.migrate()
      await parted.rotatePartitions()
      const error = await thrown(() => new PostgresStore({ pool, table: name }).acquire('s', 'k', 'a'.repeat(64), 1_000))
      expect(error.code).toBe('STORE_SCHEMA')
      expect(error.message).toMatch(
        /it is likely in time partitions, and this store was made for the plain layout\. Give the store layout: 'partitioned'/,
      )
    })

    it('upgrades an up-to-date table as an app user with row grants only: no COMMENT, no CREATE SCHEMA, which need more', async () => {
      const name = table()
      await new PostgresStore({ pool, table: name }).migrate()
      const role = `rules_app_${suffix}`
      await pool.query(`CREATE ROLE "${role}" LOGIN`)
      await pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON "${name}" TO "${role}"`)
      const app = new pg.Pool({ connectionString: `postgres://${role}@127.0.0.1:5432/test`, max: 1 })
      try {
        // What it may not do, so that the migrate below shows it did not try.
        expect(await thrown(() => app.query(`COMMENT ON TABLE "${name}" IS 'x'`))).toMatchObject({ code: '42501' })
        expect(await thrown(() => app.query('CREATE SCHEMA IF NOT EXISTS "public"'))).toMatchObject({ code: '42501' })
        const store = new PostgresStore({ pool: app, table: name })
        await store.migrate()
        expect((await store.acquire('s', 'k', fp('a'), LEASE)).kind).toBe('acquired')
      } finally {
        await app.end()
        await pool.query(`DROP OWNED BY "${role}"`)
        await pool.query(`DROP ROLE "${role}"`)
      }
    })

    it("makes a partitioned table with its interval in its comment, and upgrades an older one with that interval, not the store's", async () => {
      const name = table()
      const hour = 3_600_000
      const commentOf = async () => (await pool.query(`SELECT obj_description('"${name}"'::regclass, 'pg_class') AS c`)).rows[0].c
      await new PostgresStore({ pool, table: name, layout: 'partitioned', partitionInterval: '1h' }).migrate()
      // A new partitioned table is made at this version, its interval in its comment.
      expect(await commentOf()).toBe(layoutComment(SCHEMA_VERSION, 'partitioned', hour))
      await pool.query(`COMMENT ON TABLE "${name}" IS '${layoutComment(1, 'partitioned', hour)}'`)
      await new PostgresStore({ pool, table: name, layout: 'partitioned', partitionInterval: '1d' }).migrate()
      expect(await commentOf()).toBe(layoutComment(SCHEMA_VERSION, 'partitioned', hour))
    })

    it("gives migrate's connection back to the pool, and destroys it only when its ROLLBACK failed", async () => {
      const ok = spyPool(pool)
      await new PostgresStore({ pool: ok.pool, table: table() }).migrate()
      expect(ok.released).toEqual([false])
      for (const rollbackFails of [false, true]) {
        const spy = spyPool(pool)
        const cause = Object.assign(new Error('lock refused'), { code: '57P01' })
        spy.failWith((text) =>
          text.startsWith('SELECT pg_advisory_xact_lock') || (rollbackFails && text === 'ROLLBACK') ? cause : undefined,
        )
        const error = await thrown(() => new PostgresStore({ pool: spy.pool, table: table() }).migrate())
        expect(error.code).toBe('STORE_UNAVAILABLE')
        expect(error.message).toContain('postgres: migrate failed')
        expect(error.cause).toBe(cause)
        expect(spy.released, `rollback fails: ${rollbackFails}`).toEqual([rollbackFails])
      }
    })

    it('answers STORE_UNAVAILABLE naming migrate when no connection can be had', async () => {
      const error = await thrown(() => new PostgresStore({ pool: offline }).migrate())
      expect(error.code).toBe('STORE_UNAVAILABLE')
      expect(error.message).toContain('postgres: migrate failed')
    })

    it('creates the schema it is given when missing', async () => {
      const schema = `rules_schema_${suffix}`
      const store = new PostgresStore({ pool, schema, table: 'records' })
      try {
        await store.migrate()
        expect((await pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema])).rowCount).toBe(1)
        expect((await store.acquire('s', 'k', fp('a'), LEASE)).kind).toBe('acquired')
      } finally {
        await store.close()
        await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`)
      }
    })
  })

  it('renews a lone caller with true, and a stale token with false', async () => {
    const store = new PostgresStore({ pool, table: table() })
    await store.migrate()
    const { token } = (await store.acquire('s', 'k', fp('a'), LEASE)) as { token: number }
    expect(await store.renew('s', 'k', token, LEASE)).toBe(true)
    expect(await store.renew('s', 'k', token + 1, LEASE)).toBe(false)
    await store.close()
  })

  it('completes inside your transaction: rolled back with it, the record stays in progress', async () => {
    const store = new PostgresStore({ pool, table: table() })
    await store.migrate()
    const { token } = (await store.acquire('s', 'k', fp('a'), LEASE)) as { token: number }
    const stop = new Error('roll it back')
    const error = await thrown(() =>
      store.transaction(async (tx) => {
        expect(await store.completeInTransaction(tx, 's', 'k', token, outcome(), 60_000)).toBe(true)
        throw stop
      }),
    )
    expect(error).toBe(stop)
    expect((await store.get('s', 'k'))?.status).toBe('in_progress')
    await store.close()
  })

  it('lists by scope, status and creation time, expired records only when asked, oldest first, up to the limit', async () => {
    const store = new PostgresStore({ pool, table: table() })
    await store.migrate()
    const scope = `list-${randomUUID()}`
    for (const key of ['a', 'b', 'c']) {
      const { token } = (await store.acquire(scope, key, fp(key), LEASE)) as { token: number }
      if (key !== 'c') await store.complete(scope, key, token, outcome(key), key === 'a' ? 1 : 60_000)
    }
    await new Promise((resolve) => setTimeout(resolve, 20))
    const keys = async (filter: Parameters<PostgresStore['list']>[0]) => (await store.list(filter)).map((r) => r.key)
    expect(await keys({ scope })).toEqual(['b', 'c'])
    expect(await keys({ scope, includeExpired: true })).toEqual(['a', 'b', 'c'])
    expect(await keys({ scope, status: 'in_progress' })).toEqual(['c'])
    expect(await keys({ scope, status: 'completed', includeExpired: true })).toEqual(['a', 'b'])
    expect(await keys({ scope, includeExpired: true, limit: 2 })).toEqual(['a', 'b'])
    expect(await keys({ scope, limit: 0 })).toEqual([])
    const other = `list-${randomUUID()}`
    await store.acquire(other, 'z', fp('z'), LEASE)
    const everywhere = new Set((await store.list({ limit: 10_000 })).map((r) => r.scope))
    expect([everywhere.has(scope), everywhere.has(other)]).toEqual([true, true])
    const b = (await store.get(scope, 'b'))?.createdAtMs as number
    expect(await keys({ scope, includeExpired: true, createdBeforeMs: b })).toEqual(expect.arrayContaining(['a', 'b']))
    expect(await keys({ scope, includeExpired: true, createdBeforeMs: b - 10_000 })).toEqual([])
    await store.close()
  })

  it('purges at most the limit of expired records per call, and says how many', async () => {
    for (const layout of ['plain', 'partitioned'] as const) {
      const store = new PostgresStore({ pool, table: table(), layout })
      await store.migrate()
      const scope = `purge-${randomUUID()}`
      for (let i = 0; i < 5; i++) {
        const { token } = (await store.acquire(scope, `k${i}`, fp('a'), LEASE)) as { token: number }
        await store.complete(scope, `k${i}`, token, outcome(), i < 3 ? 1 : 60_000)
      }
      await new Promise((resolve) => setTimeout(resolve, 20))
      expect(await store.purgeExpired(2), layout).toBe(2)
      expect(await store.purgeExpired(10), layout).toBe(1)
      expect(await store.purgeExpired(10), layout).toBe(0)
      expect(
        (await store.list({ scope, includeExpired: true })).map((r) => r.key),
        layout,
      ).toEqual(['k3', 'k4'])
      await expect(store.purgeExpired(0)).rejects.toThrow(IdempotencyError)
      await store.close()
    }
  })

  it('evicts a record once: true when it was there, false after', async () => {
    const store = new PostgresStore({ pool, table: table() })
    await store.migrate()
    await store.acquire('s', 'k', fp('a'), LEASE)
    expect(await store.evict('s', 'k')).toBe(true)
    expect(await store.evict('s', 'k')).toBe(false)
    expect(await store.get('s', 'k')).toBeNull()
    await store.close()
  })

  it('begins its own transactions at the isolation level configured, and commits what the work wrote', async () => {
    for (const level of ['read committed', 'repeatable read', 'serializable'] as const) {
      const spy = spyPool(pool)
      const store = new PostgresStore({ pool: spy.pool, table: table(), isolationLevel: level })
      const seen = await store.transaction(async (tx) => {
        const { rows } = await (tx as PgClientLike).query('SHOW transaction_isolation')
        return (rows[0] as { transaction_isolation: string }).transaction_isolation
      })
      expect(seen).toBe(level)
      expect(spy.sent.filter((c) => c.on === 'client').map((c) => c.text)).toEqual([
        `BEGIN ISOLATION LEVEL ${level.toUpperCase()}`,
        'SHOW transaction_isolation',
        'COMMIT',
      ])
      expect(spy.released).toEqual([false])
      await store.close()
    }
  })

  it("rolls back and passes the work's own error through unchanged, the client back in the pool", async () => {
    const spy = spyPool(pool)
    const store = new PostgresStore({ pool: spy.pool, table: table() })
    const mine = new Error('the work failed')
    expect(await thrown(() => store.transaction(async () => Promise.reject(mine)))).toBe(mine)
    expect(spy.sent.map((c) => c.text).at(-1)).toBe('ROLLBACK')
    expect(spy.released).toEqual([false])
    await store.close()
  })

  it('answers STORE_UNAVAILABLE naming BEGIN or COMMIT when either fails, and destroys a client whose ROLLBACK failed', async () => {
    for (const failing of ['BEGIN', 'COMMIT']) {
      const spy = spyPool(pool)
      const store = new PostgresStore({ pool: spy.pool, table: table() })
      const cause = Object.assign(new Error(`${failing} refused`), { code: '57P01' })
      spy.failWith((text, on) => (on === 'client' && (text.startsWith(failing) || text === 'ROLLBACK') ? cause : undefined))
      const error = await thrown(() => store.transaction(async () => 'done'))
      expect(error.code, failing).toBe('STORE_UNAVAILABLE')
      expect(error.message, failing).toContain(`postgres: ${failing} failed`)
      expect(error.cause).toBe(cause)
      expect(spy.released, failing).toEqual([true])
      await store.close()
    }
  })

  it('answers STORE_UNAVAILABLE naming transaction when no connection can be had', async () => {
    const store = new PostgresStore({ pool: offline })
    const error = await thrown(() => store.transaction(async () => 'never'))
    expect(error.code).toBe('STORE_UNAVAILABLE')
    expect(error.message).toContain('transaction')
  })

  it('leaves a pool you passed open on close(), and ends the one it opened from a connection string', async () => {
    const yours = new PostgresStore({ pool, table: table() })
    await yours.migrate()
    await yours.close()
    expect((await pool.query('SELECT 1 AS one')).rows[0]).toEqual({ one: 1 })

    const own = new PostgresStore({ connectionString: URL, table: table(), max: 2 })
    await own.migrate()
    await own.close()
    const error = await thrown(() => own.get('s', 'k'))
    expect(error).toBeInstanceOf(IdempotencyError)
  })

  it('settles a second close(), at once or while the first still runs (the ledger closes its store, and so may you)', async () => {
    const own = new PostgresStore({ connectionString: URL, table: table(), max: 2 })
    await own.migrate()
    await Promise.all([own.close(), own.close()])
    await own.close()
  })

  describe('close() of its own pool with half-open connections (a TcpFaultProxy that stops forwarding)', () => {
    const QUERY_TIMEOUT_MS = 1_500

    async function proxied() {
      const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: 5432 })
      const store = new PostgresStore({
        connectionString: URL.replace(':5432/', `:${proxy.port}/`),
        table: table(),
        queryTimeout: QUERY_TIMEOUT_MS,
        notifications: false,
      })
      await store.migrate()
      return { proxy, store }
    }

    it('settles while a transaction waits on a half-open connection: the transaction fails and every socket is closed', async () => {
      const { proxy, store } = await proxied()
      try {
        // Your statements are not bounded by queryTimeout: only close() ends this wait.
        const { settled } = await hangMidTransaction(proxy, (body) => store.transaction((tx) => body(() => tx.query('SELECT 1'))))
        expect(proxy.localSockets()).toBeGreaterThan(0)
        await store.close()
        expect(await settled).toMatchObject({
          code: 'STORE_UNAVAILABLE',
          cause: {
            code: 'IDEMKEY_CLOSED_UNANSWERED',
            message: `the store was closed and this connection had no answer from the server within queryTimeout (${QUERY_TIMEOUT_MS} ms); it was dropped (half-open, or the server is stalled)`,
          },
        })
        await eventually(() => proxy.localSockets() === 0, "every one of the store's sockets closed", 5_000)
      } finally {
        await proxy.close()
      }
    }, 10_000)

    it('keeps the process up when the connection migrate() waits on is cut: migrate fails with STORE_UNAVAILABLE', async () => {
      const { proxy, store } = await proxied()
      try {
        proxy.blackhole()
        const migrating = thrown(() => store.migrate())
        await proxy.held() // its BEGIN sent, unanswered
        // A lost connection makes node-postgres emit 'error' on the client: with no listener, the process would crash.
        expect(proxy.cut()).toBeGreaterThan(0)
        const error = await migrating
        expect(error.code).toBe('STORE_UNAVAILABLE')
        expect(error.message).toContain('migrate')
      } finally {
        await store.close()
        await proxy.close()
      }
    }, 10_000)

    it('closes the socket of an idle connection whose server never answers its goodbye', async () => {
      const { proxy, store } = await proxied()
      try {
        expect(await store.get('s', 'k')).toBeNull()
        proxy.blackhole()
        await store.close()
        await eventually(() => proxy.localSockets() === 0, "every one of the store's sockets closed", 5_000)
      } finally {
        await proxy.close()
      }
    }, 10_000)
  })
})
