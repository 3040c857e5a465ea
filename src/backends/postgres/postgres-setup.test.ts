import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { isIdempotencyError } from '../../errors.js'
import { fp, sampleOutcome } from '../../testing/index.js'
import { PostgresStore } from './postgres-store.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)

async function failure(promise: Promise<unknown>): Promise<{ code: string; message: string; cause: unknown }> {
  try {
    await promise
  } catch (error) {
    if (!isIdempotencyError(error)) throw error
    return { code: error.code, message: error.message, cause: error.cause }
  }
  throw new Error('expected a failure')
}

describe.skipIf(skip !== undefined)('PostgresStore setup and bad input', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 4 })
  const tables: string[] = []
  const table = (label: string) => {
    const name = `idemkey_${label}_${suffix}`
    tables.push(name)
    return name
  }
  afterAll(async () => {
    for (const name of tables) await pool.query(`DROP TABLE IF EXISTS "${name}"`)
    await pool.query(`DROP SCHEMA IF EXISTS "idemkey_schema_${suffix}" CASCADE`)
    await pool.query(`DROP ROLE IF EXISTS "idemkey_noperm_${suffix}"`)
    await pool.end()
  })

  it('answers STORE_SCHEMA naming migrate() when the table is missing', async () => {
    const store = new PostgresStore({ pool, table: table('missing') })
    const error = await failure(store.acquire('s', 'k', fp('a'), 1_000))
    expect(error.code).toBe('STORE_SCHEMA')
    expect(error.message).toContain('store.migrate()')
    expect(error.message).toContain('idemkey migrate')
    expect((error.cause as { code?: string }).code).toBe('42P01')
  })

  it('answers STORE_SCHEMA for a table of another shape, at acquire and at migrate', async () => {
    const name = table('shape')
    await pool.query(`CREATE TABLE "${name}" (scope text, "key" text, PRIMARY KEY (scope, "key"))`)
    const store = new PostgresStore({ pool, table: name })
    expect((await failure(store.acquire('s', 'k', fp('a'), 1_000))).code).toBe('STORE_SCHEMA')
    const error = await failure(store.migrate())
    expect(error.code).toBe('STORE_SCHEMA')
    expect(error.message).toContain('another shape')
  })

  it('upgrades a schema-1 table in place: its in-progress record keeps its token and takes steps', async () => {
    const name = table('v1')
    await pool.query(`CREATE TABLE "${name}" (scope text COLLATE "C" NOT NULL, "key" text COLLATE "C" NOT NULL,
      fingerprint text NOT NULL, status text NOT NULL, token bigint NOT NULL, locked_until bigint NULL,
      response_status smallint NULL, response_headers text NULL, response_body bytea NULL, resource_id text NULL,
      attempts integer NOT NULL, created_at bigint NOT NULL, updated_at bigint NOT NULL, expires_at bigint NOT NULL,
      waiters boolean NOT NULL DEFAULT false, PRIMARY KEY (scope, "key"))`)
    await pool.query(`COMMENT ON TABLE "${name}" IS 'idemkey schema 1: idempotency records (scope, key)'`)
    const far = Date.now() + 3_600_000
    await pool.query(
      `INSERT INTO "${name}" (scope, "key", fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at)
       VALUES ('s', 'k', $1, 'in_progress', 3, $2, 3, 1, 1, $2)`,
      [fp('a'), far],
    )
    const store = new PostgresStore({ pool, table: name })
    await store.migrate()
    expect(await store.recordStep('s', 'k', 3, 'reserve', '1')).toBe(true)
    expect(await store.release('s', 'k', 3)).toBe(true)
    expect(await store.acquire('s', 'k', fp('a'), 30_000)).toEqual({
      kind: 'acquired',
      token: 4,
      steps: [{ name: 'reserve', result: '1' }],
    })
    const comment = await pool.query(`SELECT obj_description('"${name}"'::regclass) AS c`)
    expect(comment.rows[0].c).toMatch(/^idemkey schema 2:/)
    await store.close()
  })

  it('answers STORE_SCHEMA naming migrate() when a schema-1 table has not been upgraded yet', async () => {
    const name = table('v1_unmigrated')
    await pool.query(`CREATE TABLE "${name}" (scope text COLLATE "C" NOT NULL, "key" text COLLATE "C" NOT NULL,
      fingerprint text NOT NULL, status text NOT NULL, token bigint NOT NULL, locked_until bigint NULL,
      response_status smallint NULL, response_headers text NULL, response_body bytea NULL, resource_id text NULL,
      attempts integer NOT NULL, created_at bigint NOT NULL, updated_at bigint NOT NULL, expires_at bigint NOT NULL,
      waiters boolean NOT NULL DEFAULT false, PRIMARY KEY (scope, "key"))`)
    const store = new PostgresStore({ pool, table: name })
    const error = await failure(store.acquire('s', 'k', fp('a'), 1_000))
    expect(error.code).toBe('STORE_SCHEMA')
    expect(error.message).toContain('store.migrate()')
    await store.migrate()
    expect(await store.acquire('s', 'k', fp('a'), 1_000)).toEqual({ kind: 'acquired', token: 1 })
    await store.close()
  })

  it('migrates idempotently, also from several stores at once', async () => {
    const name = table('migrate')
    const stores = Array.from({ length: 4 }, () => new PostgresStore({ pool, table: name }))
    await Promise.all(stores.map((store) => store.migrate()))
    await (stores[0] as PostgresStore).migrate()
    const { rows } = await pool.query(`SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname`, [name])
    expect(rows.map((r) => r.indexname)).toEqual([`${name}_expires_at`, `${name}_in_progress`, `${name}_pkey`])
    const persistence = await pool.query(`SELECT relpersistence FROM pg_class WHERE relname = $1`, [name])
    expect(persistence.rows[0].relpersistence).toBe('p')
  })

  it('creates and uses a table in a named schema', async () => {
    const schema = `idemkey_schema_${suffix}`
    const store = new PostgresStore({ pool, schema, table: 'records' })
    await store.migrate()
    expect(await store.acquire('s', 'k', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
    const { rows } = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".records`)
    expect(rows[0].n).toBe(1)
  })

  it('refuses to migrate an UNLOGGED table, saying how to fix it', async () => {
    const name = table('unlogged')
    await new PostgresStore({ pool, table: name }).migrate()
    await pool.query(`ALTER TABLE "${name}" SET UNLOGGED`)
    await pool.query(`COMMENT ON TABLE "${name}" IS NULL`)
    const error = await failure(new PostgresStore({ pool, table: name }).migrate())
    expect(error.code).toBe('STORE_SCHEMA')
    expect(error.message).toContain('SET LOGGED')
  })

  it('refuses a table written by a newer idemkey', async () => {
    const name = table('newer')
    await new PostgresStore({ pool, table: name }).migrate()
    await pool.query(`COMMENT ON TABLE "${name}" IS 'idemkey schema 99'`)
    const error = await failure(new PostgresStore({ pool, table: name }).migrate())
    expect(error.code).toBe('STORE_SCHEMA')
    expect(error.message).toContain('Upgrade idemkey')
  })

  it('answers STORE_UNAVAILABLE with the driver error as cause when nothing listens on the port', async () => {
    const store = new PostgresStore({ connectionString: 'postgres://root@127.0.0.1:1/test', table: table('refused') })
    const error = await failure(store.acquire('s', 'k', fp('a'), 1_000))
    expect(error.code).toBe('STORE_UNAVAILABLE')
    expect((error.cause as { code?: string }).code).toBe('ECONNREFUSED')
    await store.close()
  })

  it('answers STORE_UNAVAILABLE naming the database when it does not exist, and the login when the role does not', async () => {
    const noDb = new PostgresStore({ connectionString: `postgres://root@127.0.0.1:5432/nodb_${suffix}` })
    const dbError = await failure(noDb.get('s', 'k'))
    expect(dbError.code).toBe('STORE_UNAVAILABLE')
    expect(dbError.message).toContain('database does not exist')
    await noDb.close()
    const noRole = new PostgresStore({ connectionString: `postgres://nobody_${suffix}@127.0.0.1:5432/test` })
    const roleError = await failure(noRole.get('s', 'k'))
    expect(roleError.code).toBe('STORE_UNAVAILABLE')
    expect(roleError.message).toContain('user and password')
    await noRole.close()
  })

  it('answers STORE_UNAVAILABLE with the GRANT to run when the user lacks privileges', async () => {
    const name = table('perm')
    await new PostgresStore({ pool, table: name }).migrate()
    const role = `idemkey_noperm_${suffix}`
    await pool.query(`CREATE ROLE "${role}" LOGIN`)
    const store = new PostgresStore({ connectionString: `postgres://${role}@127.0.0.1:5432/test`, table: name, max: 1 })
    const error = await failure(store.acquire('s', 'k', fp('a'), 1_000))
    expect(error.code).toBe('STORE_UNAVAILABLE')
    expect(error.message).toContain('GRANT SELECT, INSERT, UPDATE, DELETE')
    await store.close()
  })

  it('rejects a table or schema name that is not a plain identifier', () => {
    for (const bad of ['x"; DROP TABLE y; --', 'a.b', '', '1abc', 'x'.repeat(64)]) {
      expect(() => new PostgresStore({ pool, table: bad })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
      expect(() => new PostgresStore({ pool, schema: bad })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    }
    expect(() => new PostgresStore({} as never)).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
  })

  it('round-trips quotes, backslashes, unicode headers and a NUL-filled body exactly', async () => {
    const name = table('bytes')
    const store = new PostgresStore({ pool, table: name })
    await store.migrate()
    const scope = `tenant 'o\\"Brien' — Zürich 東京 🙂`
    const key = `'; SELECT pg_sleep(10); -- \\x00 "q"`
    const body = Uint8Array.from([0, 39, 34, 92, 0, 255, 0])
    const { token } = (await store.acquire(scope, key, fp('a'), 60_000)) as { token: number }
    const outcome = { ...sampleOutcome('completed', body), resourceId: 'ré\'sou"rce' }
    outcome.response.headers = { 'content-type': 'text/plain; charset=utf-8', etag: '"\\u0000 ☃"' }
    expect(await store.complete(scope, key, token, outcome, 60_000)).toBe(true)
    const replay = await store.acquire(scope, key, fp('a'), 60_000)
    expect(replay.kind).toBe('replay')
    if (replay.kind !== 'replay') return
    expect(replay.record.scope).toBe(scope)
    expect(replay.record.key).toBe(key)
    expect(replay.record.resourceId).toBe('ré\'sou"rce')
    expect(replay.record.response?.headers).toEqual(outcome.response.headers)
    expect(Buffer.from(replay.record.response?.body as Uint8Array)).toEqual(Buffer.from(body))
  })

  it('purges expired rows on its own with the gc option', async () => {
    const name = table('gc')
    const seed = new PostgresStore({ pool, table: name })
    await seed.migrate()
    for (let i = 0; i < 30; i++) {
      const { token } = (await seed.acquire('gc', `k${i}`, fp('a'), 60_000)) as { token: number }
      await seed.complete('gc', `k${i}`, token, sampleOutcome(), 1)
    }
    const store = new PostgresStore({ pool, table: name, gc: { interval: 20, batchSize: 7 } })
    const count = async () => (await pool.query(`SELECT count(*)::int AS n FROM "${name}"`)).rows[0].n as number
    for (let i = 0; i < 200 && (await count()) > 0; i++) await new Promise((resolve) => setTimeout(resolve, 20))
    expect(await count()).toBe(0)
    await store.close()
  })
})
