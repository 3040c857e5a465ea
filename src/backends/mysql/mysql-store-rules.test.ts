/**
 * MySqlStore's rules, one by one: option checks and their messages, how driver errors are typed,
 * row decoding, list/purge bounds and order, group commit batches (stale callers, drift, rows that
 * change between a batch's statements), migrate's failures, and the queryTimeout machinery against
 * half-open connections (a TcpFaultProxy between the store and MariaDB).
 */
import { randomBytes } from 'node:crypto'
import mysql from 'mysql2/promise'
import { eventually } from '../../../test/helpers/eventually.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { hangMidTransaction, TcpFaultProxy } from '../../../test/helpers/tcp-fault-proxy.js'
import type { SqlTransactions } from '../../core/sql-transactions.js'
import type { Outcome } from '../../core/store.js'
import { IdempotencyError } from '../../errors.js'
import { fp } from '../../testing/index.js'
import { batchStatements } from './batch-statements.js'
import { fitsBatch, lostRaces, MAX_BATCHED_BYTES } from './batches.js'
import { StatementTimeoutError } from './bounded.js'
import { isRetryable, isTransientTransactionError, toStoreError } from './mysql-errors.js'
import { MySqlStore } from './mysql-store.js'
import type { MySqlStoreOptions } from './options.js'
import type { MySqlConnectionLike, MySqlPoolLike, MySqlValue } from './pool.js'
import { completeValues, identity, liveAnswer, type Row, toRecord } from './records.js'
import { bind, compile, statements } from './statements.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const RETENTION_MS = 24 * 3_600_000
const skip = await serviceSkipReason('MariaDB', 3306)
if (skip) console.warn(`\n!!! SKIPPED: MySqlStore rules against MariaDB: ${skip}\n`)

type Result = [unknown, unknown]
type Run = () => Promise<Result>

/** A pool that needs no server: every statement fails (for checks that never reach one). */
const offline: MySqlPoolLike = {
  query: () => Promise.reject(new Error('offline')),
  execute: () => Promise.reject(new Error('offline')),
  getConnection: () => Promise.reject(new Error('offline')),
}

/**
 * A pool that logs the statements the store sends (on the pool and on its connections) and runs
 * scripted actions on chosen ones: fail it, run another writer first, or change what it answers.
 */
function scriptedPool(pool: MySqlPoolLike) {
  const sent: string[] = []
  const scripts: Array<{ match: (sql: string) => boolean; act: (go: Run) => Promise<Result>; times: number }> = []
  let failConnection: unknown
  const through =
    (run: (sql: string, values?: MySqlValue[]) => Promise<Result>) =>
    async (sql: string, values?: MySqlValue[]): Promise<Result> => {
      sent.push(sql)
      const i = scripts.findIndex((script) => script.match(sql))
      const script = scripts[i]
      if (script === undefined) return run(sql, values)
      if (--script.times === 0) scripts.splice(i, 1)
      return script.act(() => run(sql, values))
    }
  const wrapped: MySqlPoolLike = {
    query: through((sql, values) => pool.query(sql, values)),
    execute: through((sql, values) => pool.execute(sql, values)),
    async getConnection(): Promise<MySqlConnectionLike> {
      if (failConnection !== undefined) throw failConnection
      const connection = await pool.getConnection()
      return {
        query: through((sql, values) => connection.query(sql, values)),
        execute: through((sql, values) => connection.execute(sql, values)),
        release: () => connection.release(),
      }
    },
  }
  const on = (sql: string | RegExp, act: (go: Run) => Promise<Result>, times = 1) => {
    const match = typeof sql === 'string' ? (text: string) => text === sql : (text: string) => sql.test(text)
    scripts.push({ match, act, times })
  }
  return {
    pool: wrapped,
    sent,
    count: (sql: string) => sent.filter((text) => text === sql).length,
    fail: (sql: string | RegExp, error: unknown) =>
      on(sql, async () => {
        throw error
      }),
    before: (sql: string | RegExp, fn: () => Promise<unknown>, times = 1) =>
      on(
        sql,
        async (go) => {
          await fn()
          return go()
        },
        times,
      ),
    answer: (sql: string | RegExp, change: (result: Result) => Result) => on(sql, async (go) => change(await go())),
    failConnections: (error: unknown) => {
      failConnection = error
    },
  }
}

const outcome = (body: string, status = 201): Outcome => ({
  status: 'completed',
  response: { status, headers: { 'content-type': 'text/plain', 'x-body': body }, body: Buffer.from(body) },
  resourceId: `res-${body}`,
})

const row = (fields: Partial<Row>): Row => ({
  scope: Buffer.from('s'),
  key: Buffer.from('k'),
  fingerprint: fp('a'),
  status: 'in_progress',
  token: 1,
  locked_until: 5_000,
  response_status: null,
  response_headers: null,
  response_body: null,
  resource_id: null,
  attempts: 1,
  created_at: 1_000,
  updated_at: 1_000,
  expires_at: 90_000,
  now_ms: 2_000,
  ...fields,
})

