/**
 * What idemkey costs through each data-layer tool (docs/orm.md), against what it costs on raw pg: per
 * tool, transactions/s of "insert one business row" through the tool alone and through
 * `ledger.runInTransaction` with the tool's transactions (a new key each, so every call acquires,
 * commits the row and completes the record), the two sides alternating in one run on the same
 * PostgreSQL. Target (issue 25): each tool's ratio (with idemkey / without) is at least 0.9 times the
 * same ratio on raw pg.
 * Needs PostgreSQL on 127.0.0.1:5432.
 * Run alone: npx tsx bench/orm.bench.ts [--ms 2000] [--rounds 2] [--concurrency 8]
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { PRISMA_TABLES } from '../test/helpers/orm-prisma.js'
import { type BusinessTables, PG_URL, type ToolName, toolHarness } from '../test/helpers/orm-tools.js'
import { fmt, numberArg, opsPerSecond, report, table } from './lib.js'

const MS = numberArg('--ms', 2_000)
const ROUNDS = numberArg('--rounds', 2)
const CONCURRENCY = numberArg('--concurrency', 8)
const TOOLS: ToolName[] = process.env.TOOLS
  ? (process.env.TOOLS.split(',') as ToolName[])
  : ['drizzle', 'kysely', 'knex', 'typeorm', 'sequelize', 'mikro-orm', 'postgres.js', 'prisma']
const suffix = randomUUID().slice(0, 8)
const recordsTable = `idemkey_bench_orm_${suffix}`
const mine: BusinessTables = { orders: `idemkey_bench_orm_orders_${suffix}`, accounts: `idemkey_bench_orm_accounts_${suffix}` }
const admin = new pg.Pool({ connectionString: PG_URL, max: 2 })
/**
 * A new number for every call of the whole run: opsPerSecond numbers its calls from 0 in every turn, and
 * a key seen in an earlier turn would replay instead of running (no transaction at all), flattering "with".
 */
let calls = 0
const fresh = () => calls++

interface Side {
  without: () => Promise<unknown>
  with: () => Promise<unknown>
  close: () => Promise<void>
}

async function createTables(tables: BusinessTables): Promise<void> {
  await admin.query(`DROP TABLE IF EXISTS "${tables.orders}", "${tables.accounts}"`)
  await admin.query(`CREATE TABLE "${tables.orders}" (id serial PRIMARY KEY, intent varchar(200) NOT NULL, who varchar(50) NOT NULL)`)
  await admin.query(`CREATE TABLE "${tables.accounts}" (id varchar(200) PRIMARY KEY, balance integer NOT NULL)`)
}

/** Raw pg: BEGIN / INSERT / COMMIT on a pool client, and the same through PostgresStore's own transactions. */
async function rawPg(): Promise<Side> {
  const pool = new pg.Pool({ connectionString: PG_URL, max: CONCURRENCY + 2 })
  const store = new PostgresStore<pg.PoolClient>({ pool, table: recordsTable, preparedStatements: process.env.UNPREPARED !== '1' })
  const ledger = new Ledger({ store })
  const insert = (tx: pg.PoolClient, i: number) => tx.query(`INSERT INTO "${mine.orders}" (intent, who) VALUES ($1, 'bench')`, [`raw-${i}`])
  return {
    without: async () => {
      const i = fresh()
      const client = await pool.connect()
      try {
        await client.query('BEGIN')
        await insert(client, i)
        await client.query('COMMIT')
      } finally {
        client.release()
      }
    },
    with: () => {
      const i = fresh()
      return ledger.runInTransaction({ key: `raw-${suffix}-${i}`, payload: i }, ({ tx }) => insert(tx, i))
    },
    close: async () => {
      await store.close()
      await pool.end()
    },
  }
}

