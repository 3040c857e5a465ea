/**
 * PostgresStore at scale (issue 27 item 3; docs/scale.md, "PostgreSQL at scale"):
 *  - fills a partitioned table (`layout: 'partitioned'`, 1-day partitions) with `--rows` completed
 *    records spread over `--days` daily partitions (one partition = one day's rows), with SQL straight
 *    into the parent (bench/pg-fill.ts), then ANALYZE; reports the fill time and bytes per record;
 *  - acquire (new key) and replay p50/p99 through the real store on the filled table against an empty
 *    partitioned table, in alternating blocks;
 *  - expiring one day: the store's `rotatePartitions()` dropping the oldest day's partition (time and
 *    WAL bytes) against the plain layout's batched DELETE of the same rows (`purgeExpired(1000)` until a
 *    batch comes back short, as the gc loop does; a plain table filled with the same rows), then its VACUUM;
 *  - sustained new keys (acquire + complete) at `--rate` per second for `--sustain-seconds` on the
 *    filled table, through the store alone: achieved rate, p50/p99, whether it kept up;
 *  - the extrapolation to 4.32 x 10^8 records a day (5,000 new keys/s) from the measured figures.
 * The timeline: the oldest day's records have all expired (so exactly that partition is droppable,
 * and exactly those rows are what the plain table's purge deletes); every later record is live.
 * Records expire (days - 1) days after creation, and each day's rows fall within the part of the day
 * elapsed so far (UTC), so no record is created in the future.
 * Refuses a fill that would leave less than 20 GB free on /work. Tables are named idemkey_scale_<pid>_*
 * and dropped at the end, also on failure or Ctrl-C.
 * Needs PostgreSQL on 127.0.0.1:5432 (user root, database test), or PG_URL; `CHECKPOINT` needs a superuser
 * (or pg_checkpoint) and is skipped, said, without.
 * Options: --rows N (1,000,000), --days D (3, at least 2), --sustain-seconds S (60), --rate R (5,000),
 * --samples per latency measure and table (2,000), --blocks (4), --body bytes (256), --producers (rate / 10, at least 64),
 * --batch the purge's batch size (1,000, the gc loop's default).
 * Default (a few minutes): npx tsx bench/scale.bench.ts
 * The full measurement: npx tsx bench/scale.bench.ts --rows 100000000 --days 3 --sustain-seconds 600 --rate 5000
 */
import { execFileSync } from 'node:child_process'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { createPartitions, listPartitions, lockPartitions, partitionName, serverNow, slotOf } from '../src/backends/postgres/partitions.js'
import { inTransaction } from '../src/backends/postgres/rotation.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import type { Outcome } from '../src/core/store.js'
import { fmt, numberArg, percentile, report, steadyLoad, table } from './lib.js'
import { alternatingBlocks, dayTimeline, fillCompleted, firstRowOfDay, keyOf, latencies, scopeOf, walDuring } from './pg-fill.js'

const ROWS = numberArg('rows', 1_000_000)
const DAYS = numberArg('days', 3)
const SUSTAIN_S = numberArg('sustain-seconds', 60)
const SAMPLES = numberArg('samples', 2_000)
const BLOCKS = numberArg('blocks', 4)
const BODY = numberArg('body', 256)
const RATE = numberArg('rate', 5_000)
// Enough producers for a cycle to take up to 100 ms before the offered rate falls behind (Little's
// law), so "kept up" is a property of the store, not of too few callers.
const PRODUCERS = numberArg('producers', Math.max(64, Math.ceil(RATE / 10)))
const BATCH = numberArg('batch', 1_000)
const TARGET_PER_DAY = 4.32e8
const DAY = 86_400_000
const MIN_FREE = 20 * 1024 ** 3
const URL = process.env.PG_URL ?? 'postgres://root@127.0.0.1:5432/test'
const COMMAND = `npx tsx bench/scale.bench.ts --rows ${ROWS} --days ${DAYS} --sustain-seconds ${SUSTAIN_S} --rate ${RATE} --samples ${SAMPLES}`