describe('MySqlStore options and input checks', () => {
  it('defaults its table to idemkey_records, and names itself mysql with the server clock', () => {
    const store = new MySqlStore({ pool: offline })
    expect(store.table).toBe('idemkey_records')
    expect(store.name).toBe('mysql')
    expect(store.serverClock).toBe(true)
  })

  it('refuses missing options, a bad table and both or neither of pool and uri, with messages saying what to give', () => {
    const neither =
      'MySqlStore needs exactly one of { pool } (a mysql2/promise pool) or { uri } (mysql://user:password@host:port/database).'
    expect(() => new MySqlStore(undefined as unknown as { pool: MySqlPoolLike })).toThrow(neither)
    expect(() => new MySqlStore({})).toThrow(neither)
    expect(() => new MySqlStore({ pool: offline, table: 'a-b' })).toThrow(
      'MySqlStore table "a-b" must be a plain SQL identifier (letters, digits, underscore).',
    )
  })

  it('refuses a queryTimeout past 24.8 days, which the timer would cut to 1 ms, and takes 0 (no bound)', () => {
    expect(() => new MySqlStore({ pool: offline, queryTimeout: '30d' })).toThrow(
      /^queryTimeout "30d" is longer than 24\.8 days \(2147483647 ms\), the longest delay a Node timer keeps/,
    )
    expect(new MySqlStore({ pool: offline, queryTimeout: 0 }).table).toBe('idemkey_records')
  })

  it('refuses lockRetries that are negative or not integers, and takes 0', () => {
    for (const lockRetries of [-1, 1.5, Number.NaN]) {
      expect(() => new MySqlStore({ pool: offline, lockRetries })).toThrow(
        new IdempotencyError('INVALID_OPTION', `MySqlStore lockRetries must be a non-negative integer, got ${String(lockRetries)}.`),
      )
    }
    expect(new MySqlStore({ pool: offline, lockRetries: 0 }).table).toBe('idemkey_records')
  })

  it('names the duration option it refuses', () => {
    expect(() => new MySqlStore({ pool: offline, abandonedRetention: -1 })).toThrow(/^abandonedRetention must/)
    expect(() => new MySqlStore({ pool: offline, queryTimeout: -1 })).toThrow(/^queryTimeout must/)
    expect(() => new MySqlStore({ uri: URI, connectionTimeout: -1 })).toThrow(/^connectionTimeout must/)
  })

  it('refuses a transactions option that is no adapter, or one of another dialect', () => {
    const bad = { tool: 'x' } as unknown as SqlTransactions<unknown>
    expect(() => new MySqlStore({ pool: offline, transactions: bad })).toThrow(/^MySqlStore transactions must come from an adapter/)
    const postgres = { tool: 'pgtool', dialect: 'postgres', transaction: async () => 1, execute: async () => ({ count: 1 }) }
    expect(() => new MySqlStore({ pool: offline, transactions: postgres as unknown as SqlTransactions<unknown> })).toThrow(
      'MySqlStore transactions are for postgres (pgtool), but this store is mysql',
    )
  })

  it('names the argument it refuses: leaseMs, ttlMs, limit and the list limit', async () => {
    const store = new MySqlStore({ pool: offline })
    await expect(store.acquire('s', 'k', fp('a'), 0)).rejects.toThrow('leaseMs must be a positive integer, got 0.')
    await expect(store.renew('s', 'k', 1, 0)).rejects.toThrow('leaseMs must be a positive integer, got 0.')
    await expect(store.complete('s', 'k', 1, outcome('x'), 0)).rejects.toThrow('ttlMs must be a positive integer, got 0.')
    await expect(store.purgeExpired(1.5)).rejects.toThrow('limit must be a positive integer, got 1.5.')
    await expect(store.list({ limit: -1 })).rejects.toThrow('list limit must be a non-negative integer, got -1.')
    // A limit of 0 asks nothing of the server (the offline pool would fail).
    expect(await store.list({ limit: 0 })).toEqual([])
  })
})