async function through(tool: ToolName): Promise<Side> {
  const tables = tool === 'prisma' ? PRISMA_TABLES : mine
  if (tool === 'prisma') await createTables(PRISMA_TABLES)
  const harness = await toolHarness(tool, 'postgres', tables, CONCURRENCY + 2)
  const pool = new pg.Pool({ connectionString: PG_URL, max: CONCURRENCY + 2 })
  const store = new PostgresStore({ pool, table: recordsTable, transactions: harness.transactions })
  const ledger = new Ledger({ store })
  return {
    without: () => {
      const i = fresh()
      return harness.transactions.transaction((tx) => harness.insertOrder(tx, `${tool}-plain-${i}`, 'bench'))
    },
    with: () => {
      const i = fresh()
      return ledger.runInTransaction({ key: `${tool}-${suffix}-${i}`, payload: i }, ({ tx }) =>
        harness.insertOrder(tx, `${tool}-${i}`, 'bench'),
      )
    },
    close: async () => {
      await store.close()
      await pool.end()
      await harness.close()
      if (tool === 'prisma') await admin.query(`DROP TABLE IF EXISTS "${PRISMA_TABLES.orders}", "${PRISMA_TABLES.accounts}"`)
    },
  }
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] as number
interface Row {
  name: string
  without: number
  with: number
  /** Median over rounds of (this tool's ratio / raw pg's ratio in the same round). */
  relative: number
  /** The lowest and highest of those per-round figures. */
  range: [number, number]
}
const rows: Row[] = []
const rawRates = { without: [] as number[], with: [] as number[] }
await createTables(mine)
await new PostgresStore({ pool: admin, table: recordsTable }).migrate()
const raw = await rawPg()
try {
  for (const name of TOOLS) {
    const side = await through(name)
    const rates = { without: [] as number[], with: [] as number[] }
    const relatives: number[] = []
    try {
      for (let round = 0; round < ROUNDS; round++) {
        // Raw pg runs in every round beside the tool, so drift over the run (the tables grow, the
        // machine's load moves) reaches both ratios alike; the order of the four turns rotates.
        const turns = [
          ['tool', 'without'],
          ['tool', 'with'],
          ['raw', 'without'],
          ['raw', 'with'],
        ] as const
        const rotated = [...turns.slice(round % 4), ...turns.slice(0, round % 4)]
        const measured = { tool: { without: 0, with: 0 }, raw: { without: 0, with: 0 } }
        for (const [who, which] of rotated) {
          measured[who][which] = await opsPerSecond((who === 'tool' ? side : raw)[which], MS, CONCURRENCY)
        }
        rates.without.push(measured.tool.without)
        rates.with.push(measured.tool.with)
        rawRates.without.push(measured.raw.without)
        rawRates.with.push(measured.raw.with)
        relatives.push(measured.tool.with / measured.tool.without / (measured.raw.with / measured.raw.without))
      }
    } finally {
      await side.close()
    }
    const range: [number, number] = [Math.min(...relatives), Math.max(...relatives)]
    rows.push({ name, without: median(rates.without), with: median(rates.with), relative: median(relatives), range })
    console.log(
      `${name}: ${fmt(median(rates.without))} / ${fmt(median(rates.with))} tx/s, ${median(relatives).toFixed(2)} of raw pg's ratio (rounds: ${relatives.map((r) => r.toFixed(2)).join(', ')})`,
    )
  }
} finally {
  await raw.close()
  await admin.query(`DROP TABLE IF EXISTS "${recordsTable}", "${mine.orders}", "${mine.accounts}"`)
  await admin.end()
}

const rawRow: Row = { name: 'raw pg', without: median(rawRates.without), with: median(rawRates.with), relative: 1, range: [1, 1] }
report(
  'orm',
  'Data-layer tools: runInTransaction through the tool, against raw pg',
  `npx tsx bench/orm.bench.ts --rounds ${ROUNDS} --ms ${MS}`,
  `${table(
    [
      'PostgreSQL through',
      'tool alone (tx/s)',
      'with idemkey (tx/s)',
      'ratio',
      'ratio / raw pg ratio',
      'rounds: lowest-highest',
      'target',
      'met',
    ],
    [rawRow, ...rows].map((row) => [
      row.name,
      fmt(row.without),
      fmt(row.with),
      (row.with / row.without).toFixed(2),
      row.relative.toFixed(2),
      row === rawRow ? '' : `${row.range[0].toFixed(2)}-${row.range[1].toFixed(2)}`,
      row === rawRow ? '' : '>= 0.90',
      row === rawRow ? '' : row.relative >= 0.9 ? 'yes' : 'NO',
    ]),
  )}\n\n` +
    `Each side inserts one business row per transaction with ${CONCURRENCY} concurrent callers for ${MS / 1000} s per turn. ` +
    `In each of ${ROUNDS} rounds a tool's two sides and raw pg's two sides take turns (the order rotating), and ` +
    '"ratio / raw pg ratio" is the median over the rounds of the tool\'s ratio divided by raw pg\'s ratio of the same ' +
    'round, so drift over the run (the tables grow, the load moves) reaches both alike; the tx/s columns are ' +
    'medians (raw pg over all rounds). "With idemkey" is `ledger.runInTransaction` on a new key each ' +
    "time with the tool's transactions: the acquire on the store's pool, then the tool's BEGIN, the row, the " +
    "completion through the tool, the tool's COMMIT. The tool's own overhead is in both sides of its row.\n\n" +
    'On this 2-core machine the database and the benchmark share the CPU, and parsing and planning the ' +
    'completion on every transaction shows: the store prepares it wherever the tool lets it (the pg client ' +
    'under Drizzle, TypeORM and Sequelize, Knex query options, Kysely and MikroORM on their pg driver, ' +
    "postgres.js `prepare`). One round's figure can be far from the median (the range column): a 2-core machine " +
    'shared by the database, the benchmark and whatever else runs moves single turns by a factor of two, which is ' +
    'why the table reports the median of paired rounds and not one turn.',
)
process.exit(0)