const PREFIX = `idemkey_scale_${process.pid}`
const FILLED = `${PREFIX}_part`
const EMPTY = `${PREFIX}_empty`
const PLAIN = `${PREFIX}_plain`
const fp = fingerprintOf({ amount: 100 })
const headers = JSON.stringify({ 'content-type': 'application/json' })
const outcome: Outcome = {
  status: 'completed',
  response: { status: 201, headers: { 'content-type': 'application/json' }, body: new TextEncoder().encode('x'.repeat(BODY)) },
}

const pool = new pg.Pool({ connectionString: URL, max: 20 })
const filled = new PostgresStore({ pool, table: FILLED, layout: 'partitioned', partitionInterval: '1d' })
const empty = new PostgresStore({ pool, table: EMPTY, layout: 'partitioned', partitionInterval: '1d' })
const plain = new PostgresStore({ pool, table: PLAIN })

/** Refuses a fill that would leave less than 20 GB free, saying how large a fill would fit. */
function checkDisk(): string {
  const avail = Number(execFileSync('df', ['-B1', '--output=avail', '/work'], { encoding: 'utf8' }).trim().split('\n').pop())
  // Both tables, with room for the WAL the fill writes before checkpoints recycle it: a generous guess.
  const perRow = (BODY + 600) * 2 * 1.2
  const needed = ROWS * perRow
  if (avail - needed < MIN_FREE) {
    throw new Error(
      `refusing to fill ${fmt(ROWS)} rows: about ${fmt(needed / 1024 ** 3, 1)} GiB needed (partitioned and plain tables), ${fmt(avail / 1024 ** 3, 1)} GiB free on /work, and at least 20 GiB must stay free. The largest fill this disk allows is about --rows ${fmt(Math.max(0, (avail - MIN_FREE) / perRow))}.`,
    )
  }
  return `${fmt(avail / 1024 ** 3, 1)} GiB free on /work before the fill`
}

const firstRowOf = (p: number) => firstRowOfDay(p, ROWS, DAYS)

async function fill(target: string, firstDay: number, elapsedMs: number): Promise<number> {
  let seconds = 0
  for (let p = 0; p < DAYS; p++) {
    seconds += await fillCompleted(pool, `"${target}"`, {
      from: firstRowOf(p),
      to: firstRowOf(p + 1) - 1,
      fingerprint: fp,
      headers,
      body: BODY,
      ...dayTimeline(ROWS, DAYS, firstDay, elapsedMs),
    })
    console.log(`  ${target}: day ${p + 1} of ${DAYS} filled (${fmt(seconds)} s so far)`)
  }
  const started = performance.now()
  await pool.query(`ANALYZE "${target}"`)
  return seconds + (performance.now() - started) / 1_000
}

/** Heap, TOAST and indexes of the table, over all its partitions. */
async function bytesOf(target: string): Promise<number> {
  const parts = await listPartitions(pool, 'public', target)
  const names = parts.length > 0 ? parts.map((p) => p.name) : [target]
  const { rows } = await pool.query(`SELECT sum(pg_total_relation_size(quote_ident(n)))::bigint AS bytes FROM unnest($1::text[]) n`, [
    names,
  ])
  return Number(rows[0].bytes)
}

async function checkpoint(): Promise<string> {
  return pool.query('CHECKPOINT').then(
    () => 'after a CHECKPOINT',
    (error: unknown) => `without CHECKPOINT (${(error as Error).message})`,
  )
}

/** WAL the server writes in one idle second: what other sessions add to a server-wide WAL figure. */
async function backgroundWal(): Promise<number> {
  return (await walDuring(pool, () => new Promise((resolve) => setTimeout(resolve, 1_000)))).walBytes
}

function newKeys(store: PostgresStore, label: string) {
  return (block: number) =>
    latencies(Math.ceil(SAMPLES / BLOCKS), async (i) => {
      const answer = await store.acquire(`new-${label}-${block}`, `k-${i}`, fp, 30_000)
      if (answer.kind !== 'acquired') throw new Error(`expected a new key, got ${answer.kind}`)
    })
}

