import { randomUUID } from 'node:crypto'
import pg from 'pg'
import postgres from 'postgres'
import { tapPool } from '../../../test/helpers/pg-pool-tap.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import type { Outcome } from '../../core/store.js'
import { isIdempotencyError } from '../../errors.js'
import { postgresJsPool } from '../../orm/postgres-js/index.js'
import { fp } from '../../testing/store-fixtures.js'
import { batchStatements } from './batch-statements.js'
import { partitionedStatements } from './partitioned-statements.js'
import type { PgPoolLike, PgQueryConfig, PgQueryResult } from './pool.js'
import { isTransientTransactionError } from './postgres-errors.js'
import { PostgresStore } from './postgres-store.js'
import { statements } from './statements.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)

/**
 * A pool that logs every statement the store sends and can hold them at a gate: a statement sent
 * while paused waits until `resume()`, so whatever the store queues meanwhile goes out after it, together.
 * Statements on a client of the pool (the partitioned layout's acquire transaction) are logged and
 * held too; its BEGIN and COMMIT (plain strings) are not.
 */
function gatedPool(pool: PgPoolLike) {
  const sent: PgQueryConfig[] = []
  let gate: Promise<void> | undefined
  let open = () => {}
  /** Fails the next statement whose text is `text`, for two callers or more, with `error` (once), as the server would. */
  let failNext: { text: string; error: unknown } | undefined
  const pass = async (config: PgQueryConfig, run: (config: PgQueryConfig) => Promise<PgQueryResult>) => {
    sent.push(config)
    const held = gate
    if (held) await held
    const callers = Array.isArray(config.values?.[0]) ? (config.values[0] as unknown[]).length : 1
    if (failNext && failNext.text === config.text && callers > 1) {
      const { error } = failNext
      failNext = undefined
      throw error
    }
    return run(config)
  }
  const wrapped = tapPool(pool, {
    // Plain strings on a client (BEGIN, COMMIT) are neither logged nor held.
    through: (config, on, run, plain) => (on === 'client' && plain ? run(config) : pass(config, run)),
  })
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
    failNext(text: string, error: unknown) {
      failNext = { text, error }
    },
  }
}

const outcome = (body: string): Outcome => ({
  status: 'completed',
  response: { status: 201, headers: { 'content-type': 'application/json', 'x-quote': 'a"b\\c' }, body: Buffer.from(body) },
})

const drivers = [
  {
    name: 'pg',
    open: () => {
      const pool = new pg.Pool({ connectionString: URL, max: 6 })
      return { pool: pool as PgPoolLike, end: () => pool.end() }
    },
  },
  {
    name: 'postgres.js',
    open: () => {
      const sql = postgres(URL, { max: 6, onnotice: () => {} })
      return { pool: postgresJsPool(sql), end: () => sql.end({ timeout: 5 }) }
    },
  },
]

/**
 * Each driver on both layouts. The partitioned layout's acquire starts with one read for one caller
 * and for many (`peek`; the callers it leaves go on under key locks), so there its "single" and
 * "batch" acquire are that read's text, and a batch is a statement of it that carried two callers or more.
 */
const cases = drivers.flatMap((driver) => [
  { ...driver, layout: 'plain' as const, prefix: 'idemkey_group' },
  { ...driver, layout: 'partitioned' as const, prefix: 'h3_group' },
])

