/**
 * MySqlStore benchmark: acquire+complete cycles/s and replays/s at 1 and 50 concurrent callers, with
 * group commit (the default) and without (`groupCommit: false`), beside two raw mysql2 baselines
 * measured in the same run on the same pool:
 *  - "raw, same SQL": the single statements MySqlStore sends, straight through mysql2, one operation
 *    at a time (the library's own cost, or its batching's gain);
 *  - "raw, minimal": the least SQL that could do the job without idempotency guarantees (a plain
 *    INSERT then UPDATE per cycle, one SELECT by primary key per replay): the design's cost.
 * The two stores and "raw, same SQL" run in rotating rounds, so a busy neighbour hurts all alike.
 * Needs MySQL or MariaDB on 127.0.0.1:3306 (user root, database test), or MYSQL_URI.
 * Run alone, in under a minute: npx tsx bench/mysql.bench.ts [--ms 2000] [--callers 1,50]
 */
import { randomBytes } from 'node:crypto'
import mysql from 'mysql2/promise'
import { MySqlStore } from '../src/backends/mysql/index.js'
import { bind, statements } from '../src/backends/mysql/statements.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import { Ledger } from '../src/core/ledger.js'
import type { Outcome } from '../src/core/store.js'
import { fmt, numberArg, opsPerSecond, report, table } from './lib.js'

const MS = numberArg('--ms', 2_000)
const callersAt = process.argv.indexOf('--callers')
const CALLERS =
  callersAt > 0
    ? String(process.argv[callersAt + 1])
        .split(',')
        .map(Number)
    : [1, 50]
const URI = process.env.MYSQL_URI ?? 'mysql://root@127.0.0.1:3306/test'
const TABLE = `idemkey_bench_${process.pid}`
const RETENTION_MS = 24 * 3_600_000
const fp = fingerprintOf({ amount: 100 })
const body = new TextEncoder().encode('{"id":"ch_1","amount":100}')
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: { 'content-type': 'application/json' }, body } }
const headers = JSON.stringify(outcome.response.headers)

const CONNECTIONS = 20
const pool = mysql.createPool({ uri: URI, connectionLimit: CONNECTIONS })
const store = new MySqlStore({ pool, table: TABLE })
/** The same table through a store that sends one statement per operation. */
const single = new MySqlStore({ pool, table: TABLE, groupCommit: false })
const sql = statements(TABLE, RETENTION_MS)
const id = (scope: string, key: string) => ({ scope: Buffer.from(scope), key: Buffer.from(key) })
const completeValues = (scope: string, key: string, token: number) => ({
  ...id(scope, key),
  token,
  status: 'completed',
  response_status: 201,
  response_headers: headers,
  response_body: Buffer.from(body),
  resource_id: null,
  ttl: 3_600_000,
})

/** The statements MySqlStore sends for a new key (read, insert, complete), with no library code around them. */
async function rawSameCycle(scope: string, key: string): Promise<void> {
  const k = id(scope, key)
  const [seen] = await pool.execute(sql.peek.sql, bind(sql.peek, k))
  if ((seen as unknown[]).length > 0) throw new Error('expected a new key')
  await pool.execute(sql.insert.sql, bind(sql.insert, { ...k, fingerprint: fp, lease: 30_000, claim: randomBytes(16) }))
  await pool.execute(sql.complete.sql, bind(sql.complete, completeValues(scope, key, 1)))
}

/** What MySqlStore sends for a replay: one read. */
async function rawSameReplay(scope: string, key: string): Promise<void> {
  await pool.execute(sql.peek.sql, bind(sql.peek, id(scope, key)))
}

const MINIMAL_INSERT = `INSERT INTO ${TABLE} (scope, \`key\`, fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at, claim)
  VALUES (?, ?, ?, 'in_progress', 1, ?, 1, ?, ?, ?, ?)`
const MINIMAL_COMPLETE = `UPDATE ${TABLE} SET status = 'completed', locked_until = NULL, response_status = 201, response_headers = ?,
  response_body = ?, expires_at = ? WHERE scope = ? AND \`key\` = ? AND token = 1`
const MINIMAL_SELECT = `SELECT * FROM ${TABLE} WHERE scope = ? AND \`key\` = ?`

async function rawMinimalCycle(scope: string, key: string): Promise<void> {
  const now = Date.now()
  const k = id(scope, key)
  await pool.execute(MINIMAL_INSERT, [k.scope, k.key, fp, now + 30_000, now, now, now + RETENTION_MS, randomBytes(16)])
  await pool.execute(MINIMAL_COMPLETE, [headers, Buffer.from(body), now + 3_600_000, k.scope, k.key])
}