function replays(store: PostgresStore, pick: () => [string, string]) {
  return () =>
    latencies(Math.ceil(SAMPLES / BLOCKS), async () => {
      const [scope, key] = pick()
      const answer = await store.acquire(scope, key, fp, 30_000)
      if (answer.kind !== 'replay') throw new Error(`expected a replay of ${scope}/${key}, got ${answer.kind}`)
    })
}

async function cycle(store: PostgresStore, scope: string, key: string): Promise<void> {
  const acquired = await store.acquire(scope, key, fp, 30_000)
  if (acquired.kind !== 'acquired') throw new Error(`expected a new key, got ${acquired.kind}`)
  if (!(await store.complete(scope, key, acquired.token, outcome, 86_400_000))) throw new Error('complete refused')
}

let cleaned: Promise<void> | undefined
function cleanUp(): Promise<void> {
  cleaned ??= (async () => {
    for (const store of [filled, empty, plain]) await store.close().catch(() => {})
    await pool.query(`DROP TABLE IF EXISTS "${FILLED}", "${EMPTY}", "${PLAIN}" CASCADE`).catch((error: unknown) => {
      console.error(`could not drop ${PREFIX}_* tables: ${(error as Error).message}; drop them by hand`)
    })
    await pool.end().catch(() => {})
  })()
  return cleaned
}
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    console.error(`${signal}: dropping ${PREFIX}_* tables`)
    void cleanUp().finally(() => process.exit(130))
  })
}

const ms = (v: number) => fmt(v, 2)
const mib = (bytes: number) => fmt(bytes / 1024 ** 2, 1)