describe('MySqlStore driver errors', () => {
  it('takes deadlocks and lock wait timeouts as retryable, anywhere in a cause chain, and Prisma P2034 as transient', () => {
    expect(isRetryable(null)).toBe(false)
    expect(isRetryable({ errno: 1213 })).toBe(true)
    expect(isTransientTransactionError(new IdempotencyError('STORE_UNAVAILABLE', 'x', { cause: { errno: 1205 } }))).toBe(true)
    expect(isTransientTransactionError({ code: 'P2034' })).toBe(true)
    expect(isTransientTransactionError({ code: 'P2035' })).toBe(false)
    expect(isTransientTransactionError(new Error('x'))).toBe(false)
  })

  it('types a missing table or column as STORE_SCHEMA saying how to create it, with the driver error as cause', () => {
    const missing = Object.assign(new Error("Table 'test.t' doesn't exist"), { errno: 1146 })
    expect(toStoreError('get', missing, 't')).toMatchObject({
      code: 'STORE_SCHEMA',
      message:
        "mysql: get failed: Table 'test.t' doesn't exist. The table t is missing or has another shape: create it with `await store.migrate()` or `idemkey migrate --store mysql://…`.",
      cause: missing,
    })
    const column = { errno: 1054, message: "Unknown column 'steps'" }
    expect(toStoreError('list', column)).toMatchObject({
      code: 'STORE_SCHEMA',
      message:
        "mysql: list failed: Unknown column 'steps'. The table is missing or has another shape: create it with `await store.migrate()` or `idemkey migrate --store mysql://…`.",
    })
  })

  it('types access errors as STORE_UNAVAILABLE saying to check the credentials, by errno or by SQLSTATE 28000 alone', () => {
    const check =
      'Check the user, password and database in the connection settings, and that the user may read and write the idemkey table.'
    const denied = Object.assign(new Error('Access denied'), { errno: 1045 })
    expect(toStoreError('acquire', denied)).toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: `mysql: acquire failed: Access denied. ${check}`,
      cause: denied,
    })
    expect(toStoreError('acquire', { sqlState: '28000', message: 'who?' }).message).toBe(`mysql: acquire failed: who?. ${check}`)
    for (const other of [Object.assign(new Error('Duplicate entry'), { errno: 1062, sqlState: '23000' }), new Error('socket hang up')]) {
      expect(toStoreError('acquire', other)).toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: `mysql: acquire failed: ${other.message}. Check that the store is running and reachable; the operation was not recorded, so it is safe to retry.`,
      })
    }
    expect(toStoreError('get', null)).toMatchObject({ code: 'STORE_UNAVAILABLE', cause: null })
  })

  it('passes an IdempotencyError through as it is', () => {
    const typed = new IdempotencyError('STORE_UNAVAILABLE', 'already typed')
    expect(toStoreError('get', typed)).toBe(typed)
  })

  it('says which key lost 100 races, as its latin1 text', () => {
    const message = 'mysql: acquire of "caf\u00e9" lost 100 races in a row to writers that kept releasing or evicting it. Retry later.'
    expect(lostRaces(Buffer.from('caf\u00e9', 'latin1'))).toMatchObject({ code: 'STORE_UNAVAILABLE', message })
    expect(lostRaces('caf\u00e9').message).toBe(message)
  })
})

describe('MySqlStore rows and statements', () => {
  it('takes a record whose expiry or lease ends exactly now, and not a millisecond before', () => {
    const completed = row({ status: 'completed', locked_until: null, response_status: 200, expires_at: 2_000 })
    expect(liveAnswer(completed, fp('a'))).toBeUndefined()
    expect(liveAnswer({ ...completed, expires_at: 2_001 }, fp('a'))?.kind).toBe('replay')
    expect(liveAnswer(row({ locked_until: 2_000 }), fp('a'))).toBeUndefined()
    expect(liveAnswer(row({ locked_until: 2_001 }), fp('a'))).toEqual({ kind: 'in_progress', lockedUntilMs: 2_001 })
  })

  it('lets another request take an ended attempt only when it left no steps, read from has_steps or from steps', () => {
    const ended = row({ locked_until: 1_500 })
    const other = fp('b')
    expect(liveAnswer({ ...ended, has_steps: 1 }, other)).toEqual({ kind: 'mismatch' })
    expect(liveAnswer({ ...ended, has_steps: 0 }, other)).toBeUndefined()
    expect(liveAnswer({ ...ended, steps: '{"a":{}}' }, other)).toEqual({ kind: 'mismatch' })
    expect(liveAnswer({ ...ended, steps: null }, other)).toBeUndefined()
    expect(liveAnswer({ ...ended, steps: '{}' }, other)).toBeUndefined()
    expect(liveAnswer({ ...ended, steps: '{"a":{}}' }, fp('a'))).toBeUndefined()
  })

  it('decodes a row: no lock for a stored record, the lock of an in-progress one (none when NULL)', () => {
    expect(toRecord(row({ status: 'completed', locked_until: 123, response_status: 200 })).lockedUntilMs).toBeNull()
    expect(toRecord(row({ locked_until: null })).lockedUntilMs).toBeNull()
    expect(toRecord(row({ locked_until: '7000' })).lockedUntilMs).toBe(7_000)
  })

  it('stores the scope as UTF-8 bytes and the key as latin1 bytes', () => {
    const { scope, key } = identity('Z\u00fcrich', 'caf\u00e9')
    expect(scope.equals(Buffer.from([0x5a, 0xc3, 0xbc, 0x72, 0x69, 0x63, 0x68]))).toBe(true)
    expect(key.equals(Buffer.from([0x63, 0x61, 0x66, 0xe9]))).toBe(true)
    expect(completeValues('s', 'k', 1, outcome('b'), 1_000).ttl).toBe(1_000)
  })

  it('binds named values in order and refuses a missing one', () => {
    const statement = compile('  SELECT :a,\n   :b  ')
    expect(statement).toEqual({ sql: 'SELECT ?, ?', names: ['a', 'b'] })
    expect(bind(statement, { a: 1, b: 'x' })).toEqual([1, 'x'])
    expect(() => bind(statement, { a: 1 })).toThrow('idemkey mysql: no value for :b')
  })

  it('sends statements squashed to single spaces, without leading or trailing blanks', () => {
    const single = statements('t', RETENTION_MS)
    const batch = batchStatements('t', RETENTION_MS)
    const texts = [
      ...Object.values(single).flatMap((statement) => (typeof statement === 'function' ? [statement(5).sql] : [statement.sql])),
      ...Object.values(batch).map((make) => make(3)),
    ]
    for (const text of texts) {
      expect(text).toBe(text.trim())
      expect(text).not.toMatch(/\s\s/)
    }
  })

  it('fits a fenced write into a batch up to MAX_BATCHED_BYTES of strings and buffers, not beyond', () => {
    const base = { scope: Buffer.from('s'), key: Buffer.from('k'), token: 1 }
    expect(fitsBatch({ ...base, response_headers: 'h'.repeat(MAX_BATCHED_BYTES - 2) })).toBe(true)
    expect(fitsBatch({ ...base, response_headers: 'h'.repeat(MAX_BATCHED_BYTES - 1) })).toBe(false)
    expect(fitsBatch({ ...base, response_body: Buffer.alloc(MAX_BATCHED_BYTES - 1) })).toBe(false)
  })
})

