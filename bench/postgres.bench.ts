/**
 * PostgresStore benchmark, all measured side by side in one run on one pool:
 *  - acquire+complete cycles/s and replays/s at 1, 10 and 50 concurrent callers, with group commit
 *    (the default) and without (`groupCommit: false`), beside "raw pg, same SQL" (the store's two
 *    single statements sent straight through pg, prepared the same way, one operation at a time: the
 *    gap is the library's own cost, or its batching's gain) and "raw pg, minimal SQL" (a plain
 *    INSERT and UPDATE per cycle, one SELECT by primary key per replay, none of the guarantees);
 *  - wake-up latency: a waiting Ledger on a second pool, from the holder's complete() to the waiter's
 *    answer (LISTEN/NOTIFY);
 *  - bytes per stored row (heap, TOAST and indexes) for a typical small JSON response;
 *  - optional (`--rows N`, e.g. 10000000): acquire p50/p99 on a table of N rows beside an empty one.
 * Needs PostgreSQL on 127.0.0.1:5432 (user root, database test), or PG_URL.
 * Run alone: npx tsx bench/postgres.bench.ts [--ms 1500] [--rows 10000000]
 * Throughput only, at chosen callers, in under a minute (written to docs/benchmarks/postgres-throughput.md):
 *   npx tsx bench/postgres.bench.ts --throughput-only --callers 50 --ms 3000
 */
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { statements } from '../src/backends/postgres/statements.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import { Ledger } from '../src/core/ledger.js'
import type { Outcome } from '../src/core/store.js'
import { fmt, numberArg, opsPerSecond, percentile, report, table } from './lib.js'
import { alternatingBlocks, fillCompleted, latencies } from './pg-fill.js'

const MS = numberArg('--ms', 1_500)
const BIG_ROWS = numberArg('--rows', 0)
const THROUGHPUT_ONLY = process.argv.includes('--throughput-only')
const callersAt = process.argv.indexOf('--callers')
const CALLERS =
  callersAt > 0
    ? String(process.argv[callersAt + 1])
        .split(',')
        .map(Number)
    : [1, 10, 50]
const URL = process.env.PG_URL ?? 'postgres://root@127.0.0.1:5432/test'
const TABLE = `idemkey_bench_${process.pid}`
const BIG = `idemkey_bench_big_${process.pid}`
const FRESH = `idemkey_bench_fresh_${process.pid}`
const RETENTION_MS = 24 * 3_600_000
const fp = fingerprintOf({ amount: 100 })
const body = new TextEncoder().encode('{"id":"ch_1","amount":100,"currency":"eur","status":"succeeded"}')
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: { 'content-type': 'application/json' }, body } }
const headers = JSON.stringify(outcome.response.headers)

const pool = new pg.Pool({ connectionString: URL, max: 20 })
const store = new PostgresStore({ pool, table: TABLE })
/** The same table through a store that sends one statement per operation. */
const single = new PostgresStore({ pool, table: TABLE, groupCommit: false })
const sql = statements('public', TABLE)
const q = (s: { name: string; text: string }, values: unknown[]) => pool.query({ name: s.name, text: s.text, values })

/** The two statements PostgresStore sends for a new key, with no library code around them. */
async function rawSameCycle(scope: string, key: string): Promise<void> {
  const { rows } = await q(sql.acquire, [scope, key, fp, 30_000, RETENTION_MS, false])
  if (rows[0]?.taken == null) throw new Error('expected a new key')
  await q(sql.complete, [scope, key, TABLE, rows[0].taken, 'completed', 201, headers, Buffer.from(body), null, 3_600_000])
}

const MINIMAL_INSERT = {
  name: 'bench_min_insert',
  text: `INSERT INTO "${TABLE}" (scope, "key", fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at)
    VALUES ($1, $2, $3, 'in_progress', 1, $4, 1, $5, $5, $6)`,
}
const MINIMAL_COMPLETE = {
  name: 'bench_min_complete',
  text: `UPDATE "${TABLE}" SET status = 'completed', locked_until = NULL, response_status = 201, response_headers = $1,
    response_body = $2, expires_at = $3 WHERE scope = $4 AND "key" = $5 AND token = 1`,
}
const MINIMAL_SELECT = { name: 'bench_min_select', text: `SELECT * FROM "${TABLE}" WHERE scope = $1 AND "key" = $2` }