try {
  if (DAYS < 2 || !Number.isInteger(DAYS))
    throw new Error('--days must be a whole number of at least 2 (the oldest day is the one expired)')
  const disk = checkDisk()
  for (const store of [filled, empty, plain]) await store.migrate()
  const now = await serverNow(pool)
  const today = slotOf(now, DAY)
  const firstDay = today - (DAYS - 1) * DAY
  const elapsedMs = Math.max(1, now - today)
  // The past days' partitions, as rotation would have made them (migrate made today's and two ahead).
  await inTransaction(pool, async (tx) => {
    await lockPartitions(tx, 'public', FILLED)
    await createPartitions(
      tx,
      'public',
      FILLED,
      DAY,
      Array.from({ length: DAYS - 1 }, (_, p) => firstDay + p * DAY),
    )
  })
  console.log(`filling ${fmt(ROWS)} rows over ${DAYS} days (${disk})`)
  const fillPartS = await fill(FILLED, firstDay, elapsedMs)
  const partBytes = await bytesOf(FILLED)
  const fillPlainS = await fill(PLAIN, firstDay, elapsedMs)
  const plainBytes = await bytesOf(PLAIN)
  const partitions = (await listPartitions(pool, 'public', FILLED)).length
  const emptyPartitions = (await listPartitions(pool, 'public', EMPTY)).length
  const afterFill = await checkpoint()

  // Latency: new keys and replays, filled against empty, in alternating blocks.
  for (let i = 0; i < 100; i++) await cycle(empty, 'replay', `r-${i}`)
  const firstLive = firstRowOf(1)
  const liveRow = () => firstLive + Math.floor(Math.random() * (ROWS - firstLive))
  console.log('measuring acquire and replay latency')
  const lat = await alternatingBlocks(BLOCKS, {
    newEmpty: newKeys(empty, 'empty'),
    newFilled: newKeys(filled, 'filled'),
    replayEmpty: replays(empty, () => ['replay', `r-${Math.floor(Math.random() * 100)}`]),
    replayFilled: replays(filled, () => {
      const i = liveRow()
      return [scopeOf(i), keyOf(i)]
    }),
  })

  // Expiry of the oldest day: a partition drop against the plain layout's batched DELETE.
  console.log('measuring expiry of one day')
  const dayRows = firstRowOf(1)
  const bgWal = await backgroundWal()
  const dropCheckpoint = await checkpoint()
  const drop = await walDuring(pool, () => filled.rotatePartitions())
  const expected = partitionName(FILLED, firstDay)
  if (drop.result.dropped.length !== 1 || drop.result.dropped[0] !== expected) {
    throw new Error(`expected rotation to drop ${expected} alone, it dropped [${drop.result.dropped.join(', ')}]`)
  }
  await checkpoint()
  let batches = 0
  const purge = await walDuring(pool, async () => {
    let deleted = 0
    for (;;) {
      const n = await plain.purgeExpired(BATCH)
      deleted += n
      batches++
      if (n < BATCH) return deleted
    }
  })
  const vacuum = await walDuring(pool, () => pool.query(`VACUUM "${PLAIN}"`))

  // Sustained new keys through the store alone, on the filled table.
  console.log(`sustaining ${fmt(RATE)} new keys/s for ${SUSTAIN_S} s`)
  const cycles: number[] = []
  const load = await steadyLoad(
    RATE,
    SUSTAIN_S,
    async (i) => {
      const start = performance.now()
      await cycle(filled, 'sustained', `s-${i}`)
      cycles.push(performance.now() - start)
    },
    PRODUCERS,
  )
  // Producers issue on a schedule and wait for each call: one that falls behind issues fewer.
  const offered = RATE * SUSTAIN_S
  const keptUp = load.produced >= 0.99 * offered

  const perRecord = partBytes / ROWS
  const line = (label: string, v: number[]) => [label, ms(percentile(v, 50)), ms(percentile(v, 99)), fmt(v.length)]
  const dropPerRow = { s: drop.seconds / dayRows, wal: drop.walBytes / dayRows }
  const purgePerRow = { s: purge.seconds / purge.result, wal: purge.walBytes / purge.result }
  const vacuumPerRow = { s: vacuum.seconds / purge.result, wal: vacuum.walBytes / purge.result }
  const dayGiB = (perRecord * TARGET_PER_DAY) / 1024 ** 3
  report(
    'scale',
    'PostgresStore at scale: a filled partitioned table, expiry of a day, sustained new keys',
    COMMAND,
    `${ROWS < 1e8 ? `**A run of ${fmt(ROWS)} rows, below the full measurement's 10^8 (docs/scale.md): its figures show the method, not the scale.**\n\n` : ''}${fmt(ROWS)} completed records (${BODY}-byte JSON bodies, UUID keys over 1,000 scopes) over ${DAYS} daily partitions of \`layout: 'partitioned'\`, filled with one INSERT … SELECT generate_series per day into the parent, then ANALYZE; the same rows in a plain-layout table. ${disk}. Server: PostgreSQL on the same machine, shared with other sessions.

${table(
  ['table', 'fill + ANALYZE s', 'bytes', 'bytes per record'],
  [
    [`partitioned, ${partitions} partitions`, fmt(fillPartS, 1), fmt(partBytes), fmt(perRecord)],
    ['plain', fmt(fillPlainS, 1), fmt(plainBytes), fmt(plainBytes / ROWS)],
  ],
)}

### Acquire and replay, filled against empty

One caller, ${BLOCKS} alternating blocks of ${fmt(Math.ceil(SAMPLES / BLOCKS))} per measure (${afterFill.replace('after', 'after the fill,')}). A new key's acquire writes into the partition of now (on the filled table, one holding a day's rows); a replay on the filled table reads a random live record of the fill, on the empty one one of 100 records just written. The filled table has ${partitions} partitions (each lookup probes each), the empty one ${emptyPartitions}.

${table(
  ['measure', 'p50 ms', 'p99 ms', 'samples'],
  [
    line('acquire, new key, empty table', lat.newEmpty),
    line(`acquire, new key, ${fmt(ROWS)} rows`, lat.newFilled),
    line('replay, empty table', lat.replayEmpty),
    line(`replay, ${fmt(ROWS)} rows`, lat.replayFilled),
  ],
)}

p99 ratios (filled / empty): acquire ${fmt(percentile(lat.newFilled, 99) / percentile(lat.newEmpty, 99), 2)}x, replay ${fmt(percentile(lat.replayFilled, 99) / percentile(lat.replayEmpty, 99), 2)}x.

### Expiring one day (${fmt(dayRows)} records)

Each ${dropCheckpoint}. WAL is server-wide (\`pg_current_wal_insert_lsn()\` before and after), so it includes other sessions' writes meanwhile: the server wrote ${fmt(bgWal)} bytes in an idle second just before.

${table(
  ['operation', 'seconds', 'WAL bytes', 'per record: µs', 'per record: WAL bytes'],
  [
    [
      'partitioned: `rotatePartitions()` drops the day',
      fmt(drop.seconds, 3),
      fmt(drop.walBytes),
      fmt(dropPerRow.s * 1e6, 3),
      fmt(dropPerRow.wal, 3),
    ],
    [
      `plain: \`purgeExpired(${BATCH})\` x ${fmt(batches)} (${fmt(purge.result)} rows)`,
      fmt(purge.seconds, 3),
      fmt(purge.walBytes),
      fmt(purgePerRow.s * 1e6, 3),
      fmt(purgePerRow.wal, 1),
    ],
    ['plain: then `VACUUM`', fmt(vacuum.seconds, 3), fmt(vacuum.walBytes), fmt(vacuumPerRow.s * 1e6, 3), fmt(vacuumPerRow.wal, 1)],
  ],
)}