describe('MySqlStore with a data-layer tool', () => {
  const tool = (count: number, fail?: Error): SqlTransactions<string> => ({
    tool: 'faketool',
    dialect: 'mysql',
    transaction: (fn) => fn('tx'),
    execute: async () => {
      if (fail) throw fail
      return { count }
    },
  })

  it('answers completeInTransaction and recordStepInTransaction by the count the tool reports', async () => {
    const done = new MySqlStore({ pool: offline, transactions: tool(1) })
    expect(await done.transaction((tx) => done.completeInTransaction(tx, 's', 'k', 1, outcome('x'), 1_000))).toBe(true)
    expect(await done.recordStepInTransaction('tx', 's', 'k', 1, 'step', null)).toBe(true)
  })

  /** A pool whose reads answer `row` (the record as committed), for what the store reads after a write through the tool changed nothing. */
  const committed = (row: Record<string, unknown> | undefined): MySqlPoolLike => {
    const execute = async (): Promise<[unknown, unknown]> => [row ? [row] : [], []]
    return { ...offline, execute, getConnection: async () => ({ query: offline.query, execute, release: () => {} }) }
  }
  const ours = { status: 'in_progress', token: 1 }

  it('answers false when a write through the tool changed nothing because another holder has the record, or it is no longer in progress', async () => {
    for (const row of [{ ...ours, token: 2 }, { ...ours, status: 'completed' }, undefined]) {
      const fenced = new MySqlStore({ pool: committed(row), transactions: tool(0) })
      expect(await fenced.completeInTransaction('tx', 's', 'k', 1, outcome('x'), 1_000)).toBe(false)
      expect(await fenced.recordStepInTransaction('tx', 's', 'k', 1, 'step', null)).toBe(false)
    }
  })

  it("refuses to call the record fenced out when it is still this attempt's: the tool's transaction ended under the work (MariaDB)", async () => {
    const store = new MySqlStore({ pool: committed(ours), transactions: tool(0) })
    await expect(store.completeInTransaction('tx', 's', 'k', 1, outcome('x'), 1_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringMatching(
        /^mysql: completeInTransaction \(through faketool\): the transaction is no longer open on its connection/,
      ),
    })
    await expect(store.recordStepInTransaction('tx', 's', 'k', 1, 'step', null)).rejects.toThrow(/no longer open/)
  })

  it('types a failure inside the tool as the operation through the tool', async () => {
    const store = new MySqlStore({ pool: offline, transactions: tool(1, new Error('tool broke')) })
    await expect(store.completeInTransaction('tx', 's', 'k', 1, outcome('x'), 1_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringMatching(/^mysql: completeInTransaction \(through faketool\) failed: tool broke\. /),
    })
    await expect(store.recordStepInTransaction('tx', 's', 'k', 1, 'step', '1')).rejects.toThrow(
      /^mysql: recordStepInTransaction \(through faketool\) failed: tool broke\. /,
    )
  })

  it('types a failed UPDATE on a transaction connection as completeInTransaction', async () => {
    const store = new MySqlStore({ pool: offline })
    const tx: MySqlConnectionLike = { query: offline.query, execute: offline.execute, release: () => {} }
    await expect(store.completeInTransaction(tx, 's', 'k', 1, outcome('x'), 1_000)).rejects.toThrow(
      /^mysql: completeInTransaction failed: offline\. /,
    )
  })
})