async function rawMinimalCycle(scope: string, key: string): Promise<void> {
  const now = Date.now()
  await pool.query({ ...MINIMAL_INSERT, values: [scope, key, fp, now + 30_000, now, now + RETENTION_MS] })
  await pool.query({ ...MINIMAL_COMPLETE, values: [headers, Buffer.from(body), now + 3_600_000, scope, key] })
}

async function measure(concurrency: number, ms = MS): Promise<{ rows: Array<Array<string | number>>; ratios: string[] }> {
  const scope = `bench-${Date.now()}-${concurrency}`
  let round = 0
  const cycle = (on: PostgresStore, prefix: string) => async (i: number) => {
    const key = `${prefix}-${round}-${i}`
    const acquired = await on.acquire(scope, key, fp, 30_000)
    if (acquired.kind !== 'acquired') throw new Error(`expected acquired, got ${acquired.kind}`)
    if (!(await on.complete(scope, key, acquired.token, outcome, 3_600_000))) throw new Error('complete refused')
  }
  const replay = (on: PostgresStore) => async () => {
    const answer = await on.acquire(scope, 'c-0', fp, 30_000)
    if (answer.kind !== 'replay') throw new Error(`expected replay, got ${answer.kind}`)
  }
  const rawReplay = () => q(sql.acquire, [scope, 'c-0', fp, 30_000, RETENTION_MS, false])
  // Store and raw alternate in short rounds, so a busy neighbour hurts both alike.
  const ROUNDS = 4
  const slice = ms / ROUNDS
  let [storeCycles, singleCycles, sameCycles, storeReplays, singleReplays, sameReplays] = [0, 0, 0, 0, 0, 0]
  // The replay target: one completed key.
  const first = (await store.acquire(scope, 'c-0', fp, 30_000)) as { token: number }
  await store.complete(scope, 'c-0', first.token, outcome, 3_600_000)
  for (round = 0; round < ROUNDS; round++) {
    // Which goes first rotates too.
    const rotated = async (runs: Array<() => Promise<number>>) => {
      const out: number[] = []
      for (let k = 0; k < runs.length; k++) {
        const at = (k + round) % runs.length
        out[at] = await (runs[at] as () => Promise<number>)()
      }
      return out as [number, number, number]
    }
    const [c1, c2, c3] = await rotated([
      () => opsPerSecond(cycle(store, 'c'), slice, concurrency),
      () => opsPerSecond(cycle(single, 'o'), slice, concurrency),
      () => opsPerSecond((i) => rawSameCycle(scope, `s-${round}-${i}`), slice, concurrency),
    ])
    const [r1, r2, r3] = await rotated([
      () => opsPerSecond(replay(store), slice, concurrency),
      () => opsPerSecond(replay(single), slice, concurrency),
      () => opsPerSecond(rawReplay, slice, concurrency),
    ])
    storeCycles += c1 / ROUNDS
    singleCycles += c2 / ROUNDS
    sameCycles += c3 / ROUNDS
    storeReplays += r1 / ROUNDS
    singleReplays += r2 / ROUNDS
    sameReplays += r3 / ROUNDS
  }
  const ledger = new Ledger({ store })
  const ledgerCycles = await opsPerSecond(
    async (i) => {
      const result = await ledger.run({ key: `l-${i}`, scope, fingerprint: fp }, () => ({ id: i }))
      if (result.kind !== 'executed') throw new Error(`expected executed, got ${result.kind}`)
    },
    ms,
    concurrency,
  )
  const minimalCycles = await opsPerSecond((i) => rawMinimalCycle(scope, `m-${i}`), ms, concurrency)
  const minimalReplays = await opsPerSecond(() => pool.query({ ...MINIMAL_SELECT, values: [scope, 'c-0'] }), ms, concurrency)
  const pct = (a: number, b: number) => `${fmt((100 * a) / b)}%`
  const x = (a: number, b: number) => `${fmt(a / b, 2)}x`
  return {
    rows: [
      ['PostgresStore', concurrency, fmt(storeCycles), fmt(storeReplays), fmt(ledgerCycles)],
      ['PostgresStore, groupCommit: false', concurrency, fmt(singleCycles), fmt(singleReplays), '-'],
      ['raw pg, same SQL', concurrency, fmt(sameCycles), fmt(sameReplays), '-'],
      ['raw pg, minimal SQL', concurrency, fmt(minimalCycles), fmt(minimalReplays), '-'],
    ],
    ratios: [
      String(concurrency),
      pct(storeCycles, sameCycles),
      pct(storeReplays, sameReplays),
      pct(singleCycles, sameCycles),
      pct(singleReplays, sameReplays),
      x(storeCycles, singleCycles),
      x(storeReplays, singleReplays),
    ],
  }
}

