import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import type { AcquireResult } from '../../core/store.js'
import { isIdempotencyError } from '../../errors.js'
import { fp, sampleOutcome } from '../../testing/store-fixtures.js'
import { partitionedStatements } from './partitioned-statements.js'
import { createPartitions, listPartitions, lockPartitions, serverNow, slotOf } from './partitions.js'
import { PostgresStore } from './postgres-store.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)
const LEASE = 30_000

describe.skipIf(skip !== undefined)('PostgresStore, partitioned layout', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 4 })
  const tables: string[] = []
  const pools: pg.Pool[] = [pool]
  /** A partitioned store on a fresh table (dropped after the suite). */
  async function partitioned(name: string, partitionInterval: string, own = pool) {
    const table = `h3_${name}_${suffix}`
    tables.push(table)
    const store = new PostgresStore({ pool: own, table, layout: 'partitioned', partitionInterval })
    await store.migrate()
    return store
  }
  afterAll(async () => {
    for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`)
    await Promise.all(pools.map((p) => p.end()))
  })

  const rowsOf = async (table: string, scope: string, key: string) =>
    (
      await pool.query(
        `SELECT tableoid::regclass::text AS partition, token::int, created_at, expires_at FROM "${table}" WHERE scope = $1 AND "key" = $2`,
        [scope, key],
      )
    ).rows as Array<{ partition: string; token: number; created_at: string; expires_at: string }>

  it('an acquire just after a boundary waits for an uncommitted record of the key in the previous partition, and answers with it', async () => {
    const store = await partitioned('boundary', '1h')
    const interval = 3_600_000
    const previous = slotOf(await serverNow(pool), interval) - interval
    const scope = `s-${randomUUID()}`
    const client = await pool.connect()
    try {
      await client.query('BEGIN')
      await createPartitions(client, 'public', store.table, interval, [previous])
      await client.query('COMMIT')
      // Another process's acquire, begun before the boundary: it holds the key's lock and has written
      // its row into the previous partition, not yet committed.
      await client.query('BEGIN')
      const { lock } = partitionedStatements('public', store.table)
      await client.query(lock.text, [[scope], ['k'], `public.${store.table}`])
      const now = await serverNow(client)
      await client.query(
        `INSERT INTO "${store.table}" (scope, "key", fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at)
         VALUES ($1, 'k', $2, 'in_progress', 1, $3, 1, $4, $4, $5)`,
        [scope, fp('a'), now + LEASE, previous + interval - 1, now + LEASE + 60_000],
      )
      // Our acquire, in the partition of now: its statement must not take a snapshot that misses the row.
      let settled = false
      const racing = store.acquire(scope, 'k', fp('a'), LEASE).finally(() => {
        settled = true
      })
      for (let waiting = 0; waiting === 0 && !settled; ) {
        waiting = Number(
          (await pool.query(`SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`)).rows[0].n as string,
        )
      }
      await client.query('COMMIT')
      const answer = await racing
      expect(answer.kind).toBe('in_progress')
      const rows = await rowsOf(store.table, scope, 'k')
      expect(rows).toHaveLength(1)
      expect(rows[0]?.partition).toBe(`h3_boundary_${suffix}_p${previous}`)
    } finally {
      client.release()
    }
  })

  it('concurrent duplicates on both sides of many partition boundaries: exactly one winner and one record per key', async () => {
    const interval = 100
    const racers = await Promise.all(
      Array.from({ length: 4 }, async (_, i) => {
        const own = new pg.Pool({ connectionString: URL, max: 3 })
        pools.push(own)
        // Racers of one process share group commit; the table is made once.
        return i === 0
          ? partitioned('race', `${interval}ms`, own)
          : new PostgresStore({ pool: own, table: `h3_race_${suffix}`, layout: 'partitioned', partitionInterval: `${interval}ms` })
      }),
    )
    const scope = `s-${randomUUID()}`
    const partitionsOfWinners = new Set<string>()
    for (let round = 0; round < 12; round++) {
      const key = `k-${round}`
      // Aim at the next boundary of the server's clock, then start callers from 6 ms before it to 5 ms after.
      const offset = (await serverNow(pool)) - Date.now()
      let boundary = slotOf(Date.now() + offset, interval) + interval
      if (boundary - (Date.now() + offset) < 20) boundary += interval
      const answers = await Promise.all(
        Array.from({ length: 12 }, async (_, i) => {
          await sleep(Math.max(0, boundary - 6 + i - (Date.now() + offset)))
          const store = racers[i % racers.length] as PostgresStore
          return store.acquire(scope, key, fp(i % 3 === 0 ? 'b' : 'a'), LEASE)
        }),
      )
      const winners = answers.filter((a: AcquireResult) => a.kind === 'acquired')
      expect(winners, `round ${round}: ${JSON.stringify(answers)}`).toHaveLength(1)
      for (const answer of answers) expect(['acquired', 'in_progress', 'mismatch']).toContain(answer.kind)
      const rows = await rowsOf(`h3_race_${suffix}`, scope, key)
      expect(rows).toHaveLength(1)
      partitionsOfWinners.add(rows[0]?.partition as string)
    }
    // The winners' rows are spread over many partitions: the callers really straddled boundaries.
    expect(partitionsOfWinners.size).toBeGreaterThan(1)
    await Promise.all(racers.slice(1).map((store) => store.close()))
  })

  it('a key used again after expiry: one of two concurrent acquires takes it, with the next token, in the partition of now', async () => {
    const store = await partitioned('reuse', '200ms')
    const scope = `s-${randomUUID()}`
    const first = (await store.acquire(scope, 'k', fp('a'), LEASE)) as { token: number }
    await store.complete(scope, 'k', first.token, sampleOutcome(), 50)
    const old = (await rowsOf(store.table, scope, 'k'))[0]
    // Past the record's expiry (its completion + 50 ms, which may fall after the boundary) and into a later partition.
    const after = Math.max(Number(old?.expires_at), slotOf(Number(old?.created_at), 200) + 250)
    while ((await serverNow(pool)) <= after) await sleep(20)
    const answers = await Promise.all([store.acquire(scope, 'k', fp('b'), LEASE), store.acquire(scope, 'k', fp('b'), LEASE)])
    expect(answers.map((a) => a.kind).sort()).toEqual(['acquired', 'in_progress'])
    expect(answers.find((a) => a.kind === 'acquired')).toEqual({ kind: 'acquired', token: 2 })
    const rows = await rowsOf(store.table, scope, 'k')
    expect(rows).toHaveLength(1)
    expect(rows[0]?.partition).not.toBe(old?.partition)
    expect((await store.get(scope, 'k'))?.attempts).toBe(1)
  })

  it('rotation drops each ended partition whose records all expired, keeps one holding a live record, and creates partitions ahead', async () => {
    const store = await partitioned('gc', '300ms')
    const scope = `s-${randomUUID()}`
    for (let i = 0; i < 5; i++) {
      const { token } = (await store.acquire(scope, `old-${i}`, fp('a'), LEASE)) as { token: number }
      await store.complete(scope, `old-${i}`, token, sampleOutcome(), 50)
    }
    const oldPartitions = new Set(
      (await pool.query(`SELECT DISTINCT tableoid::regclass::text AS p FROM "${store.table}"`)).rows.map((r) => r.p),
    )
    const keeperSlot = slotOf(await serverNow(pool), 300) + 300
    while ((await serverNow(pool)) < keeperSlot + 10) await sleep(20)
    const { token } = (await store.acquire(scope, 'keeper', fp('a'), LEASE)) as { token: number }
    await store.complete(scope, 'keeper', token, sampleOutcome(), 3_600_000)
    const keeper = (await rowsOf(store.table, scope, 'keeper'))[0]?.partition as string
    expect(oldPartitions.has(keeper)).toBe(false)
    while ((await serverNow(pool)) < slotOf(Number((await rowsOf(store.table, scope, 'keeper'))[0]?.created_at), 300) + 350) await sleep(20)

    const before = await serverNow(pool)
    const rotation = await store.rotatePartitions()
    const after = await serverNow(pool)
    for (const name of oldPartitions) expect(rotation.dropped).toContain(name)
    expect(rotation.dropped).not.toContain(keeper)
    const left = await listPartitions(pool, 'public', store.table)
    expect(left.map((p) => p.name)).toContain(keeper)
    // The rotation's own "now" lies between the two readings (and may be a slot past the first on a
    // loaded machine): it made the partition two slots ahead of it.
    const ahead = (ms: number) => slotOf(ms, 300) + 600
    expect(left.some((p) => p.fromMs >= ahead(before) && p.fromMs <= ahead(after))).toBe(true)
    expect(await store.get(scope, 'old-0')).toBeNull()
    expect((await store.acquire(scope, 'keeper', fp('a'), LEASE)).kind).toBe('replay')
    // Again at once: the keeper's partition stays (a loaded machine may have ended the empty partition of
    // the first rotation's "now" meanwhile, which this one may drop).
    const again = await store.rotatePartitions()
    expect(again.dropped).not.toContain(keeper)
    expect(again.dropped.every((name) => !left.slice(-2).some((p) => p.name === name))).toBe(true)
  })

  it("the store's gc loop rotates partitions on this layout: ended empty partitions are dropped, and new ones made ahead", async () => {
    const table = `h3_loop_${suffix}`
    tables.push(table)
    await new PostgresStore({ pool, table, layout: 'partitioned', partitionInterval: '100ms' }).migrate()
    const first = (await listPartitions(pool, 'public', table))[0]?.name as string
    const looping = new PostgresStore({ pool, table, layout: 'partitioned', partitionInterval: '100ms', gc: { interval: '50ms' } })
    try {
      // Until the loop has dropped the first partition (ended, no records) and made one past the first three.
      for (;;) {
        const names = (await listPartitions(pool, 'public', table)).map((p) => p.name)
        if (!names.includes(first) && names.length >= 3) break
        await sleep(25)
      }
    } finally {
      await looping.close()
    }
  })

  it('makes partitions ahead while a transaction writing records is open, and leaves a drop for the next round rather than queue traffic', async () => {
    const store = await partitioned('attach', '100ms')
    const before = await listPartitions(pool, 'public', store.table)
    const writer = await pool.connect()
    try {
      await writer.query('BEGIN')
      await writer.query(`LOCK TABLE "${store.table}" IN ROW EXCLUSIVE MODE`) // what a record's write holds until commit
      while ((await serverNow(pool)) < (before[0]?.toMs as number) + 20) await sleep(20)
      const rotation = await store.rotatePartitions()
      expect(rotation.created.length).toBeGreaterThan(0)
      expect(rotation.dropped).toEqual([])
      await writer.query('COMMIT')
    } finally {
      writer.release()
    }
    expect((await store.rotatePartitions()).dropped).toContain(before[0]?.name)
  })

  it('an insert past every partition made ahead (a missed rotation) creates the partition it needs', async () => {
    const store = await partitioned('missed', '100ms')
    const made = await listPartitions(pool, 'public', store.table)
    const last = made[made.length - 1]?.toMs as number
    while ((await serverNow(pool)) < last + 150) await sleep(25)
    const scope = `s-${randomUUID()}`
    expect(await store.acquire(scope, 'k', fp('a'), LEASE)).toEqual({ kind: 'acquired', token: 1 })
    expect((await rowsOf(store.table, scope, 'k'))[0]?.created_at).toBeDefined()
    expect((await listPartitions(pool, 'public', store.table)).length).toBeGreaterThan(made.length)
  })

  it('an insert past every partition waits out another transaction creating partitions, rather than fail', async () => {
    const store = await partitioned('repair', '100ms')
    const made = await listPartitions(pool, 'public', store.table)
    const last = made[made.length - 1]?.toMs as number
    while ((await serverNow(pool)) < last + 150) await sleep(25)
    // Another transaction holds the partitions' lock (a slow repair or rotation elsewhere) for longer
    // than the repair's lock_timeout (500 ms), then lets go without creating anything.
    const other = await pool.connect()
    await other.query('BEGIN')
    await lockPartitions(other, 'public', store.table)
    const released = sleep(800).then(async () => {
      await other.query('COMMIT')
      other.release()
    })
    const scope = `s-${randomUUID()}`
    const answer = await store.acquire(scope, 'k', fp('a'), LEASE).catch((error: unknown) => error)
    await released
    expect(answer).toEqual({ kind: 'acquired', token: 1 })
    expect((await listPartitions(pool, 'public', store.table)).length).toBeGreaterThan(made.length)
  })

  it('converts a plain table to partitions and back with every record kept, tokens and steps included', async () => {
    const table = `h3_convert_${suffix}`
    tables.push(table)
    const plain = new PostgresStore({ pool, table })
    const parted = new PostgresStore({ pool, table, layout: 'partitioned', partitionInterval: '1h' })
    await plain.migrate()
    const scope = `s-${randomUUID()}`
    for (let i = 0; i < 3; i++) {
      const { token } = (await plain.acquire(scope, `done-${i}`, fp('a'), LEASE)) as { token: number }
      await plain.complete(scope, `done-${i}`, token, sampleOutcome(), 3_600_000)
    }
    const running = (await plain.acquire(scope, 'running', fp('a'), LEASE)) as { token: number }
    await plain.recordStep(scope, 'running', running.token, 'charge', '"ch_1"')
    const before = await plain.list({ scope, includeExpired: true })

    const refused = await parted.migrate().catch((error: unknown) => error)
    expect(isIdempotencyError(refused) && refused.code).toBe('STORE_SCHEMA')
    expect(await parted.convertLayout()).toEqual({ from: 'plain', to: 'partitioned', records: 4 })
    expect(await parted.convertLayout()).toEqual({ from: 'partitioned', to: 'partitioned', records: 0 })
    await parted.migrate()
    expect(await parted.list({ scope, includeExpired: true })).toEqual(before)
    expect((await parted.acquire(scope, 'done-1', fp('a'), LEASE)).kind).toBe('replay')
    expect((await parted.acquire(scope, 'running', fp('a'), LEASE)).kind).toBe('in_progress')
    expect(await parted.complete(scope, 'running', running.token, sampleOutcome(), 3_600_000)).toBe(true)

    const after = await parted.list({ scope, includeExpired: true })
    expect(await plain.convertLayout()).toEqual({ from: 'partitioned', to: 'plain', records: 4 })
    await plain.migrate()
    expect(await plain.list({ scope, includeExpired: true })).toEqual(after)
    expect((await plain.acquire(scope, 'running', fp('b'), LEASE)).kind).toBe('mismatch')
    const kind = (await pool.query(`SELECT relkind FROM pg_class WHERE relname = $1`, [table])).rows[0].relkind
    expect(kind).toBe('r')
  })
})