### Sustained new keys

Acquire + complete of new keys on the filled table, through the store alone (group commit on, pool of 20, ${PRODUCERS} producers, each waiting for its cycle), offered ${fmt(RATE)}/s for ${SUSTAIN_S} s (${fmt(offered)} cycles): ${fmt(load.produced)} issued on schedule (${fmt((100 * load.produced) / offered, 1)}%), all done in ${fmt(load.elapsedMs / 1_000, 1)} s (${fmt(load.achieved)}/s); cycle p50 ${ms(percentile(cycles, 50))} ms, p99 ${ms(percentile(cycles, 99))} ms: ${keptUp ? 'kept up' : 'did NOT keep up'} (the test: at least 99% of the offered cycles issued on schedule; producers wait for each cycle, so a store that falls behind issues fewer).

### On paper: 4.32 x 10^8 records a day (5,000 new keys/s, 24 h window)

From the figures above (${fmt(perRecord)} bytes per record on the partitioned layout). A drop's cost is catalog work and unlinking the partition's files, which does not grow with its rows (it is shown as measured, not scaled); the DELETE and its VACUUM touch every row, so they are scaled by rows: a lower bound when the measured table's indexes fit in memory and those of 4.32 x 10^8 records do not.

${table(
  ['quantity', 'at 4.32 x 10^8 records'],
  [
    ['one day of records (one partition)', `${fmt(dayGiB, 1)} GiB`],
    ['held on disk (24 h TTL, 1 d partitions: about 3 days)', `${fmt(dayGiB * 3, 1)} GiB`],
    ['expiring a day by partition drop', `${fmt(drop.seconds, 3)} s, ${mib(drop.walBytes)} MiB WAL (as measured)`],
    [
      'expiring a day by batched DELETE (plain)',
      `${fmt(purgePerRow.s * TARGET_PER_DAY)} s (${fmt((100 * purgePerRow.s * TARGET_PER_DAY) / 86_400, 1)}% of a day), ${fmt((purgePerRow.wal * TARGET_PER_DAY) / 1024 ** 3, 1)} GiB WAL`,
    ],
    ['… and its VACUUM', `${fmt(vacuumPerRow.s * TARGET_PER_DAY)} s, ${fmt((vacuumPerRow.wal * TARGET_PER_DAY) / 1024 ** 3, 1)} GiB WAL`],
  ],
)}`,
  )
} finally {
  await cleanUp()
}
