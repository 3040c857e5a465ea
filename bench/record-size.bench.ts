/**
 * Bytes per stored record, by store and response body size (issue 27, docs/scale.md): each store gets
 * N completed records (a UUID key, the default scope, a `content-type` header, a JSON body of the given
 * size made of random characters, so that compression gains little), and the bytes it then occupies are
 * read from the store itself:
 * - PostgreSQL: `pg_total_relation_size` (table, TOAST, primary key) after `VACUUM`, whose freed space the
 *   next writes reuse (the steady state of a table that expires as fast as it fills);
 * - MySQL/MariaDB: InnoDB `data_length + index_length` after `ANALYZE TABLE` (page-granular estimates);
 * - SQLite: pages in use (`page_count - freelist_count`) times the page size, after a WAL checkpoint;
 * - Redis: `used_memory` before and after (the key, the value, the expiry entry, allocator rounding);
 * - DynamoDB: each item's size by AWS's documented rules (names plus values), plus the 100 bytes of
 *   per-item overhead DynamoDB bills for storage. dynalite does not report sizes; the items are read
 *   back from it and measured.
 * The figures go to src/cli/commands/size-model.ts (by hand, with this command) for `idemkey size`.
 * Needs PostgreSQL, MariaDB and Redis on loopback.
 * Run: npx tsx bench/record-size.bench.ts [--records 20000]
 */
import { randomBytes, randomUUID } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ScanCommand } from '@aws-sdk/client-dynamodb'
import { Redis } from 'ioredis'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { DynamoDbStore } from '../src/backends/dynamodb/index.js'
import { MySqlStore } from '../src/backends/mysql/index.js'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { RedisStore } from '../src/backends/redis/index.js'
import { SqliteStore } from '../src/backends/sqlite/index.js'
import type { IdempotencyStore, Outcome } from '../src/core/store.js'
import { startDynamoDb } from '../test/helpers/dynalite.js'
import { dropPrefix } from '../test/helpers/redis.js'
import { fmt, numberArg, report, table } from './lib.js'

const RECORDS = numberArg('--records', 20_000)
const BODIES = [16, 256, 1_024, 4_096]
const FINGERPRINT = 'a'.repeat(64)
const DAY = 86_400_000
const suffix = randomUUID().slice(0, 8)

/** A JSON body of exactly `bytes` bytes: `{"d":"…"}` around random letters and digits. */
function body(bytes: number): Uint8Array {
  const alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'
  const random = randomBytes(Math.max(0, bytes - 8))
  let text = ''
  for (const byte of random) text += alphabet[byte % alphabet.length]
  return new TextEncoder().encode(`{"d":"${text}"}`)
}

/** Writes `RECORDS` completed records, 32 at a time. */
async function fill(store: IdempotencyStore, bodyBytes: number): Promise<void> {
  const outcome = (): Outcome => ({
    status: 'completed',
    response: { status: 201, headers: { 'content-type': 'application/json' }, body: body(bodyBytes) },
    resourceId: null,
  })
  let next = 0
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (next < RECORDS) {
        next++
        const key = randomUUID()
        const acquired = await store.acquire('default', key, FINGERPRINT, 30_000)
        if (acquired.kind !== 'acquired') throw new Error(`record-size: acquire of a new key answered ${acquired.kind}`)
        if (!(await store.complete('default', key, acquired.token, outcome(), DAY))) throw new Error('record-size: complete was fenced out')
      }
    }),
  )
}

type Measure = (bodyBytes: number) => Promise<number>

async function postgres(): Promise<Measure> {
  const pool = new pg.Pool({ connectionString: 'postgres://root@127.0.0.1:5432/test', max: 8 })
  return async (bodyBytes) => {
    const name = `idemkey_size_${suffix}_${bodyBytes}`
    const store = new PostgresStore({ pool, table: name })
    await store.migrate()
    try {
      await fill(store, bodyBytes)
      await pool.query(`VACUUM "${name}"`)
      const { rows } = await pool.query(`SELECT pg_total_relation_size($1::regclass)::bigint AS bytes`, [`"${name}"`])
      return Number((rows[0] as { bytes: string }).bytes) / RECORDS
    } finally {
      await store.close()
      await pool.query(`DROP TABLE IF EXISTS "${name}"`)
    }
  }
}

async function mariadb(): Promise<Measure> {
  const pool = mysql.createPool({ uri: 'mysql://root@127.0.0.1:3306/test', connectionLimit: 8 })
  return async (bodyBytes) => {
    const name = `idemkey_size_${suffix}_${bodyBytes}`
    const store = new MySqlStore({ pool, table: name })
    await store.migrate()
    try {
      await fill(store, bodyBytes)
      await pool.query(`ANALYZE TABLE \`${name}\``)
      const [rows] = await pool.query(
        'SELECT data_length + index_length AS bytes FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?',
        [name],
      )
      return Number((rows as Array<{ bytes: number }>)[0]?.bytes) / RECORDS
    } finally {
      await store.close()
      await pool.query(`DROP TABLE IF EXISTS \`${name}\``)
    }
  }
}