describe.skipIf(skip !== undefined)('MySqlStore rules against MariaDB', () => {
  const raw = mysql.createPool({ uri: URI, connectionLimit: 6 }) as unknown as MySqlPoolLike & { end(): Promise<void> }
  const tables: string[] = []
  const newTable = () => {
    const name = `idemkey_rules_${process.pid}_${randomBytes(4).toString('hex')}`
    tables.push(name)
    return name
  }
  /** A migrated table, a store on it (through a scripted pool) and one for "another process" (on the pool directly). */
  async function rig(options: { groupCommit?: boolean } = {}) {
    const table = newTable()
    const other = new MySqlStore({ pool: raw, table })
    await other.migrate()
    const scripted = scriptedPool(raw)
    const store = new MySqlStore({ pool: scripted.pool, table, ...options })
    return { table, other, scripted, store, single: statements(table, RETENTION_MS), batch: batchStatements(table, RETENTION_MS) }
  }
  const refused = () => Object.assign(new Error('Connection lost: The server closed the connection.'), { code: 'PROTOCOL_CONNECTION_LOST' })

  afterAll(async () => {
    for (const table of tables) await raw.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
    await raw.end()
  })

  it('names each operation in the STORE_SCHEMA error of a missing table', async () => {
    const store = new MySqlStore({ pool: raw, table: newTable() })
    const cases: Array<[string, () => Promise<unknown>]> = [
      ['renew', () => store.renew('s', 'k', 1, 1_000)],
      ['complete', () => store.complete('s', 'k', 1, outcome('x'), 1_000)],
      ['release', () => store.release('s', 'k', 1)],
      ['get', () => store.get('s', 'k')],
      ['list', () => store.list()],
      ['purgeExpired', () => store.purgeExpired(10)],
      ['evict', () => store.evict('s', 'k')],
    ]
    for (const [operation, attempt] of cases) {
      await expect(attempt()).rejects.toMatchObject({
        code: 'STORE_SCHEMA',
        message: expect.stringMatching(new RegExp(`^mysql: ${operation} failed: Table .* doesn't exist\\.`)),
      })
    }
  })

  it('lists live records by creation time, with includeExpired, createdBeforeMs and limit, and purges only expired ones up to its limit', async () => {
    const { table, other } = await rig()
    for (const key of ['a', 'b', 'c']) await other.acquire('list', key, fp('a'), 60_000)
    await other.acquire('elsewhere', 'z', fp('a'), 60_000)
    const set = async (key: string, created: number, expires: string) =>
      raw.query(`UPDATE \`${table}\` SET created_at = ?, expires_at = ${expires} WHERE scope = 'list' AND \`key\` = ?`, [created, key])
    await set('c', 1_000, 'expires_at')
    await set('a', 2_000, '1')
    await set('b', 3_000, 'expires_at')
    const keys = async (filter: Parameters<MySqlStore['list']>[0]) => (await other.list(filter)).map((record) => record.key)
    expect(await keys({ scope: 'list' })).toEqual(['c', 'b'])
    expect(await keys({ scope: 'list', includeExpired: true })).toEqual(['c', 'a', 'b'])
    expect(await keys({ scope: 'list', includeExpired: true, createdBeforeMs: 2_000 })).toEqual(['c', 'a'])
    expect(await keys({ scope: 'list', includeExpired: true, limit: 2 })).toEqual(['c', 'a'])
    expect(await keys({ includeExpired: true })).toEqual(['c', 'a', 'b', 'z'])
    await set('b', 3_000, '2')
    expect(await other.purgeExpired(1)).toBe(1)
    expect(await keys({ includeExpired: true })).toEqual(['c', 'b', 'z'])
    expect(await other.purgeExpired(5)).toBe(1)
    expect(await other.evict('list', 'c')).toBe(true)
    expect(await other.evict('list', 'c')).toBe(false)
    expect(await keys({ includeExpired: true })).toEqual(['z'])
  })

  it('types an INSERT that fails for another reason than a duplicate key as STORE_UNAVAILABLE', async () => {
    const { scripted, store, single } = await rig()
    scripted.fail(single.insert.sql, refused())
    await expect(store.acquire('ins', 'k', fp('a'), 30_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringMatching(/^mysql: acquire failed: Connection lost/),
    })
    scripted.fail(single.insert.sql, null)
    await expect(store.acquire('ins', 'k', fp('a'), 30_000)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE', cause: null })
  })

  it('retries a deadlocked statement lockRetries times, then types the deadlock as STORE_UNAVAILABLE', async () => {
    const { scripted, table, single } = await rig()
    const deadlock = () => Object.assign(new Error('Deadlock found when trying to get lock'), { errno: 1213 })
    const store = new MySqlStore({ pool: scripted.pool, table, lockRetries: 2 })
    for (let i = 0; i < 3; i++) scripted.fail(single.get.sql, deadlock())
    await expect(store.get('dl', 'k')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE', cause: expect.objectContaining({ errno: 1213 }) })
    expect(scripted.count(single.get.sql)).toBe(3)
    for (let i = 0; i < 2; i++) scripted.fail(single.get.sql, deadlock())
    expect(await store.get('dl', 'k')).toBeNull()
    expect(scripted.count(single.get.sql)).toBe(6)
  })

  it('types a failed upsert or read-back of acquire as acquire', async () => {
    const { scripted, store, other, single } = await rig({ groupCommit: false })
    const { token } = (await other.acquire('up', 'k', fp('a'), 30_000)) as { token: number }
    await other.release('up', 'k', token)
    scripted.fail(single.acquire.sql, refused())
    await expect(store.acquire('up', 'k', fp('a'), 30_000)).rejects.toThrow(/^mysql: acquire failed: Connection lost/)
    scripted.fail(single.acquired.sql, refused())
    await expect(store.acquire('up', 'k', fp('a'), 30_000)).rejects.toThrow(/^mysql: acquire failed: Connection lost/)
  })

  it('goes round again when the row vanishes or becomes takeable between the upsert and its read-back', async () => {
    const { scripted, store, other, single } = await rig({ groupCommit: false })
    // Evicted in between: the next round inserts it.
    await other.acquire('round', 'gone', fp('a'), 30_000)
    await other.release('round', 'gone', 1)
    scripted.before(single.acquired.sql, () => other.evict('round', 'gone'))
    expect(await store.acquire('round', 'gone', fp('a'), 30_000)).toEqual({ kind: 'acquired', token: 1 })
    // Taken by another caller before the upsert, released before the read-back: the next round takes it.
    await other.acquire('round', 'freed', fp('a'), 30_000)
    await other.release('round', 'freed', 1)
    scripted.before(single.acquire.sql, () => other.acquire('round', 'freed', fp('a'), 30_000))
    scripted.before(single.acquired.sql, () => other.release('round', 'freed', 2))
    expect(await store.acquire('round', 'freed', fp('a'), 30_000)).toEqual({ kind: 'acquired', token: 3 })
  })

  it('gives up with STORE_UNAVAILABLE after exactly 100 rounds lost to an evicting writer', async () => {
    const { scripted, store, other, single } = await rig({ groupCommit: false })
    await other.acquire('lost', 'k', fp('a'), 30_000)
    await other.release('lost', 'k', 1)
    scripted.before(single.acquired.sql, () => other.evict('lost', 'k'), Number.POSITIVE_INFINITY)
    await expect(store.acquire('lost', 'k', fp('a'), 30_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: 'mysql: acquire of "k" lost 100 races in a row to writers that kept releasing or evicting it. Retry later.',
    })
    expect(scripted.count(single.acquire.sql)).toBe(100)
  }, 30_000)

  it('batches concurrent acquires, reads, renews, releases and completes by default, three callers to a statement', async () => {
    const { scripted, store, single, batch } = await rig()
    const keys = ['k0', 'k1', 'k2', 'k3']
    const all = <T>(fn: (key: string, i: number) => Promise<T>) => Promise.all(keys.map(fn))
    expect(await all((key) => store.acquire('b', key, fp('a'), 30_000))).toEqual(keys.map(() => ({ kind: 'acquired', token: 1 })))
    expect(scripted.count(batch.acquire(3))).toBe(1)
    expect((await all((key) => store.get('b', key))).map((record) => record?.key)).toEqual(keys)
    expect(scripted.count(batch.get(3))).toBe(1)
    expect(await all((key) => store.renew('b', key, 1, 120_000))).toEqual([true, true, true, true])
    expect(scripted.count(batch.renew(3))).toBe(1)
    expect(scripted.count(single.renew.sql)).toBe(1)
    for (const record of await all((key) => store.get('b', key))) {
      expect(Number(record?.lockedUntilMs) - Number(record?.updatedAtMs)).toBe(120_000)
    }
    expect(await all((key) => store.release('b', key, 1))).toEqual([true, true, true, true])
    expect(scripted.count(batch.release(3))).toBe(1)
    expect(scripted.count(single.release.sql)).toBe(1)
    expect(await all((key) => store.acquire('b', key, fp('a'), 30_000))).toEqual(keys.map(() => ({ kind: 'acquired', token: 2 })))
    expect(await all((key, i) => store.complete('b', key, 2, outcome(key, 200 + i), 50_000))).toEqual([true, true, true, true])
    expect(scripted.count(batch.complete(3))).toBe(1)
    expect(scripted.count(single.complete.sql)).toBe(1)
    for (const [i, record] of (await all((key) => store.get('b', key))).entries()) {
      const key = keys[i] as string
      expect(record).toMatchObject({
        status: 'completed',
        lockedUntilMs: null,
        resourceId: `res-${key}`,
        response: { status: 200 + i, headers: { 'content-type': 'text/plain', 'x-body': key }, body: new Uint8Array(Buffer.from(key)) },
      })
      expect(Number(record?.expiresAtMs) - Number(record?.updatedAtMs)).toBe(50_000)
    }
  })

  it('fences stale callers out of a batch under its locks: missing rows, old tokens and stored records answer false, no single statements', async () => {
    const { scripted, store, other, single, batch } = await rig()
    for (const key of ['a', 'b', 'c', 'done']) await other.acquire('f', key, fp('a'), 30_000)
    await other.complete('f', 'done', 1, outcome('done'), 60_000)
    const renewals = await Promise.all([
      store.renew('f', 'a', 1, 30_000),
      store.renew('f', 'b', 1, 30_000),
      store.renew('f', 'c', 7, 30_000),
      store.renew('f', 'done', 1, 30_000),
      store.renew('f', 'missing', 1, 30_000),
    ])
    expect(renewals).toEqual([true, true, false, false, false])
    expect(scripted.count(batch.lock(4))).toBe(1)
    expect(scripted.count(single.renew.sql)).toBe(1)
    // A batch of stale callers only writes nothing.
    expect(await Promise.all([store.release('f', 'a', 1), store.release('f', 'c', 7), store.release('f', 'done', 1)])).toEqual([
      true,
      false,
      false,
    ])
  })

  it('answers a batch whose UPDATE changed another number of rows than it locked by single statements', async () => {
    const { scripted, store, other, single, batch } = await rig()
    for (const key of ['a', 'b', 'c']) await other.acquire('d', key, fp('a'), 30_000)
    scripted.answer(batch.renew(2), ([result, fields]) => [{ ...(result as object), affectedRows: 0 }, fields])
    expect(await Promise.all(['a', 'b', 'c'].map((key) => store.renew('d', key, 1, 30_000)))).toEqual([true, true, true])
    expect(scripted.count(single.renew.sql)).toBe(3)
  })

  it('sends a batch caller again when its row vanishes or turns takeable between the upsert and the read-back', async () => {
    const { scripted, store, other, batch } = await rig()
    scripted.before(batch.acquired(2), () => other.evict('again', 'b'))
    const gone = await Promise.all(['a', 'b', 'c'].map((key) => store.acquire('again', key, fp('a'), 30_000)))
    expect(gone).toEqual([1, 1, 1].map((token) => ({ kind: 'acquired', token })))
    await other.acquire('again', 'y', fp('a'), 30_000)
    await other.release('again', 'y', 1)
    scripted.before(batch.acquire(2), () => other.acquire('again', 'y', fp('a'), 30_000))
    scripted.before(batch.acquired(2), () => other.release('again', 'y', 2))
    const freed = await Promise.all(['x', 'y', 'z'].map((key) => store.acquire('again', key, fp('a'), 30_000)))
    expect(freed).toEqual([1, 3, 1].map((token) => ({ kind: 'acquired', token })))
  })

  it("types a failed batch upsert as each caller's acquire", async () => {
    const { scripted, store, batch } = await rig()
    scripted.fail(batch.acquire(2), refused())
    const settled = await Promise.allSettled(['a', 'b', 'c'].map((key) => store.acquire('fail', key, fp('a'), 30_000)))
    expect(settled.map((result) => result.status)).toEqual(['fulfilled', 'rejected', 'rejected'])
    for (const result of settled.slice(1)) {
      expect((result as PromiseRejectedResult).reason).toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: expect.stringMatching(/^mysql: acquire failed: Connection lost/),
      })
    }
  })

  it('records each migration step as it is done, so a failed one resumes where it stopped', async () => {
    const table = newTable()
    const scripted = scriptedPool(raw)
    scripted.fail(/^ALTER TABLE/, new Error('disk full'))
    await expect(new MySqlStore({ pool: scripted.pool, table }).migrate()).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringMatching(/^mysql: migrate failed: disk full\. /),
    })
    const version = async () => (await raw.query(`SELECT value FROM \`${table}_meta\``))[0]
    expect(await version()).toEqual([{ value: '1' }])
    const store = new MySqlStore({ pool: raw, table })
    await store.migrate()
    expect(await version()).toEqual([{ value: '2' }])
    await store.acquire('m', 'k', fp('a'), 30_000)
    expect(await store.recordStep('m', 'k', 1, 'step', '1')).toBe(true)
  })

  it('refuses to migrate while another process holds the migration lock, and types a refused connection as migrate', async () => {
    const table = newTable()
    const busy = 'mysql: another process has been migrating table'
    for (const answer of [[{ got: 0 }], []]) {
      const scripted = scriptedPool(raw)
      scripted.answer(/GET_LOCK/, ([, fields]) => [answer, fields])
      await expect(new MySqlStore({ pool: scripted.pool, table }).migrate()).rejects.toMatchObject({
        code: 'STORE_UNAVAILABLE',
        message: `${busy} ${table} for 30 s. Wait for it to finish, then run store.migrate() again.`,
      })
    }
    const down = scriptedPool(raw)
    down.failConnections(refused())
    await expect(new MySqlStore({ pool: down.pool, table }).migrate()).rejects.toThrow(/^mysql: migrate failed: Connection lost/)
    await expect(new MySqlStore({ pool: down.pool, table }).transaction(async () => 1)).rejects.toThrow(
      /^mysql: transaction failed: Connection lost/,
    )
  })

  it('types a failed COMMIT as commit, and rolls the work back', async () => {
    const { scripted, store, table } = await rig()
    scripted.fail('COMMIT', refused())
    await expect(
      store.transaction(async (tx) => {
        await tx.execute(`DELETE FROM \`${table}\``)
        return 1
      }),
    ).rejects.toThrow(/^mysql: commit failed: Connection lost/)
  })

  describe('queryTimeout against half-open connections', () => {
    const QUERY_TIMEOUT_MS = 1_500

    /** A store that reaches MariaDB through a TCP fault proxy, with a short queryTimeout. */
    async function proxied(table: string, options: Pick<MySqlStoreOptions, 'connectionLimit' | 'groupCommit'> = {}) {
      const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: 3306 })
      const store = new MySqlStore({ uri: `mysql://root@127.0.0.1:${proxy.port}/test`, table, queryTimeout: QUERY_TIMEOUT_MS, ...options })
      return { proxy, store }
    }

    it('fails a statement unanswered past queryTimeout with a StatementTimeoutError, and never reuses its connection', async () => {
      const { proxy, store } = await proxied((await rig()).table, { connectionLimit: 1, groupCommit: false })
      try {
        expect(await store.get('t', 'k')).toBeNull()
        proxy.blackhole()
        const error = await store.get('t', 'k').catch((caught: unknown) => caught)
        expect(error).toMatchObject({ code: 'STORE_UNAVAILABLE' })
        const cause = (error as IdempotencyError).cause
        expect(cause).toBeInstanceOf(StatementTimeoutError)
        expect(cause).toMatchObject({
          code: 'IDEMKEY_STATEMENT_TIMEOUT',
          name: 'StatementTimeoutError',
          message: `no answer from the server within queryTimeout (${QUERY_TIMEOUT_MS} ms); the connection was dropped (half-open, or the server is stalled)`,
        })
        // The dropped connection's socket is closed (not only ended: a half-open peer never answers a FIN).
        await eventually(() => proxy.localSockets() === 0, 'the dropped socket closed', 5_000)
        // The stalled connection never answers again; the pool's only slot must go to a new one.
        proxy.heal({ stalled: 'hang' })
        expect(await store.get('t', 'k')).toBeNull()
        expect(proxy.counts().accepted).toBe(2)
      } finally {
        await store.close()
        await proxy.close()
      }
    }, 10_000)

    it('closes its own pool while a statement hangs on a half-open connection: both settle, and its sockets are closed', async () => {
      const { proxy, store } = await proxied((await rig()).table, { connectionLimit: 2, groupCommit: false })
      try {
        expect(await Promise.all([store.get('t', 'a'), store.get('t', 'b')])).toEqual([null, null])
        proxy.blackhole()
        const hanging = store.get('t', 'a').catch((error: unknown) => error)
        await store.close()
        expect(await hanging).toMatchObject({ code: 'STORE_UNAVAILABLE' })
        await eventually(() => proxy.localSockets() === 0, "every one of the store's sockets closed", 5_000)
      } finally {
        await proxy.close()
      }
    }, 10_000)

    it('closes its own pool when only migrate used it, also with its connection half-open, and closes that socket', async () => {
      const { proxy, store } = await proxied(newTable())
      try {
        await store.migrate()
        proxy.blackhole()
        await store.close()
        await eventually(() => proxy.localSockets() === 0, "every one of the store's sockets closed", 5_000)
      } finally {
        await proxy.close()
      }
    }, 10_000)

    it('closes its own pool while a transaction hangs on a half-open connection: the transaction fails and its socket is closed', async () => {
      const { proxy, store } = await proxied((await rig()).table, { connectionLimit: 2, groupCommit: false })
      try {
        expect(await store.get('t', 'k')).toBeNull()
        // A business statement is not bounded by queryTimeout: only close() ends its wait.
        const { settled } = await hangMidTransaction(proxy, (body) => store.transaction((tx) => body(() => tx.query('SELECT 1'))))
        expect(proxy.localSockets()).toBeGreaterThan(0)
        await store.close()
        expect(await settled).toMatchObject({ code: 'IDEMKEY_STATEMENT_TIMEOUT' })
        await eventually(() => proxy.localSockets() === 0, "every one of the store's sockets closed", 5_000)
      } finally {
        await proxy.close()
      }
    }, 10_000)

    it('bounds nothing with queryTimeout 0, and ends its own pool on close even when it never ran a statement', async () => {
      const { table } = await rig()
      const unbounded = new MySqlStore({ uri: URI, table, queryTimeout: 0 })
      expect(await unbounded.get('t', 'k')).toBeNull()
      await unbounded.close()
      const unused = new MySqlStore({ uri: URI, table })
      await unused.close()
      await expect(unused.get('t', 'k')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    })

    it('settles a second close(), at once or while the first still runs (the ledger closes its store, and so may you)', async () => {
      const own = new MySqlStore({ uri: URI, table: (await rig()).table })
      expect(await own.get('t', 'k')).toBeNull()
      await Promise.all([own.close(), own.close()])
      await own.close()
    })
  })
})