/** From the holder's complete() to the answer of a Ledger waiting on another pool. */
async function wakeUps(samples: number): Promise<number[]> {
  const waiterStore = new PostgresStore({ connectionString: URL, table: TABLE, max: 4 })
  const latencies: number[] = []
  try {
    for (let i = 0; i < samples; i++) {
      const scope = `wake-${Date.now()}`
      const held = await store.acquire(scope, 'k', fp, 30_000)
      if (held.kind !== 'acquired') throw new Error('expected acquired')
      let waiting = () => {}
      const isWaiting = new Promise<void>((resolve) => {
        waiting = resolve
      })
      const ledger = new Ledger({ store: waiterStore, wait: '10s', onEvent: (e) => e.type === 'waiting' && waiting() })
      const answered = ledger.run({ scope, key: 'k', fingerprint: fp }, () => 'ran').then(() => performance.now())
      await isWaiting
      // Past the first poll (20 ms): what is left to wake the waiter is the notification.
      await new Promise((resolve) => setTimeout(resolve, 30 + Math.random() * 20))
      const start = performance.now()
      await store.complete(
        scope,
        'k',
        held.token,
        { ...outcome, response: { ...outcome.response, body: new TextEncoder().encode('1') } },
        60_000,
      )
      latencies.push((await answered) - start)
    }
  } finally {
    await waiterStore.close()
  }
  return latencies
}

async function bytesPerRow(rows: number): Promise<number> {
  const name = `${TABLE}_size`
  const sizer = new PostgresStore({ pool, table: name })
  await sizer.migrate()
  try {
    // Completed records as the store writes them: a UUID key, a 64-character fingerprint, JSON headers and body.
    await pool.query(
      `INSERT INTO "${name}" (scope, "key", fingerprint, status, token, locked_until, response_status, response_headers,
        response_body, resource_id, attempts, created_at, updated_at, expires_at)
       SELECT 'tenant-42', gen_random_uuid()::text, $1, 'completed', 1, NULL, 201, $2, $3, 'ch_' || i, 1, 0, 0, 86400000 + i
       FROM generate_series(1, $4) i`,
      [fp, headers, Buffer.from(body), rows],
    )
    await pool.query(`VACUUM ANALYZE "${name}"`)
    const { rows: size } = await pool.query(`SELECT pg_total_relation_size($1)::bigint AS bytes`, [`"${name}"`])
    return Number(size[0].bytes) / rows
  } finally {
    await pool.query(`DROP TABLE IF EXISTS "${name}"`)
  }
}

/** Acquire latency of new keys (sequential, one caller) on `on`, `samples` of them. */
function acquireLatency(on: PostgresStore, samples: number, label: string): Promise<number[]> {
  const scope = `lat-${label}-${Date.now()}`
  return latencies(samples, (i) => on.acquire(scope, `k-${i}`, fp, 30_000))
}

/**
 * Acquire latency on a table of `rows` rows beside a fresh one, side by side: after the load, a
 * CHECKPOINT (so the load's dirty pages are not still being written), then alternating blocks on the
 * two tables, so whatever else the server does falls on both alike.
 */
async function bigTable(rows: number): Promise<string> {
  const big = new PostgresStore({ pool, table: BIG })
  const fresh = new PostgresStore({ pool, table: FRESH })
  await big.migrate()
  await fresh.migrate()
  const started = performance.now()
  await fillCompleted(pool, `"${BIG}"`, {
    from: 1,
    to: rows,
    fingerprint: fp,
    headers,
    body,
    createdAt: '0',
    expiresAt: '9000000000000 + i',
  })
  await pool.query(`VACUUM ANALYZE "${BIG}"`)
  const fillS = (performance.now() - started) / 1_000
  const checkpoint = await pool.query('CHECKPOINT').then(
    () => 'then a CHECKPOINT',
    (error: unknown) => `no CHECKPOINT (${(error as Error).message})`,
  )
  const samples = await alternatingBlocks(6, {
    fresh: (block) => acquireLatency(fresh, 500, `fresh-${block}`),
    big: (block) => acquireLatency(big, 500, `big-${block}`),
  })
  const line = (label: string, v: number[]) => [label, fmt(percentile(v, 50), 2), fmt(percentile(v, 99), 2)]
  return `Acquire of a new key, one caller, 3,000 samples on each table in alternating blocks of 500, on \`${BIG}\` and a fresh table (both dropped after); filling ${fmt(rows)} rows with one INSERT … SELECT generate_series (bench/pg-fill.ts) and VACUUM ANALYZE took ${fmt(fillS)} s, ${checkpoint}.\n\n${table(
    ['table', 'p50 ms', 'p99 ms'],
    [line('fresh (empty before the samples)', samples.fresh), line(`${fmt(rows)} rows`, samples.big)],
  )}\n\np99 ratio (full / fresh): ${fmt(percentile(samples.big, 99) / percentile(samples.fresh, 99), 2)}x (target: at most 1.5x).`
}

