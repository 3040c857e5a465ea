import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { IdempotencyError, isIdempotencyError } from '../../errors.js'
import { fp } from '../../testing/index.js'
import { PostgresDurabilityError } from './durability.js'
import type { PgQueryable } from './pool.js'
import { PostgresStore } from './postgres-store.js'

// The shared server streams to no standby (synchronous_standby_names is empty): the check must see it.
// What a server with a synchronous standby passes is proven in test/postgres-failover.test.ts.
const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const table = `idemkey_durability_${randomUUID().slice(0, 8)}`

/** A pool that records the text of every statement sent through `query`. */
function tapped(pool: pg.Pool, seen: string[]) {
  const query = ((config: string | { text: string }, values?: unknown[]) => {
    seen.push(typeof config === 'string' ? config : config.text)
    return (pool.query as PgQueryable['query'])(config as string, values)
  }) as PgQueryable['query']
  return { query, connect: () => pool.connect() }
}

async function failure(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise
  } catch (error) {
    return error
  }
  throw new Error('expected a failure')
}

describe.skipIf(skip !== undefined)('PostgresStore durability option against a server without a synchronous standby', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 4 })
  beforeAll(async () => {
    await new PostgresStore({ pool, table }).migrate()
  })
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`)
    await pool.end()
  })

  it('refuses every operation with PostgresDurabilityError naming synchronous_standby_names, and writes nothing', async () => {
    const store = new PostgresStore({ pool, table, durability: { synchronousCommit: 'remote_apply' } })
    const error = await failure(store.acquire('s', 'refused', fp('a'), 1_000))
    expect(error).toBeInstanceOf(PostgresDurabilityError)
    expect(isIdempotencyError(error) && error.code).toBe('STORE_UNAVAILABLE')
    const problems = (error as PostgresDurabilityError).problems
    expect(problems.map((problem) => problem.setting)).toContain('synchronous_standby_names')
    expect((error as Error).message).toContain("ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (*)'")
    expect((await pool.query(`SELECT count(*)::int AS n FROM "${table}" WHERE key = 'refused'`)).rows[0].n).toBe(0)
  })

  it('names synchronous_commit and the ALTER ROLE that fixes it when the session commits locally', async () => {
    const local = new pg.Pool({ connectionString: URL, max: 2, options: '-c synchronous_commit=local' })
    try {
      const store = new PostgresStore({ pool: local, table, durability: { synchronousCommit: 'on' } })
      const error = (await failure(store.get('s', 'k'))) as PostgresDurabilityError
      const commit = error.problems.find((problem) => problem.setting === 'synchronous_commit')
      expect(commit).toMatchObject({ found: "'local' in this session", wanted: "'on' or stronger" })
      expect(commit?.fix).toContain(`SET synchronous_commit = 'on'`)
    } finally {
      await local.end()
    }
  })

  it('checks again at the next operation after refusing (a standby that comes back is served)', async () => {
    const seen: string[] = []
    const store = new PostgresStore({ pool: tapped(pool, seen), table, durability: { synchronousCommit: 'on' } })
    await failure(store.get('s', 'k'))
    await failure(store.get('s', 'k'))
    expect(seen.filter((text) => text.includes('synchronous_standby_names'))).toHaveLength(2)
  })

  it("with onMismatch 'warn', warns once and serves; its own pool commits with the synchronous_commit asked", async () => {
    const warnings: string[] = []
    const store = new PostgresStore({
      connectionString: URL,
      table,
      max: 2,
      durability: { synchronousCommit: 'remote_apply', onMismatch: 'warn', warn: (message) => warnings.push(message) },
    })
    try {
      expect(await store.acquire('s', `warned-${randomUUID()}`, fp('a'), 1_000)).toMatchObject({ kind: 'acquired' })
      expect(await store.get('s', 'absent')).toBeNull()
      expect(warnings).toHaveLength(1)
      expect(warnings[0]).toContain('synchronous_standby_names')
      // Its own sessions already ask for remote_apply: the warning is about the server only.
      expect(warnings[0]).not.toContain('synchronous_commit is')
      const shown = await store.transaction((tx) => tx.query('SHOW synchronous_commit'))
      expect(shown.rows[0]).toEqual({ synchronous_commit: 'remote_apply' })
    } finally {
      await store.close()
    }
  })

  it('costs nothing when off: no check statement is sent', async () => {
    const seen: string[] = []
    const store = new PostgresStore({ pool: tapped(pool, seen), table })
    await store.get('s', 'k')
    expect(seen.some((text) => text.includes('synchronous'))).toBe(false)
  })

  it('rejects a durability that would not wait for a standby with INVALID_OPTION', () => {
    for (const synchronousCommit of ['local', 'off', 'yes', undefined]) {
      expect(() => new PostgresStore({ pool, table, durability: { synchronousCommit } as never })).toThrow(IdempotencyError)
    }
    expect(() => new PostgresStore({ pool, table, durability: { synchronousCommit: 'on', onMismatch: 'ignore' } as never })).toThrow(
      /onMismatch must be 'refuse' or 'warn'/,
    )
  })
})
