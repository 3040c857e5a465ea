/**
 * What waiting for a synchronous standby costs: first requests (`ledger.run` on a new key: an acquire
 * and a completion, two commits) per second through a `PostgresStore` whose sessions run at
 * `synchronous_commit` local, on and remote_apply, against a throwaway primary with one synchronous
 * standby (`synchronous_standby_names = '*'`, test/fixtures/postgres/replicated-pair.ts) on loopback,
 * optionally `--link-ms N` away each way. Rows measured one after another in one run, each level
 * `--blocks` times in alternation (the median is shown), at 1 and 16 callers.
 * Needs PostgreSQL 15's tools in /usr/lib/postgresql/15/bin (run as root, the servers run as `postgres`).
 * Run alone: npx tsx bench/postgres-replication.bench.ts [--ms 1500] [--blocks 3] [--link-ms 0]
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { canStartReplicatedPair, startReplicatedPair } from '../test/fixtures/postgres/replicated-pair.js'
import { fmt, numberArg, opsPerSecond, report, table } from './lib.js'

const MS = numberArg('--ms', 1_500)
const BLOCKS = numberArg('--blocks', 3)
const LINK_MS = numberArg('--link-ms', 0)
const LEVELS = ['local', 'on', 'remote_apply'] as const
const CALLERS = [1, 16]

if (!canStartReplicatedPair()) {
  console.warn('SKIPPED: the PostgreSQL 15 tools (initdb, pg_ctl, pg_basebackup) are not in /usr/lib/postgresql/15/bin')
  process.exit(0)
}

const pair = await startReplicatedPair({ synchronousStandbyNames: '*', linkDelayMs: LINK_MS })
try {
  const pools = new Map(
    LEVELS.map((level) => [level, new pg.Pool({ connectionString: pair.url, max: 16, options: `-c synchronous_commit=${level}` })]),
  )
  await new PostgresStore({ pool: pools.get('local') as pg.Pool }).migrate()
  const ledgers = new Map(LEVELS.map((level) => [level, new Ledger({ store: new PostgresStore({ pool: pools.get(level) as pg.Pool }) })]))
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] as number
  const rows: Array<Array<string | number>> = []
  for (const callers of CALLERS) {
    const samples = new Map<string, number[]>(LEVELS.map((level) => [level, []]))
    for (let block = 0; block < BLOCKS; block++) {
      for (const level of LEVELS) {
        const ledger = ledgers.get(level) as Ledger
        const prefix = randomUUID()
        const rate = await opsPerSecond((i) => ledger.run({ key: `${prefix}-${i}`, payload: i }, () => i), MS, callers)
        samples.get(level)?.push(rate)
      }
    }
    const local = median(samples.get('local') as number[])
    for (const level of LEVELS) {
      const rate = median(samples.get(level) as number[])
      rows.push([callers, `\`${level}\``, fmt(rate), level === 'local' ? '1.00' : fmt(rate / local, 2)])
    }
  }
  for (const pool of pools.values()) await pool.end()
  report(
    'postgres-replication',
    'PostgreSQL: first requests with a synchronous standby, by synchronous_commit',
    `npx tsx bench/postgres-replication.bench.ts --ms ${MS} --blocks ${BLOCKS} --link-ms ${LINK_MS}`,
    `A primary and one synchronous standby on loopback${LINK_MS ? `, ${LINK_MS} ms apart each way` : ''} (fsync off on both, as in the tests), a new key per call (acquire and completion: two commits), the median of ${BLOCKS} alternating blocks of ${MS} ms.\n\n${table(['callers', 'synchronous_commit', 'first requests/s', 'vs local'], rows)}`,
  )
} finally {
  await pair.destroy()
}
