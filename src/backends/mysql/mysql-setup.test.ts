import mysql from 'mysql2/promise'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { fp, sampleOutcome } from '../../testing/index.js'
import { MySqlStore } from './mysql-store.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
const table = `idemkey_setup_${process.pid}_${Date.now().toString(36)}`
if (skip) console.warn(`\n!!! SKIPPED: MySqlStore setup tests: ${skip}\n`)
const ALL_BYTES = Uint8Array.from({ length: 256 }, (_, i) => i)

describe.skipIf(skip !== undefined)('MySqlStore setup, errors and exact round trips', () => {
  const pool = mysql.createPool({ uri: URI, connectionLimit: 4 })
  const store = new MySqlStore({ pool, table })
  const drop = (name: string) => pool.query(`DROP TABLE IF EXISTS \`${name}\`, \`${name}_meta\``)

  beforeAll(() => store.migrate())
  afterAll(async () => {
    await store.close()
    await drop(table)
    await drop(`${table}_missing`)
    await drop(`${table}_newer`)
    await drop(`${table}_v1`)
    await pool.end()
  })

  it('reports a missing table as STORE_SCHEMA naming store.migrate() and idemkey migrate', async () => {
    const missing = new MySqlStore({ pool, table: `${table}_missing` })
    for (const attempt of [() => missing.acquire('s', 'k', fp('a'), 1_000), () => missing.get('s', 'k'), () => missing.list()]) {
      await expect(attempt()).rejects.toMatchObject({
        code: 'STORE_SCHEMA',
        message: expect.stringMatching(/store\.migrate\(\).*idemkey migrate/),
        cause: expect.objectContaining({ errno: 1146 }),
      })
    }
  })

  it('migrates idempotently, also from several stores at once, and records the schema version', async () => {
    const name = `${table}_missing`
    await Promise.all(Array.from({ length: 4 }, () => new MySqlStore({ pool, table: name }).migrate()))
    await new MySqlStore({ pool, table: name }).migrate()
    const [rows] = await pool.query(`SELECT value FROM \`${name}_meta\` WHERE name = 'schema_version'`)
    expect(rows).toEqual([{ value: '2' }])
    const [engine] = await pool.query('SELECT engine FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?', [
      name,
    ])
    expect(engine).toEqual([{ engine: 'InnoDB' }])
  })

  it('upgrades a version-1 table in place: its in-progress record keeps its token and takes steps', async () => {
    const name = `${table}_v1`
    await pool.query(`CREATE TABLE \`${name}\` (scope VARBINARY(1020) NOT NULL, \`key\` VARBINARY(255) NOT NULL,
      fingerprint CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, status ENUM('in_progress', 'completed', 'failed') NOT NULL,
      token BIGINT NOT NULL, locked_until BIGINT NULL, response_status SMALLINT NULL, response_headers MEDIUMTEXT NULL,
      response_body LONGBLOB NULL, resource_id TEXT NULL, attempts INT NOT NULL, created_at BIGINT NOT NULL,
      updated_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, claim BINARY(16) NOT NULL, revision BIGINT NOT NULL DEFAULT 0,
      PRIMARY KEY (scope, \`key\`)) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`)
    await pool.query(
      `CREATE TABLE \`${name}_meta\` (name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY, value VARCHAR(255) NOT NULL)`,
    )
    await pool.query(`INSERT INTO \`${name}_meta\` VALUES ('schema_version', '1')`)
    const far = Date.now() + 3_600_000
    await pool.query(
      `INSERT INTO \`${name}\` (scope, \`key\`, fingerprint, status, token, locked_until, attempts, created_at, updated_at, expires_at, claim)
       VALUES ('s', 'k', ?, 'in_progress', 3, ?, 3, 1, 1, ?, REPEAT('x', 16))`,
      [fp('a'), far, far],
    )
    const upgraded = new MySqlStore({ pool, table: name })
    await upgraded.migrate()
    expect(await upgraded.recordStep('s', 'k', 3, 'reserve', '1')).toBe(true)
    expect(await upgraded.release('s', 'k', 3)).toBe(true)
    expect(await upgraded.acquire('s', 'k', fp('a'), 30_000)).toEqual({
      kind: 'acquired',
      token: 4,
      steps: [{ name: 'reserve', result: '1' }],
    })
    const [rows] = await pool.query(`SELECT value FROM \`${name}_meta\` WHERE name = 'schema_version'`)
    expect(rows).toEqual([{ value: '2' }])
  })

  it('refuses a schema written by a newer release with STORE_SCHEMA', async () => {
    const name = `${table}_newer`
    await pool.query(`CREATE TABLE \`${name}_meta\` (name VARCHAR(64) PRIMARY KEY, value VARCHAR(255) NOT NULL)`)
    await pool.query(`INSERT INTO \`${name}_meta\` VALUES ('schema_version', '99')`)
    await expect(new MySqlStore({ pool, table: name }).migrate()).rejects.toMatchObject({
      code: 'STORE_SCHEMA',
      message: expect.stringContaining('Upgrade idemkey'),
    })
  })

  it('refuses bad options with INVALID_OPTION', () => {
    expect(() => new MySqlStore({ pool, table: 'x; DROP TABLE y' })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    expect(() => new MySqlStore({})).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    expect(() => new MySqlStore({ pool, uri: URI })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
  })

  it('reports a refused connection as STORE_UNAVAILABLE with the driver error as cause', async () => {
    // Port 1 on loopback: nothing listens there.
    const down = new MySqlStore({ uri: 'mysql://root@127.0.0.1:1/test?connectTimeout=2000', table })
    await expect(down.get('s', 'k')).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      cause: expect.objectContaining({ code: 'ECONNREFUSED' }),
    })
    await down.close()
  })

  it('reports access denied as STORE_UNAVAILABLE saying to check the credentials', async () => {
    const denied = new MySqlStore({ uri: 'mysql://idemkey_nobody:wrong@127.0.0.1:3306/test', table })
    await expect(denied.acquire('s', 'k', fp('a'), 1_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringContaining('Check the user, password and database'),
      cause: expect.objectContaining({ sqlState: '28000' }),
    })
    await denied.close()
  })

  it('says to check the database when the URI names none ("No database selected" is no outage to retry)', async () => {
    const none = new MySqlStore({ uri: 'mysql://root@127.0.0.1:3306/', table })
    await expect(none.acquire('s', 'k', fp('a'), 1_000)).rejects.toMatchObject({
      code: 'STORE_UNAVAILABLE',
      message: expect.stringMatching(/^mysql: acquire failed: No database selected\. Check the user, password and database/),
    })
    await none.close()
  })

  it('opens and closes its own pool from a URI, and leaves a given pool open', async () => {
    const own = new MySqlStore({ uri: URI, table })
    expect((await own.acquire('uri', 'k', fp('a'), 60_000)).kind).toBe('acquired')
    await own.close()
    await expect(own.get('uri', 'k')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    const [rows] = await pool.query('SELECT 1 AS one')
    expect(rows).toEqual([{ one: 1 }])
  })

  it('keeps keys that differ only in case or trailing spaces apart (binary identity, no PAD SPACE)', async () => {
    const keys = ['k', 'K', 'k ', ' k', 'k  ']
    for (const key of keys) expect(await store.acquire('pad', key, fp('a'), 60_000)).toEqual({ kind: 'acquired', token: 1 })
    expect((await store.list({ scope: 'pad' })).map((r) => r.key).sort()).toEqual([...keys].sort())
  })

  it('round-trips keys with quotes, unicode scopes, all 256 byte values and unicode headers exactly', async () => {
    const scopes = ['Zürich', '東京', '🙂 tenant', 'o\'brien "quoted" \\ back', 'Ａ', 'A', 'a']
    const key = `'"\`; DROP TABLE ${table}; -- \\ %_`
    const outcome = sampleOutcome('completed', ALL_BYTES)
    outcome.response.headers['content-location'] = '/ünïcode/🙂'
    outcome.resourceId = 'ресурс-🙂'
    for (const scope of scopes) {
      const { token } = (await store.acquire(scope, key, fp(scope), 60_000)) as { token: number }
      expect(token).toBe(1)
      expect(await store.complete(scope, key, token, outcome, 60_000)).toBe(true)
    }
    for (const scope of scopes) {
      const replay = await store.acquire(scope, key, fp(scope), 60_000)
      if (replay.kind !== 'replay') throw new Error(`expected a replay in scope ${scope}, got ${replay.kind}`)
      expect(replay.record.scope).toBe(scope)
      expect(replay.record.key).toBe(key)
      expect(Buffer.from(replay.record.response?.body as Uint8Array).equals(Buffer.from(ALL_BYTES))).toBe(true)
      expect(replay.record.response?.headers).toEqual(outcome.response.headers)
      expect(replay.record.resourceId).toBe('ресурс-🙂')
      expect((await store.list({ scope })).map((r) => r.scope)).toEqual([scope])
    }
  })

  it('takes renew, release and complete by the holder as done also without CLIENT_FOUND_ROWS', async () => {
    // Without the flag MySQL counts changed rows, not matched ones: two writes of the same values in
    // one millisecond would report 0. Every write bumps `revision`, so a matched row always changes.
    const bare = mysql.createPool({ uri: URI, connectionLimit: 4, flags: ['-FOUND_ROWS'] })
    const plain = new MySqlStore({ pool: bare, table })
    try {
      const { token } = (await plain.acquire('flags', 'k', fp('a'), 60_000)) as { token: number }
      const renewed = await Promise.all(Array.from({ length: 20 }, () => plain.renew('flags', 'k', token, 60_000)))
      expect(renewed).toEqual(Array(20).fill(true))
      expect(await Promise.all(Array.from({ length: 8 }, () => plain.release('flags', 'k', token)))).toEqual(Array(8).fill(true))
      expect(await plain.renew('flags', 'k', token + 1, 60_000)).toBe(false)
      expect(await plain.complete('flags', 'k', token, sampleOutcome(), 60_000)).toBe(true)
      expect(await plain.complete('flags', 'k', token, sampleOutcome(), 60_000)).toBe(false)
    } finally {
      await bare.end()
    }
  })

  it('retries a write that timed out behind a row lock, and gives up with STORE_UNAVAILABLE after lockRetries', async () => {
    const short = mysql.createPool({ uri: URI, connectionLimit: 2 })
    short.on('connection', (connection) => {
      connection.query('SET SESSION innodb_lock_wait_timeout = 1')
    })
    const holder = await pool.getConnection()
    try {
      const { token } = (await store.acquire('locks', 'k', fp('a'), 60_000)) as { token: number }
      await holder.query('START TRANSACTION')
      await holder.query(`SELECT token FROM \`${table}\` WHERE scope = ? AND \`key\` = ? FOR UPDATE`, [
        Buffer.from('locks'),
        Buffer.from('k'),
      ])
      const impatient = new MySqlStore({ pool: short, table, lockRetries: 0 })
      await expect(impatient.renew('locks', 'k', token, 60_000)).rejects.toMatchObject({
        code: 'STORE_UNAVAILABLE',
        cause: expect.objectContaining({ errno: 1205 }),
      })
      const patient = new MySqlStore({ pool: short, table, lockRetries: 5 })
      const renewing = patient.renew('locks', 'k', token, 60_000)
      // Longer than one lock wait timeout, shorter than all the retries: the first attempt times out.
      await new Promise((resolve) => setTimeout(resolve, 1_500))
      await holder.query('COMMIT')
      expect(await renewing).toBe(true)
    } finally {
      holder.release()
      await short.end()
    }
  })

  it('rejects bad input before it reaches the server', async () => {
    await expect(store.acquire('s', 'ключ', fp('a'), 1_000)).rejects.toMatchObject({ code: 'KEY_INVALID' })
    await expect(store.renew('s', 'k', 1, 0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
    await expect(store.purgeExpired(1.5)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
    await expect(store.list({ limit: -1 })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
  })
})