async function sqlite(): Promise<Measure> {
  return async (bodyBytes) => {
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-size-'))
    const store = new SqliteStore({ path: join(dir, 'size.db') })
    try {
      await fill(store, bodyBytes)
      await store.close()
      const { DatabaseSync } = await import('node:sqlite')
      const db = new DatabaseSync(join(dir, 'size.db'))
      db.exec('PRAGMA wal_checkpoint(TRUNCATE)')
      const one = (pragma: string) => Number(Object.values(db.prepare(`PRAGMA ${pragma}`).get() as object)[0])
      const bytes = (one('page_count') - one('freelist_count')) * one('page_size')
      db.close()
      return bytes / RECORDS
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }
}

async function redis(): Promise<Measure> {
  const admin = new Redis('redis://127.0.0.1:6379')
  const used = async () => Number(/used_memory:(\d+)/.exec(await admin.info('memory'))?.[1])
  return async (bodyBytes) => {
    const prefix = `idemkey-size-${suffix}-${bodyBytes}`
    const store = new RedisStore({ url: 'redis://127.0.0.1:6379', prefix, notifications: false })
    try {
      await store.acquire('default', 'warm-up', FINGERPRINT, 1_000)
      const before = await used()
      await fill(store, bodyBytes)
      return ((await used()) - before) / RECORDS
    } finally {
      await dropPrefix('redis://127.0.0.1:6379', prefix)
      await store.close()
    }
  }
}

/** An attribute value's size by DynamoDB's rules (docs: "Item sizes and formats"). */
function attributeSize(value: Record<string, unknown>): number {
  const [type, inner] = Object.entries(value)[0] as [string, unknown]
  switch (type) {
    case 'S':
      return Buffer.byteLength(inner as string)
    case 'B':
      return (inner as Uint8Array).byteLength
    case 'N': {
      const digits = (inner as string).replace(/^-/, '').replace('.', '').replace(/^0+/, '').replace(/0+$/, '')
      return Math.ceil(Math.max(1, digits.length) / 2) + 1
    }
    case 'BOOL':
    case 'NULL':
      return 1
    case 'M':
      return (
        3 +
        Object.entries(inner as Record<string, Record<string, unknown>>).reduce(
          (n, [k, v]) => n + Buffer.byteLength(k) + attributeSize(v) + 1,
          0,
        )
      )
    case 'L':
      return 3 + (inner as Array<Record<string, unknown>>).reduce((n, v) => n + attributeSize(v) + 1, 0)
    default:
      throw new Error(`record-size: no size rule for DynamoDB type ${type}`)
  }
}

async function dynamodb(): Promise<Measure> {
  const dynamo = await startDynamoDb()
  const client = dynamo.client()
  return async (bodyBytes) => {
    const name = dynamo.table(`size-${bodyBytes}`)
    const store = new DynamoDbStore({ table: name, client })
    await store.migrate()
    await fill(store, bodyBytes)
    let bytes = 0
    let items = 0
    let start: Record<string, unknown> | undefined
    do {
      const page = (await client.send(new ScanCommand({ TableName: name, ExclusiveStartKey: start as never }))) as {
        Items?: Array<Record<string, Record<string, unknown>>>
        LastEvaluatedKey?: Record<string, unknown>
      }
      for (const item of page.Items ?? []) {
        items++
        // 100 bytes of overhead per item, which DynamoDB adds to the stored (and billed) size.
        bytes += 100 + Object.entries(item).reduce((n, [k, v]) => n + Buffer.byteLength(k) + attributeSize(v), 0)
      }
      start = page.LastEvaluatedKey
    } while (start)
    await store.close()
    return bytes / items
  }
}

const stores: Array<[string, () => Promise<Measure>]> = [
  ['PostgreSQL', postgres],
  ['MySQL/MariaDB', mariadb],
  ['SQLite', sqlite],
  ['Redis', redis],
  ['DynamoDB', dynamodb],
]
const only = process.env.STORES?.split(',')
const rows: string[][] = []
for (const [name, make] of stores) {
  if (only && !only.includes(name)) continue
  const measure = await make()
  const sizes: number[] = []
  for (const bytes of BODIES) sizes.push(await measure(bytes))
  console.log(`${name}: ${sizes.map((s) => s.toFixed(0)).join(' / ')} bytes per record`)
  rows.push([name, ...sizes.map((s) => fmt(Math.round(s)))])
}

report(
  'record-size',
  'Bytes per stored record, by store and response body size',
  `npx tsx bench/record-size.bench.ts --records ${RECORDS}`,
  `${table(
    ['store', ...BODIES.map((b) => `body ${fmt(b)} B`)],
    rows,
  )}\n\n${fmt(RECORDS)} completed records per cell: a UUID key in the default scope, a \`content-type\` header and a JSON body ` +
    'of random letters and digits (little for compression to gain). PostgreSQL: table, TOAST and primary key after `VACUUM` ' +
    '(the space a steady state reuses); MySQL/MariaDB: InnoDB data and index length after `ANALYZE TABLE`; SQLite: pages in use; ' +
    "Redis: the growth of `used_memory`; DynamoDB: each item's size by AWS's rules plus 100 bytes of per-item overhead. " +
    '`idemkey size` (docs/scale.md) uses these figures.',
)
process.exit(0)