describe.skipIf(skip !== undefined).each(cases)('PostgresStore group commit on $name ($layout)', (driver) => {
  const table = `${driver.prefix}_${driver.name.replace('.', '')}_${suffix}`
  const { pool: raw, end } = driver.open()
  const gated = gatedPool(raw)
  const layout = { layout: driver.layout, partitionInterval: '1h' } as const
  const store = new PostgresStore({ pool: gated.pool, table, ...layout })
  const parted = partitionedStatements('public', table)
  const single = driver.layout === 'plain' ? statements('public', table) : { ...statements('public', table), acquire: parted.peek }
  const batch = driver.layout === 'plain' ? batchStatements('public', table) : { ...batchStatements('public', table), acquire: parted.peek }
  const sentOf = (text: string) => gated.sent.filter((config) => config.text === text)
  /** How many callers each batch statement of `text` carried (the length of its first array), single calls of a shared text left out. */
  const callersOf = (text: string) =>
    sentOf(text)
      .map((config) => (config.values?.[0] as string[] | undefined)?.length)
      .filter((callers) => callers === undefined || callers > 1)
  /** The texts sent, the partitioned layout's statements under key locks left out. */
  const sentTexts = () =>
    gated.sent.map((config) => config.text).filter((text) => text !== parted.lock.text && text !== parted.acquire.text)
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
    await raw.query(`DROP TABLE IF EXISTS "${table}"`)
    await end()
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

    // The blocker alone; then the five callers in one statement; then the two that met the winner's
    // insert in that statement's snapshot, as the single path's losers would have.
    expect(callersOf(batch.acquire.text)[0]).toBe(5)
    expect(new Set([...sentOf(single.acquire.text), ...sentOf(batch.acquire.text)]).size).toBeLessThanOrEqual(4)
  })

  it('takes over ended leases and expired records in a batch exactly as single statements do', async () => {
    const alone = new PostgresStore({ pool: raw, table, groupCommit: false, ...layout })
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
    ] as const
    const batched = `s-${randomUUID()}`
    const single = `s-${randomUUID()}`
    await setUp(batched)
    await setUp(single)
    gated.sent.length = 0
    const [, inBatch] = await together(
      () => store.acquire(batched, 'blocker', fp('a'), 30_000),
      () => Promise.all(requests.map(([key, payload]) => store.acquire(batched, key, payload, 30_000))),
    )
    expect(callersOf(batch.acquire.text)).toEqual([4])
    const oneByOne = []
    for (const [key, payload] of requests) oneByOne.push(await alone.acquire(single, key, payload, 30_000))
    expect(inBatch).toEqual(oneByOne)
    expect(inBatch.map((answer) => answer.kind)).toEqual(['acquired', 'acquired', 'mismatch', 'acquired'])
    expect(inBatch[0]).toEqual({ kind: 'acquired', token: 2 })
    const shape = async (scope: string) =>
      (await Promise.all(requests.map(([key]) => alone.get(scope, key)))).map((record) => ({
        fingerprint: record?.fingerprint,
        status: record?.status,
        token: record?.token,
        attempts: record?.attempts,
      }))
    expect(await shape(batched)).toEqual(await shape(single))
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

    const [, results] = await together(
      () => store.complete(scope, 'blocker', tokens.blocker as number, outcome('blocker'), 60_000),
      () =>
        Promise.all([
          store.complete(scope, 'a', tokens.a as number, outcome('a'), 60_000),
          store.complete(scope, 'zombie', 1, outcome('stale'), 60_000),
          store.complete(scope, 'b', tokens.b as number, outcome('b'), 60_000),
          store.complete(scope, 'b', (tokens.b as number) + 5, outcome('wrong token'), 60_000),
        ]),
    )
    expect(results).toEqual([true, false, true, false])
    expect(callersOf(batch.complete.text)).toEqual([3])
    for (const key of ['a', 'b']) {
      const record = await store.get(scope, key)
      expect(Buffer.from(record?.response?.body ?? []).toString()).toBe(key)
    }
    expect(await store.get(scope, 'zombie')).toMatchObject({ status: 'in_progress', token: 2 })
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
    const [, released] = await together(
      () => store.release(scope, 'k0', tokens[0] as number),
      () => Promise.all([store.release(scope, 'k3', tokens[3] as number), store.release(scope, 'k2', 9)]),
    )
    expect(released).toEqual([true, false])
    const [, read] = await together(
      () => store.get(scope, 'k0'),
      () => Promise.all([store.get(scope, 'k1'), store.get(scope, 'missing'), store.get(scope, 'k1')]),
    )
    expect(read.map((record) => record && [record.key, record.token])).toEqual([['k1', 1], null, ['k1', 1]])
    for (const kind of ['renew', 'release', 'get'] as const) expect(sentOf(batch[kind].text)).toHaveLength(1)
  })

  it('lets exactly one caller per key win among 300 concurrent acquires of 30 keys with two payloads, the others answered by its record', async () => {
    const scope = `s-${randomUUID()}`
    const calls = Array.from({ length: 300 }, (_, i) => ({ key: `k${i % 30}`, payload: fp(i % 7 === 0 ? 'b' : 'a') }))
    const answers = await Promise.all(calls.map(({ key, payload }) => store.acquire(scope, key, payload, 30_000)))
    expect(callersOf(batch.acquire.text).length).toBeGreaterThan(0)
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

  it('sends a caller alone as the single statement, with nothing queued behind it', async () => {
    const scope = `s-${randomUUID()}`
    const acquired = await store.acquire(scope, 'k', fp('a'), 30_000)
    await store.complete(scope, 'k', acquired.kind === 'acquired' ? acquired.token : 0, outcome('x'), 60_000)
    await store.acquire(scope, 'k', fp('a'), 30_000)
    expect(sentTexts()).toEqual([single.acquire.text, single.complete.text, single.acquire.text])
  })

  it('gives every caller of a failed batch the store error of its operation, transient as such', async () => {
    const scope = `s-${randomUUID()}`
    gated.failNext(batch.acquire.text, Object.assign(new Error('could not serialize access'), { code: '40001' }))
    const [, settled] = await together(
      () => store.acquire(scope, 'blocker', fp('a'), 30_000),
      () => Promise.allSettled([store.acquire(scope, 'x', fp('a'), 30_000), store.acquire(scope, 'y', fp('a'), 30_000)]),
    )
    for (const result of settled) {
      expect(result.status).toBe('rejected')
      const error = (result as PromiseRejectedResult).reason
      expect(isIdempotencyError(error) && error.code).toBe('STORE_UNAVAILABLE')
      expect(String(error.message)).toContain('postgres: acquire failed')
      expect(isTransientTransactionError(error)).toBe(true)
    }
    // Nothing of the failed statement was written: both keys are still new.
    expect(await store.acquire(scope, 'x', fp('a'), 30_000)).toEqual({ kind: 'acquired', token: 1 })
  })

  it('runs the callers of a batch that deadlocked with another batch again one by one, each answered', async () => {
    const scope = `s-${randomUUID()}`
    gated.failNext(batch.acquire.text, Object.assign(new Error('deadlock detected'), { code: '40P01' }))
    const [, answers] = await together(
      () => store.acquire(scope, 'blocker', fp('a'), 30_000),
      () => Promise.all([store.acquire(scope, 'x', fp('a'), 30_000), store.acquire(scope, 'x', fp('a'), 30_000)]),
    )
    expect(answers.map((answer) => answer.kind).sort()).toEqual(['acquired', 'in_progress'])
    // The batch went out once and failed; then each caller alone (a single acquire that meets the
    // other's insert after its snapshot runs again, as it always does).
    expect(callersOf(batch.acquire.text)).toEqual([2])
    expect(sentOf(single.acquire.text).length).toBeGreaterThanOrEqual(3)
  })

  it('sends one statement per operation with groupCommit: false', async () => {
    const off = new PostgresStore({ pool: gated.pool, table, groupCommit: false, ...layout })
    const scope = `s-${randomUUID()}`
    const [, answers] = await together(
      () => off.acquire(scope, 'blocker', fp('a'), 30_000),
      () => Promise.all(['a', 'b', 'c'].map((key) => off.acquire(scope, key, fp('a'), 30_000))),
    )
    expect(answers).toEqual([1, 1, 1].map((token) => ({ kind: 'acquired', token })))
    expect(sentTexts()).toEqual(Array(4).fill(single.acquire.text))
    await off.close()
  })
})
