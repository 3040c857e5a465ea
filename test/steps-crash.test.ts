import { spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Database from 'better-sqlite3'
import { Cluster } from 'ioredis'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { MySqlStore } from '../src/backends/mysql/mysql-store.js'
import { PostgresStore } from '../src/backends/postgres/postgres-store.js'
import { RedisStore } from '../src/backends/redis/redis-store.js'
import { SqliteStore } from '../src/backends/sqlite/sqlite-store.js'
import { deriveKey } from '../src/core/derive-key.js'
import type { IdempotencyStore } from '../src/core/store.js'
import { RedisCluster } from './fixtures/redis/servers.js'
import { serviceSkipReason } from './helpers/services.js'

const WORKER = join(import.meta.dirname, 'fixtures/steps/crash-worker.ts')
const KEYS = 6
const STEPS = ['reserve', 'charge', 'email']

interface Effect {
  key: string
  step: string
  derived_key: string
  pid: number
  token: number
  order_id: string
  placed_at: number
}

function runWorker(args: string[]): Promise<'done' | 'killed'> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', WORKER, ...args], { stdio: ['ignore', 'inherit', 'inherit'] })
    child.once('error', reject)
    child.once('exit', (code, signal) => {
      if (signal === 'SIGKILL') resolve('killed')
      else if (code === 0) resolve('done')
      else reject(new Error(`worker exited with ${code ?? signal}`))
    })
  })
}

const dir = mkdtempSync(join(tmpdir(), 'idemkey-steps-crash-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

interface Target {
  name: string
  skip: () => Promise<string | undefined>
  /** The store the checks read, and the worker's store arguments. */
  open: () => Promise<{ store: IdempotencyStore; kind: string; target: string; cleanup: () => Promise<void> }>
}

const targets: Target[] = [
  {
    name: 'SQLite',
    skip: async () => undefined,
    open: async () => {
      const path = join(dir, 'records.db')
      return { store: new SqliteStore({ path }), kind: 'sqlite', target: path, cleanup: async () => {} }
    },
  },
  {
    name: 'PostgreSQL',
    skip: () => serviceSkipReason('PostgreSQL', 5432),
    open: async () => {
      const table = `idemkey_steps_crash_${randomUUID().slice(0, 8)}`
      const store = new PostgresStore({ connectionString: 'postgres://root@127.0.0.1:5432/test', table })
      await store.migrate()
      const cleanup = async () => {
        const pool = new pg.Pool({ connectionString: 'postgres://root@127.0.0.1:5432/test' })
        await pool.query(`DROP TABLE IF EXISTS "${table}"`)
        await pool.end()
      }
      return { store, kind: 'postgres', target: table, cleanup }
    },
  },
  {
    name: 'MySQL (MariaDB)',
    skip: () => serviceSkipReason('MariaDB', 3306),
    open: async () => {
      const table = `idemkey_steps_crash_${randomUUID().slice(0, 8)}`
      const store = new MySqlStore({ uri: 'mysql://root@127.0.0.1:3306/test', table })
      await store.migrate()
      const cleanup = async () => {
        const pool = mysql.createPool({ uri: 'mysql://root@127.0.0.1:3306/test' })
        await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
        await pool.end()
      }
      return { store, kind: 'mysql', target: table, cleanup }
    },
  },
  {
    name: 'Redis',
    skip: () => serviceSkipReason('Redis', 6379),
    open: async () => {
      const prefix = `steps-crash-${randomUUID().slice(0, 8)}`
      return { store: new RedisStore({ url: 'redis://127.0.0.1:6379', prefix }), kind: 'redis', target: prefix, cleanup: async () => {} }
    },
  },
  {
    name: 'Redis Cluster (3 masters)',
    skip: () => serviceSkipReason('Redis', 6379),
    open: async () => {
      const cluster = new RedisCluster()
      await cluster.start()
      const prefix = `steps-crash-${randomUUID().slice(0, 8)}`
      const ports = cluster.nodes.map((node) => node.port).join(',')
      const client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 1 } })
      const cleanup = async () => {
        client.disconnect()
        await cluster.stop()
      }
      return { store: new RedisStore({ client, prefix }), kind: 'redis-cluster', target: `${ports}/${prefix}`, cleanup }
    },
  },
]

for (const { name, skip, open } of targets) {
  const reason = await skip()
  describe.skipIf(reason !== undefined)(`steps across processes killed between steps: ${name}`, () => {
    it('runs each step once, resumes after the last recorded one, and keeps the captured values across attempts', async () => {
      const { store, kind, target, cleanup } = await open()
      const effectsPath = join(dir, `effects-${kind}.db`)
      const effects = new Database(effectsPath)
      effects.exec(
        'CREATE TABLE effects (key TEXT, step TEXT, derived_key TEXT, pid INTEGER, token INTEGER, order_id TEXT, placed_at INTEGER)',
      )
      const scope = `crash-${randomUUID().slice(0, 8)}`
      try {
        // Life 1 dies after reserve, life 2 after charge, life 3 after email; life 4 finishes.
        const lives = []
        for (const killAfter of [1, 2, 3, 0])
          lives.push(await runWorker([kind, target, effectsPath, scope, String(KEYS), String(killAfter)]))
        expect(lives).toEqual(['killed', 'killed', 'killed', 'done'])

        const rows = effects.prepare('SELECT * FROM effects ORDER BY key, token').all() as Effect[]
        for (let i = 0; i < KEYS; i++) {
          const key = `order-${i}`
          const mine = rows.filter((row) => row.key === key)
          // Each step's effect happened once, each by the attempt after the one that recorded the step before.
          expect(
            mine.map((row) => [row.step, row.token]),
            key,
          ).toEqual([
            ['reserve', 1],
            ['charge', 2],
            ['email', 3],
          ])
          expect(mine.map((row) => row.derived_key)).toEqual(STEPS.map((step) => deriveKey(key, step)))
          expect(new Set(mine.map((row) => row.pid)).size, 'three processes').toBe(3)
          // The captured values of the first attempt, on every later attempt.
          expect(new Set(mine.map((row) => `${row.order_id} ${row.placed_at}`)).size, key).toBe(1)

          const record = await store.get(scope, key)
          expect(record?.status, key).toBe('completed')
          expect(record?.token, key).toBe(4)
          const body = JSON.parse(new TextDecoder().decode(record?.response?.body)) as {
            orderId: string
            placedAt: number
            done: Record<string, { token: number }>
          }
          expect(body.orderId).toBe(mine[0]?.order_id)
          expect(body.placedAt).toBe(mine[0]?.placed_at)
          expect(body.done).toEqual({
            reserve: { step: 'reserve', token: 1 },
            charge: { step: 'charge', token: 2 },
            email: { step: 'email', token: 3 },
          })
        }
        for (let i = 0; i < KEYS; i++) await store.evict(scope, `order-${i}`)
      } finally {
        effects.close()
        await store.close()
        await cleanup()
      }
    }, 60_000)
  })
}
