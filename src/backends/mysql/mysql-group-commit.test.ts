import { randomUUID } from 'node:crypto'
import mysql from 'mysql2/promise'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import type { Outcome } from '../../core/store.js'
import { isIdempotencyError } from '../../errors.js'
import { fp } from '../../testing/store-fixtures.js'
import { batchStatements } from './batch-statements.js'
import { MAX_BATCHED_BYTES } from './batches.js'
import { isTransientTransactionError } from './mysql-errors.js'
import { MySqlStore } from './mysql-store.js'
import type { MySqlConnectionLike, MySqlPoolLike, MySqlValue } from './pool.js'
import { statements } from './statements.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
const suffix = randomUUID().slice(0, 8)
const RETENTION_MS = 24 * 3_600_000

interface Sent {
  sql: string
  values: MySqlValue[] | undefined
}

/**
 * A pool that logs every statement the store sends (on the pool and on connections taken from it)
 * and can hold them at a gate: a statement sent while paused waits until `resume()`, so whatever the
 * store queues meanwhile goes out after it, together.
 */
function gatedPool(pool: MySqlPoolLike) {
  const sent: Sent[] = []
  let gate: Promise<void> | undefined
  let open = () => {}
  /** Fails the next statement whose text is `sql` with `error` (once), as the server would. */
  let failNext: { sql: string; error: unknown } | undefined
  /** Runs `fn` before the next statement whose text is `sql` goes out (once): another process's write in between. */
  let beforeNext: { sql: string; fn: () => Promise<unknown> } | undefined
  const through =
    (run: (sql: string, values?: MySqlValue[]) => Promise<[unknown, unknown]>) =>
    async (sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]> => {
      sent.push({ sql, values })
      const held = gate
      if (held) await held
      if (beforeNext && beforeNext.sql === sql) {
        const { fn } = beforeNext
        beforeNext = undefined
        await fn()
      }
      if (failNext && failNext.sql === sql) {
        const { error } = failNext
        failNext = undefined
        throw error
      }
      return run(sql, values)
    }
  const wrapped: MySqlPoolLike = {
    query: through((sql, values) => pool.query(sql, values)),
    execute: through((sql, values) => pool.execute(sql, values)),
    async getConnection(): Promise<MySqlConnectionLike> {
      const connection = await pool.getConnection()
      return {
        query: through((sql, values) => connection.query(sql, values)),
        execute: through((sql, values) => connection.execute(sql, values)),
        release: () => connection.release(),
      }
    },
  }
  return {
    pool: wrapped,
    sent,
    pause() {
      gate = new Promise((resolve) => {
        open = resolve
      })
    },
    resume() {
      gate = undefined
      open()
    },
    failNext(sql: string, error: unknown) {
      failNext = { sql, error }
    },
    beforeNext(sql: string, fn: () => Promise<unknown>) {
      beforeNext = { sql, fn }
    },
  }
}

const outcome = (body: string): Outcome => ({
  status: 'completed',
  response: { status: 201, headers: { 'content-type': 'application/json', 'x-quote': 'a"b\\c\'d' }, body: Buffer.from(body) },
})

