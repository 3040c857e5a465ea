/**
 * What the partitioned layout costs beside the plain one (docs/postgres.md, "Time partitions"), on
 * small tables, in alternating blocks on one pool: new-key cycles/s (acquire + complete) and replays/s
 * at 1 and 50 callers, and the single caller's acquire p50/p99. The price is the acquire's key lock:
 * a transaction of four round trips (BEGIN, lock, statement, COMMIT) instead of one statement;
 * replays pay it too (the acquire cannot know before its read that it will not write).
 * Not the scale measurement of issue 27 item 3 (tables of 10^8 rows).
 * Needs PostgreSQL on 127.0.0.1:5432 (user root, database test), or PG_URL.
 * Run alone (about 40 s): npx tsx bench/postgres-partitioned.bench.ts [--ms 1500] [--rounds 2]
 */
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import type { Outcome } from '../src/core/store.js'
import { fmt, numberArg, opsPerSecond, percentile, report, table } from './lib.js'

const MS = numberArg('--ms', 1_500)
const ROUNDS = numberArg('--rounds', 2)
const URL = process.env.PG_URL ?? 'postgres://root@127.0.0.1:5432/test'
const fp = fingerprintOf({ amount: 100 })
const body = new TextEncoder().encode('{"id":"ch_1","amount":100,"currency":"eur","status":"succeeded"}')
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: { 'content-type': 'application/json' }, body } }

const pool = new pg.Pool({ connectionString: URL, max: 20 })
const layouts = {
  plain: new PostgresStore({ pool, table: `idemkey_bench_plain_${process.pid}` }),
  partitioned: new PostgresStore({ pool, table: `idemkey_bench_part_${process.pid}`, layout: 'partitioned', partitionInterval: '1h' }),
}
type Layout = keyof typeof layouts
const results = new Map<string, number[]>()
const add = (name: string, value: number) => results.set(name, [...(results.get(name) ?? []), value])

async function cycle(store: PostgresStore, scope: string, key: string): Promise<void> {
  const acquired = await store.acquire(scope, key, fp, 30_000)
  if (acquired.kind !== 'acquired') throw new Error(`expected a new key, got ${acquired.kind}`)
  await store.complete(scope, key, acquired.token, outcome, 3_600_000)
}

async function block(layout: Layout, round: number): Promise<void> {
  const store = layouts[layout]
  const scope = `bench-${round}`
  for (const callers of [1, 50]) {
    add(`${layout} new keys/s, ${callers} callers`, await opsPerSecond((i) => cycle(store, scope, `n${callers}-${i}`), MS, callers))
  }
  for (let i = 0; i < 100; i++) await cycle(store, `${scope}-replay`, `r${i}`)
  for (const callers of [1, 50]) {
    add(
      `${layout} replays/s, ${callers} callers`,
      await opsPerSecond((i) => store.acquire(`${scope}-replay`, `r${i % 100}`, fp, 30_000), MS, callers),
    )
  }
  const latencies: number[] = []
  for (let i = 0; i < 500; i++) {
    const start = performance.now()
    await store.acquire(`${scope}-latency`, `l${i}`, fp, 30_000)
    latencies.push(performance.now() - start)
  }
  add(`${layout} acquire p50 ms, 1 caller`, percentile(latencies, 50))
  add(`${layout} acquire p99 ms, 1 caller`, percentile(latencies, 99))
}

try {
  for (const store of Object.values(layouts)) await store.migrate()
  for (let round = 0; round < ROUNDS; round++) {
    for (const layout of round % 2 === 0 ? (['plain', 'partitioned'] as const) : (['partitioned', 'plain'] as const)) {
      await block(layout, round)
    }
  }
  const measures = [
    'new keys/s, 1 callers',
    'new keys/s, 50 callers',
    'replays/s, 1 callers',
    'replays/s, 50 callers',
    'acquire p50 ms, 1 caller',
    'acquire p99 ms, 1 caller',
  ]
  const cell = (values: number[] | undefined, digits: number) =>
    values ? `${fmt(values.reduce((a, b) => a + b, 0) / values.length, digits)} (${values.map((v) => fmt(v, digits)).join(', ')})` : '-'
  const rows = measures.map((measure) => {
    const digits = measure.includes('ms') ? 2 : 0
    const plain = results.get(`plain ${measure}`)
    const parted = results.get(`partitioned ${measure}`)
    const mean = (values: number[] | undefined) => (values ?? []).reduce((a, b) => a + b, 0) / (values?.length || 1)
    return [measure.replace('1 callers', '1 caller'), cell(plain, digits), cell(parted, digits), fmt(mean(parted) / mean(plain), 2)]
  })
  report(
    'postgres-partitioned',
    'PostgresStore: partitioned layout beside plain (small tables)',
    'npx tsx bench/postgres-partitioned.bench.ts',
    `${table(['measure', 'plain: mean (blocks)', 'partitioned: mean (blocks)', 'partitioned / plain'], rows)}\n\n${ROUNDS} alternating blocks of ${MS} ms per measure; group commit on (the default) in both.`,
  )
} finally {
  for (const store of Object.values(layouts)) {
    await store.close()
    await pool.query(`DROP TABLE IF EXISTS "${store.table}"`)
  }
  await pool.end()
}