async function measure(concurrency: number, ms = MS): Promise<{ rows: Array<Array<string | number>>; ratios: string[] }> {
  const scope = `bench-${Date.now()}-${concurrency}`
  let round = 0
  const cycle = (on: MySqlStore, prefix: string) => async (i: number) => {
    const key = `${prefix}-${round}-${i}`
    const acquired = await on.acquire(scope, key, fp, 30_000)
    if (acquired.kind !== 'acquired') throw new Error(`expected acquired, got ${acquired.kind}`)
    if (!(await on.complete(scope, key, acquired.token, outcome, 3_600_000))) throw new Error('complete refused')
  }
  const replay = (on: MySqlStore) => async () => {
    const answer = await on.acquire(scope, 'c-0', fp, 30_000)
    if (answer.kind !== 'replay') throw new Error(`expected replay, got ${answer.kind}`)
  }
  // The replay target: one completed key.
  const first = (await store.acquire(scope, 'c-0', fp, 30_000)) as { token: number }
  await store.complete(scope, 'c-0', first.token, outcome, 3_600_000)
  const ROUNDS = 3
  const slice = ms / ROUNDS
  let [storeCycles, singleCycles, sameCycles, storeReplays, singleReplays, sameReplays] = [0, 0, 0, 0, 0, 0]
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
      () => opsPerSecond(() => rawSameReplay(scope, 'c-0'), slice, concurrency),
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
    ms / 2,
    concurrency,
  )
  const minimalCycles = await opsPerSecond((i) => rawMinimalCycle(scope, `m-${i}`), ms / 2, concurrency)
  const minimalReplays = await opsPerSecond(
    () => pool.execute(MINIMAL_SELECT, [Buffer.from(scope), Buffer.from('c-0')]),
    ms / 2,
    concurrency,
  )
  const pct = (a: number, b: number) => `${fmt((100 * a) / b)}%`
  const x = (a: number, b: number) => `${fmt(a / b, 2)}x`
  return {
    rows: [
      ['MySqlStore', concurrency, fmt(storeCycles), fmt(storeReplays), fmt(ledgerCycles)],
      ['MySqlStore, groupCommit: false', concurrency, fmt(singleCycles), fmt(singleReplays), '-'],
      ['raw mysql2, same SQL', concurrency, fmt(sameCycles), fmt(sameReplays), '-'],
      ['raw mysql2, minimal SQL', concurrency, fmt(minimalCycles), fmt(minimalReplays), '-'],
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

try {
  await store.migrate()
  const [version] = await pool.query('SELECT VERSION() AS v, @@innodb_flush_log_at_trx_commit AS flush')
  const server = (version as Array<{ v: string; flush: number }>)[0]
  // Warm the buffer pool, the prepared-statement caches and the JIT before anything is measured.
  await measure(10, 600)
  const rows: Array<Array<string | number>> = []
  const ratios: string[][] = []
  for (const concurrency of CALLERS) {
    const result = await measure(concurrency)
    rows.push(...result.rows)
    ratios.push(result.ratios)
  }
  report(
    'mysql',
    'MySqlStore (MySQL/MariaDB over loopback), group commit on and off',
    `npx tsx bench/mysql.bench.ts --ms ${MS} --callers ${CALLERS.join(',')}`,
    `Server: ${server?.v}, innodb_flush_log_at_trx_commit=${server?.flush}, on the same machine; pool of ${CONNECTIONS} connections.

${table(['path', 'callers', 'acquire+complete cycles/s', 'replays/s', 'Ledger.run cycles/s'], rows)}

MySqlStore as a share of "raw mysql2, same SQL", with group commit (the default) and without, and group commit on / off:

${table(['callers', 'cycles', 'replays', 'cycles, off', 'replays, off', 'cycles on / off', 'replays on / off'], ratios)}

A cycle is one \`acquire\` of a new key and one \`complete\` of it. With group commit (the default), the acquires, completes and replays' reads that concurrent callers issue while one of their kind is in flight go out together when it returns (a batch of acquires: one read, one multi-row upsert, one read back; of completes: one transaction that locks the rows, one joined UPDATE, one commit); \`groupCommit: false\` sends one statement per operation. "raw mysql2, same SQL" sends exactly the single statements MySqlStore sends (a new key: a read, an INSERT and the completing UPDATE; a replay: one read), one operation at a time, in three rounds that rotate with both stores (which goes first rotates too), so the gap to it is the library's own cost (or, with group commit, its gain); "raw mysql2, minimal SQL" is a plain INSERT and UPDATE per cycle and one SELECT by primary key per replay, with none of the guarantees, so the gap to it is the cost of the design. Every single write is its own autocommit transaction; with innodb_flush_log_at_trx_commit=1 each one waits for a redo log flush. The server shares the 2-core machine with the benchmark (and, on the recording machine, with other sessions' work): compare rows of one run, not runs; the figures are indicative.`,
  )
} finally {
  await pool.query(`DROP TABLE IF EXISTS \`${TABLE}\`, \`${TABLE}_meta\``)
  await pool.end()
}