try {
  await store.migrate()
  const { rows: info } = await pool.query(`SELECT version() AS v, current_setting('synchronous_commit') AS sync`)
  await measure(10, 400)
  const rows: Array<Array<string | number>> = []
  const ratios: string[][] = []
  for (const concurrency of CALLERS) {
    const result = await measure(concurrency)
    rows.push(...result.rows)
    ratios.push(result.ratios)
  }
  const server = `Server: ${String(info[0].v).split(' on ')[0]}, synchronous_commit=${info[0].sync}, on the same machine; pool of 20 connections.`
  const throughput = `${table(['path', 'callers', 'acquire+complete cycles/s', 'replays/s', 'Ledger.run cycles/s'], rows)}

PostgresStore as a share of "raw pg, same SQL" (target: at least 85%; the issue's target for group commit at 50 callers: cycles at least 150%), with group commit (the default) and without, and group commit on / off:

${table(['callers', 'cycles', 'replays', 'cycles, off', 'replays, off', 'cycles on / off', 'replays on / off'], ratios)}

A cycle is one \`acquire\` of a new key and one \`complete\` of it: two round trips, two commits for one caller alone. A replay is one round trip and a plain read. With group commit (the default), the acquires (and the completes, and the replays' reads) that concurrent callers issue while one of their kind is in flight go out together when it returns, as one statement and one commit; \`groupCommit: false\` sends one statement per operation. "raw pg, same SQL" sends the store's two single statements through \`pool.query\` as the same named prepared statements, one operation at a time, in four rounds that rotate with both stores (which goes first rotates too), so the gap to it is the library's own cost (or, with group commit, its gain); "raw pg, minimal SQL" is a plain INSERT and UPDATE per cycle and a SELECT by primary key per replay, with none of the guarantees (no server clock, no fencing, no NOTIFY). The server shares the 2-core machine with the benchmark (and, on the recording machine, with other sessions' work): compare rows of one run, not runs; the figures are indicative.`
  if (THROUGHPUT_ONLY) {
    report(
      'postgres-throughput',
      'PostgresStore throughput, group commit on and off',
      `npx tsx bench/postgres.bench.ts --throughput-only --callers ${CALLERS.join(',')} --ms ${MS}`,
      `${server}\n\n${throughput}`,
    )
  } else {
    const wake = await wakeUps(150)
    const perRow = await bytesPerRow(100_000)
    const big = BIG_ROWS > 0 ? await bigTable(BIG_ROWS) : 'Not run (add `--rows 10000000` to measure acquire on a 10M-row table).'
    report(
      'postgres',
      'PostgresStore (PostgreSQL over loopback)',
      `npx tsx bench/postgres.bench.ts${BIG_ROWS ? ` --rows ${BIG_ROWS}` : ''}`,
      `${server}

${throughput}

### Wake-up latency

A Ledger waiting on another pool for a key in flight, from the holder's \`complete()\` to the waiter's answer (replay), ${wake.length} samples, each after the waiter's first 20 ms poll: p50 ${fmt(percentile(wake, 50), 1)} ms, p99 ${fmt(percentile(wake, 99), 1)} ms, max ${fmt(Math.max(...wake), 1)} ms (target p99 <= 20 ms).

### Size

A completed record with a UUID key, JSON headers and a ${body.byteLength}-byte body takes ${fmt(perRow)} bytes on disk (heap, TOAST and the three indexes; 100,000 rows, after VACUUM): keys stored = writes/s x dedup window, so 100 writes/s with a 24 h window is 8.64 M rows, about ${fmt((8_640_000 * perRow) / 1024 ** 3, 1)} GiB.

### Acquire on a large table

${big}`,
    )
  }
} finally {
  await pool.query(`DROP TABLE IF EXISTS "${TABLE}", "${BIG}", "${FRESH}", "${TABLE}_size"`)
  await store.close()
  await single.close()
  await pool.end()
}