describe.skipIf(skip !== undefined)('MySqlStore group commit', () => {
  const table = `idemkey_group_${suffix}`
  const raw = mysql.createPool({ uri: URI, connectionLimit: 6 }) as unknown as MySqlPoolLike & { end(): Promise<void> }
  const gated = gatedPool(raw)
  const store = new MySqlStore({ pool: gated.pool, table })
  const single = statements(table, RETENTION_MS)
  const batch = batchStatements(table, RETENTION_MS)
  const texts = () => gated.sent.map((sent) => sent.sql)
  /** The sizes (callers or rows) of the batch statements of `kind` sent, in order. */
  const batchesOf = (kind: keyof typeof batch) =>
    gated.sent.flatMap(({ sql }) => {
      for (let n = 1; n <= 300; n++) if (sql === batch[kind](n)) return [n]
      return []
    })
  /** Runs `queue` while a first statement of the same kind (from `head`) is held, so `queue`'s calls wait and go out together. */
  async function together<H, Q>(head: () => Promise<H>, queue: () => Promise<Q>): Promise<[H, Q]> {
    gated.pause()
    const first = head()
    const rest = queue()
    gated.resume()
    return [await first, await rest]
  }

  beforeAll(() => store.migrate())
  afterAll(async () => {
    await store.close()
    await raw.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
    await raw.end()
  })
  beforeEach(() => {
    gated.sent.length = 0
  })

  it('answers a winner and a loser of one key, a mismatch and a replay from one batch, each as alone', async () => {
    const scope = `s-${randomUUID()}`
    const done = await store.acquire(scope, 'done', fp('a'), 30_000)
    expect(done.kind).toBe('acquired')
    expect(await store.complete(scope, 'done', done.kind === 'acquired' ? done.token : 0, outcome('{"id":1}'), 60_000)).toBe(true)
    gated.sent.length = 0

    const [blocker, answers] = await together(
      () => store.acquire(scope, 'blocker', fp('a'), 30_000),
      () =>
        Promise.all([
          store.acquire(scope, 'new', fp('a'), 30_000),
          store.acquire(scope, 'new', fp('a'), 30_000),
          store.acquire(scope, 'new', fp('b'), 30_000),
          store.acquire(scope, 'done', fp('a'), 30_000),
          store.acquire(scope, 'done', fp('b'), 30_000),
        ]),
    )
    const statements = texts()
    expect(blocker).toEqual({ kind: 'acquired', token: 1 })
    const [winner, loser, otherPayload, replay, mismatch] = answers
    expect(winner).toEqual({ kind: 'acquired', token: 1 })
    const held = await store.get(scope, 'new')
    expect(loser).toEqual({ kind: 'in_progress', lockedUntilMs: held?.lockedUntilMs })
    expect(otherPayload).toEqual({ kind: 'mismatch' })
    expect(replay).toMatchObject({ kind: 'replay', record: { key: 'done', status: 'completed', token: 1 } })
    if (replay?.kind === 'replay') {
      expect(replay.record.response?.headers).toEqual(outcome('').response.headers)
      expect(Buffer.from(replay.record.response?.body ?? []).toString()).toBe('{"id":1}')
    }
    expect(mismatch).toEqual({ kind: 'mismatch' })
    expect(held).toMatchObject({ status: 'in_progress', fingerprint: fp('a'), token: 1, attempts: 1 })

    // The blocker alone (read, insert); then the five callers: one read of their two keys, one upsert
    // of the first caller of 'new' (the only row to write), its read back; then the two others of
    // 'new', which meet the winner's record in the next batch's read, as the single path's losers would.
    expect(statements.slice(0, 2)).toEqual([single.peek.sql, single.insert.sql])
    expect(batchesOf('peek')).toEqual([2, 1])
    expect(batchesOf('acquire')).toEqual([1])
    expect(batchesOf('acquired')).toEqual([1])
    expect(statements).toHaveLength(6)
  })

  it('answers a caller whose row another process took between the batch read and its upsert by that record, not as a winner', async () => {
    const other = new MySqlStore({ pool: raw, table, groupCommit: false })
    const scope = `s-${randomUUID()}`
    let taken: unknown
    gated.beforeNext(batch.acquire(2), async () => {
      taken = await other.acquire(scope, 'x', fp('b'), 30_000)
    })
    const [, answers] = await together(
      () => store.acquire(scope, 'blocker', fp('a'), 30_000),
      () => Promise.all([store.acquire(scope, 'x', fp('a'), 30_000), store.acquire(scope, 'y', fp('a'), 30_000)]),
    )
    expect(taken).toEqual({ kind: 'acquired', token: 1 })
    expect(answers).toEqual([{ kind: 'mismatch' }, { kind: 'acquired', token: 1 }])
    expect(await store.get(scope, 'x')).toMatchObject({ fingerprint: fp('b'), token: 1, status: 'in_progress' })
    expect(batchesOf('acquire')).toEqual([2])
    await other.close()
  })

  it('takes over ended leases and expired records in a batch exactly as single statements do', async () => {
    const alone = new MySqlStore({ pool: raw, table, groupCommit: false })
    /** The same four situations under `scope`: lease ended (same payload, other payload, other payload after steps), record expired. */
    const setUp = async (scope: string) => {
      for (const key of ['same', 'other', 'stepped', 'expired']) {
        const acquired = await alone.acquire(scope, key, fp('a'), 300)
        const token = acquired.kind === 'acquired' ? acquired.token : 0
        if (key === 'stepped') expect(await alone.recordStep(scope, key, token, 'charge', '"ch_1"')).toBe(true)
        if (key === 'expired') expect(await alone.complete(scope, key, token, outcome('old'), 300)).toBe(true)
      }
      await new Promise((resolve) => setTimeout(resolve, 450))
    }
    const requests = [
      ['same', fp('a')],
      ['other', fp('b')],
      ['stepped', fp('b')],
      ['expired', fp('b')],
      ['stepped', fp('a')],
    ] as const
    const batched = `s-${randomUUID()}`
    const oneAtATime = `s-${randomUUID()}`
    await setUp(batched)
    await setUp(oneAtATime)
    gated.sent.length = 0
    const [, inBatch] = await together(
      () => store.acquire(batched, 'blocker', fp('a'), 30_000),
      () => Promise.all(requests.map(([key, payload]) => store.acquire(batched, key, payload, 30_000))),
    )
    // One read of the four keys; the other payload after steps is a mismatch from it; the four
    // others are takeovers, one upsert of four rows (the stepped record's own payload among them).
    expect(batchesOf('peek')).toEqual([4])
    expect(batchesOf('acquire')).toEqual([4])
    const oneByOne = []
    for (const [key, payload] of requests) oneByOne.push(await alone.acquire(oneAtATime, key, payload, 30_000))
    expect(inBatch).toEqual(oneByOne)
    expect(inBatch.map((answer) => answer.kind)).toEqual(['acquired', 'acquired', 'mismatch', 'acquired', 'acquired'])
    expect(inBatch[0]).toEqual({ kind: 'acquired', token: 2 })
    expect(inBatch[4]).toEqual({ kind: 'acquired', token: 2, steps: [{ name: 'charge', result: '"ch_1"' }] })
    const shape = async (scope: string) =>
      (await Promise.all(requests.map(([key]) => alone.get(scope, key)))).map((record) => ({
        fingerprint: record?.fingerprint,
        status: record?.status,
        token: record?.token,
        attempts: record?.attempts,
        lockedUntil: record?.lockedUntilMs === null ? null : typeof record?.lockedUntilMs,
        response: record?.response,
        created: (record?.createdAtMs ?? 0) > Date.now() - 5_000,
      }))
    expect(await shape(batched)).toEqual(await shape(oneAtATime))
    await alone.close()
  })

  it('fences out a stale complete in the same batch as a current one, and stores each body as its own', async () => {
    const scope = `s-${randomUUID()}`
    const tokens: Record<string, number> = {}
    for (const key of ['blocker', 'a', 'b', 'zombie']) {
      const acquired = await store.acquire(scope, key, fp('a'), 30_000)
      tokens[key] = acquired.kind === 'acquired' ? acquired.token : 0
    }
    // The zombie's holder lost its lease: released and taken again, so token 1 is stale.
    expect(await store.release(scope, 'zombie', tokens.zombie as number)).toBe(true)
    const again = await store.acquire(scope, 'zombie', fp('a'), 30_000)
    expect(again).toEqual({ kind: 'acquired', token: 2 })
    gated.sent.length = 0

    const binary = Buffer.from([0, 1, 2, 0x27, 0x5c, 0xff, 0])
    const [, results] = await together(
      () => store.complete(scope, 'blocker', tokens.blocker as number, outcome('blocker'), 60_000),
      () =>
        Promise.all([
          store.complete(scope, 'a', tokens.a as number, { ...outcome('a'), resourceId: 'order-1' }, 60_000),
          store.complete(scope, 'zombie', 1, outcome('stale'), 60_000),
          store.complete(
            scope,
            'b',
            tokens.b as number,
            { status: 'failed', response: { status: 500, headers: {}, body: binary } },
            60_000,
          ),
          store.complete(scope, 'b', (tokens.b as number) + 5, outcome('wrong token'), 60_000),
        ]),
    )
    expect(results).toEqual([true, false, true, false])
    // Three callers of distinct rows locked together, two of them current and updated in one statement;
    // the second complete of 'b' never shares a statement with the first: it goes alone after.
    expect(batchesOf('lock')).toEqual([3])
    expect(batchesOf('complete')).toEqual([2])
    expect(texts().filter((sql) => sql === single.complete.sql)).toHaveLength(2)
    expect(await store.get(scope, 'a')).toMatchObject({ status: 'completed', resourceId: 'order-1', response: { status: 201 } })
    expect(Buffer.from((await store.get(scope, 'a'))?.response?.body ?? []).toString()).toBe('a')
    const b = await store.get(scope, 'b')
    expect(b).toMatchObject({ status: 'failed', resourceId: null, lockedUntilMs: null, response: { status: 500, headers: {} } })
    expect(Buffer.from(b?.response?.body ?? [])).toEqual(binary)
    expect((await store.get(scope, 'a'))?.response?.headers).toEqual(outcome('').response.headers)
    expect(await store.get(scope, 'zombie')).toMatchObject({ status: 'in_progress', token: 2 })
  })

  it('sends a complete whose body passes 16 KiB as its single statement, beside a batch of small ones', async () => {
    const scope = `s-${randomUUID()}`
    const tokens: Record<string, number> = {}
    for (const key of ['blocker', 'small1', 'small2', 'large']) {
      tokens[key] = ((await store.acquire(scope, key, fp('a'), 30_000)) as { token: number }).token
    }
    const large = Buffer.alloc(MAX_BATCHED_BYTES + 1, 0xab)
    gated.sent.length = 0
    const [, results] = await together(
      () => store.complete(scope, 'blocker', tokens.blocker as number, outcome('blocker'), 60_000),
      () =>
        Promise.all([
          store.complete(scope, 'small1', tokens.small1 as number, outcome('s1'), 60_000),
          store.complete(
            scope,
            'large',
            tokens.large as number,
            { status: 'completed', response: { status: 200, headers: {}, body: large } },
            60_000,
          ),
          store.complete(scope, 'small2', tokens.small2 as number, outcome('s2'), 60_000),
        ]),
    )
    expect(results).toEqual([true, true, true])
    expect(batchesOf('complete')).toEqual([2])
    expect(texts().filter((sql) => sql === single.complete.sql)).toHaveLength(2)
    expect(Buffer.from((await store.get(scope, 'large'))?.response?.body ?? [])).toEqual(large)
  })

  it('renews, releases and reads in batches, fenced by each caller token', async () => {
    const scope = `s-${randomUUID()}`
    const tokens: number[] = []
    for (const key of ['k0', 'k1', 'k2', 'k3']) {
      const acquired = await store.acquire(scope, key, fp('a'), 1_000)
      tokens.push(acquired.kind === 'acquired' ? acquired.token : 0)
    }
    const before = await store.get(scope, 'k1')
    gated.sent.length = 0
    const [, renewed] = await together(
      () => store.renew(scope, 'k0', tokens[0] as number, 60_000),
      () => Promise.all([store.renew(scope, 'k1', tokens[1] as number, 60_000), store.renew(scope, 'k2', 7, 60_000)]),
    )
    expect(renewed).toEqual([true, false])
    expect((await store.get(scope, 'k1'))?.lockedUntilMs).toBeGreaterThan((before?.lockedUntilMs ?? 0) + 30_000)
    expect((await store.get(scope, 'k2'))?.lockedUntilMs).toBeLessThan((before?.lockedUntilMs ?? 0) + 30_000)
    const [, released] = await together(
      () => store.release(scope, 'k0', tokens[0] as number),
      () => Promise.all([store.release(scope, 'k3', tokens[3] as number), store.release(scope, 'k2', 9)]),
    )
    expect(released).toEqual([true, false])
    expect(await store.acquire(scope, 'k3', fp('b'), 1_000)).toEqual({ kind: 'acquired', token: 2 })
    const [, read] = await together(
      () => store.get(scope, 'k0'),
      () => Promise.all([store.get(scope, 'k1'), store.get(scope, 'missing'), store.get(scope, 'k1')]),
    )
    expect(read.map((record) => record && [record.key, record.token])).toEqual([['k1', 1], null, ['k1', 1]])
    expect(batchesOf('renew')).toEqual([1])
    expect(batchesOf('release')).toEqual([1])
    expect(batchesOf('lock')).toEqual([2, 2])
    expect(batchesOf('get')).toEqual([2])
  })

  it('lets exactly one caller per key win among 300 concurrent acquires of 30 keys with two payloads, the others answered by its record', async () => {
    const scope = `s-${randomUUID()}`
    const calls = Array.from({ length: 300 }, (_, i) => ({ key: `k${i % 30}`, payload: fp(i % 7 === 0 ? 'b' : 'a') }))
    const answers = await Promise.all(calls.map(({ key, payload }) => store.acquire(scope, key, payload, 30_000)))
    expect(batchesOf('acquire').length).toBeGreaterThan(0)
    for (let k = 0; k < 30; k++) {
      const record = await store.get(scope, `k${k}`)
      const mine = calls.flatMap((call, i) => (call.key === `k${k}` ? [{ ...call, answer: answers[i] }] : []))
      expect(mine.filter(({ answer }) => answer?.kind === 'acquired')).toHaveLength(1)
      for (const { payload, answer } of mine) {
        if (answer?.kind === 'acquired') expect(payload).toBe(record?.fingerprint)
        else if (payload === record?.fingerprint) expect(answer).toEqual({ kind: 'in_progress', lockedUntilMs: record?.lockedUntilMs })
        else expect(answer).toEqual({ kind: 'mismatch' })
      }
      expect(record).toMatchObject({ status: 'in_progress', token: 1, attempts: 1 })
    }
  })

  it('lets exactly one of two stores (two processes) win each key when their batches race, with no caller lost to a deadlock', async () => {
    const other = new MySqlStore({ pool: raw, table })
    const scope = `s-${randomUUID()}`
    const keys = Array.from({ length: 40 }, (_, i) => `k${i}`)
    const runs = [store, other].flatMap((on) => [0, 1, 2].flatMap(() => keys.map((key) => on.acquire(scope, key, fp('a'), 30_000))))
    const answers = await Promise.all(runs)
    // This store's callers went out in batches (whether they had rows left to write depends on timing).
    expect(batchesOf('peek').length).toBeGreaterThan(0)
    for (const key of keys) {
      const mine = answers.filter((_, i) => keys[i % keys.length] === key)
      expect(mine.filter((answer) => answer.kind === 'acquired')).toHaveLength(1)
      expect(mine.filter((answer) => answer.kind === 'in_progress')).toHaveLength(5)
    }
    await other.close()
  })

  it('sends a caller alone as the single statements, with nothing queued behind it', async () => {
    const scope = `s-${randomUUID()}`
    const acquired = await store.acquire(scope, 'k', fp('a'), 30_000)
    await store.complete(scope, 'k', acquired.kind === 'acquired' ? acquired.token : 0, outcome('x'), 60_000)
    await store.acquire(scope, 'k', fp('a'), 30_000)
    await store.get(scope, 'k')
    expect(texts()).toEqual([single.peek.sql, single.insert.sql, single.complete.sql, single.peek.sql, single.get.sql])
  })

  it('gives every caller of a failed batch the typed error of its single statement, transient as such', async () => {
    const scope = `s-${randomUUID()}`
    const lost = () => Object.assign(new Error('Lock wait timeout exceeded; try restarting transaction'), { errno: 1205 })
    const refused = () =>
      Object.assign(new Error('Connection lost: The server closed the connection.'), { code: 'PROTOCOL_CONNECTION_LOST' })
    // What the single statement answers for that error.
    const off = new MySqlStore({ pool: gated.pool, table, groupCommit: false })
    gated.failNext(single.peek.sql, refused())
    const alone = await off.acquire(scope, 'z', fp('a'), 30_000).catch((error: unknown) => error)
    gated.failNext(batch.peek(2), refused())
    const [, settled] = await together(
      () => store.acquire(scope, 'blocker', fp('a'), 30_000),
      () => Promise.allSettled([store.acquire(scope, 'x', fp('a'), 30_000), store.acquire(scope, 'y', fp('a'), 30_000)]),
    )
    for (const result of settled) {
      expect(result.status).toBe('rejected')
      const error = (result as PromiseRejectedResult).reason
      expect(isIdempotencyError(error) && error.code).toBe('STORE_UNAVAILABLE')
      expect(error.message).toBe((alone as Error).message)
    }
    // A complete batch that fails inside its transaction is rolled back: nothing of it was written.
    const tokens: number[] = []
    for (const key of ['c0', 'c1', 'c2']) tokens.push(((await store.acquire(scope, key, fp('a'), 30_000)) as { token: number }).token)
    gated.failNext(batch.complete(2), refused())
    const [, completes] = await together(
      () => store.complete(scope, 'c0', tokens[0] as number, outcome('c0'), 60_000),
      () =>
        Promise.allSettled([
          store.complete(scope, 'c1', tokens[1] as number, outcome('c1'), 60_000),
          store.complete(scope, 'c2', tokens[2] as number, outcome('c2'), 60_000),
        ]),
    )
    expect(completes.map((result) => result.status)).toEqual(['rejected', 'rejected'])
    for (const result of completes) expect(String((result as PromiseRejectedResult).reason.message)).toContain('mysql: complete failed')
    expect(await store.get(scope, 'c1')).toMatchObject({ status: 'in_progress' })
    expect(await store.get(scope, 'c2')).toMatchObject({ status: 'in_progress' })
    // Still the holders' tokens: completing now works.
    expect(await store.complete(scope, 'c1', tokens[1] as number, outcome('c1'), 60_000)).toBe(true)
    // A lock wait timeout of a batch: its callers are run again one by one (which retry it), each answered.
    gated.failNext(batch.lock(2), lost())
    const [, retried] = await together(
      () => store.release(scope, 'c0', tokens[0] as number),
      () => Promise.all([store.release(scope, 'c2', tokens[2] as number), store.release(scope, 'x', 1)]),
    )
    expect(retried).toEqual([true, false])
    expect(isTransientTransactionError(lost())).toBe(true)
    await off.close()
  })

  it('runs the callers of a batch that deadlocked one by one, each answered', async () => {
    const scope = `s-${randomUUID()}`
    gated.failNext(batch.peek(1), Object.assign(new Error('Deadlock found when trying to get lock'), { errno: 1213 }))
    const [, answers] = await together(
      () => store.acquire(scope, 'blocker', fp('a'), 30_000),
      () => Promise.all([store.acquire(scope, 'x', fp('a'), 30_000), store.acquire(scope, 'x', fp('a'), 30_000)]),
    )
    expect(answers.map((answer) => answer.kind).sort()).toEqual(['acquired', 'in_progress'])
    expect(batchesOf('peek')).toEqual([1])
    expect(batchesOf('acquire')).toEqual([])
    expect(texts().filter((sql) => sql === single.peek.sql)).toHaveLength(3)
  })

  it('never batches inside a transaction: completeInTransaction sends its single statement on the transaction', async () => {
    const scope = `s-${randomUUID()}`
    const a = (await store.acquire(scope, 'a', fp('a'), 30_000)) as { token: number }
    const b = (await store.acquire(scope, 'b', fp('a'), 30_000)) as { token: number }
    const c = (await store.acquire(scope, 'c', fp('a'), 30_000)) as { token: number }
    gated.sent.length = 0
    const [, [inTx, onPool]] = await together(
      () => store.complete(scope, 'a', a.token, outcome('a'), 60_000),
      () =>
        Promise.all([
          store.transaction((tx) => store.completeInTransaction(tx, scope, 'b', b.token, outcome('b'), 60_000)),
          store.complete(scope, 'c', c.token, outcome('c'), 60_000),
        ]),
    )
    expect([inTx, onPool]).toEqual([true, true])
    expect(texts().filter((sql) => sql === single.complete.sql)).toHaveLength(3)
    expect(batchesOf('lock')).toEqual([])
  })

  it('sends one statement per operation with groupCommit: false', async () => {
    const off = new MySqlStore({ pool: gated.pool, table, groupCommit: false })
    const scope = `s-${randomUUID()}`
    const [, answers] = await together(
      () => off.acquire(scope, 'blocker', fp('a'), 30_000),
      () => Promise.all(['a', 'b', 'c'].map((key) => off.acquire(scope, key, fp('a'), 30_000))),
    )
    expect(answers).toEqual([1, 1, 1].map((token) => ({ kind: 'acquired', token })))
    expect(texts().sort()).toEqual([...Array(4).fill(single.insert.sql), ...Array(4).fill(single.peek.sql)].sort())
    await off.close()
  })
})
