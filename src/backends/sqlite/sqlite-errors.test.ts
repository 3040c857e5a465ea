import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import Database from 'better-sqlite3'
import { SqliteStore } from './sqlite-store.js'

const dir = mkdtempSync(join(tmpdir(), 'idemkey-sqlite-errors-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

describe('SqliteStore bad input and setup', () => {
  it('reports a database it cannot open as STORE_UNAVAILABLE naming the path', () => {
    expect(() => new SqliteStore({ path: join(dir, 'missing-dir', 'x.db') })).toThrow(
      expect.objectContaining({ code: 'STORE_UNAVAILABLE', message: expect.stringContaining('missing-dir') }),
    )
  })

  it('says a path that is a directory is one, and names a file in it to give instead', () => {
    expect(() => new SqliteStore({ path: dir })).toThrow(
      expect.objectContaining({
        code: 'STORE_UNAVAILABLE',
        message: `sqlite: cannot open "${dir}": it is a directory. Give the path of a database file, e.g. "${join(dir, 'idemkey.db')}".`,
      }),
    )
  })

  it('refuses an empty path, which SQLite would open as a private temporary database that no other process sees', () => {
    expect(() => new SqliteStore({ path: '' })).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: expect.stringMatching(/^SqliteStore path is empty: .*":memory:" for a test\.$/),
      }),
    )
  })

  it('refuses a table name that is not a plain identifier', () => {
    expect(() => new SqliteStore({ path: ':memory:', table: 'records; DROP TABLE x' })).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION' }),
    )
  })

  it('refuses a schema written by a newer release with STORE_SCHEMA', () => {
    const path = join(dir, 'newer.db')
    new Database(path).exec(
      "CREATE TABLE idemkey_records_meta (name TEXT PRIMARY KEY, value TEXT); INSERT INTO idemkey_records_meta VALUES ('schema_version', '99')",
    )
    expect(() => new SqliteStore({ path })).toThrow(
      expect.objectContaining({ code: 'STORE_SCHEMA', message: expect.stringContaining('Upgrade idemkey') }),
    )
  })

  it('creates the schema once and opens it again idempotently', async () => {
    const path = join(dir, 'twice.db')
    const first = new SqliteStore({ path })
    await first.close()
    const second = new SqliteStore({ path })
    const db = new Database(path)
    expect(db.prepare("SELECT value FROM idemkey_records_meta WHERE name = 'schema_version'").get()).toEqual({ value: '2' })
    expect(db.pragma('journal_mode', { simple: true })).toBe('wal')
    db.close()
    await second.close()
  })

  it('upgrades a version-1 table in place: its in-progress record keeps its token and takes steps', async () => {
    const path = join(dir, 'v1.db')
    const old = new Database(path)
    old.exec(`
      CREATE TABLE idemkey_records_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
      INSERT INTO idemkey_records_meta VALUES ('schema_version', '1');
      CREATE TABLE idemkey_records (scope TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')), token INTEGER NOT NULL,
        locked_until INTEGER, response_status INTEGER, response_headers TEXT, response_body BLOB, resource_id TEXT,
        attempts INTEGER NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, expires_at INTEGER NOT NULL);
      CREATE UNIQUE INDEX idemkey_records_identity ON idemkey_records (scope, key);`)
    const fp = 'a'.repeat(64)
    const far = Date.now() + 3_600_000
    old
      .prepare(`INSERT INTO idemkey_records VALUES ('s', 'k', ?, 'in_progress', 3, ?, NULL, NULL, NULL, NULL, 3, 1, 1, ?)`)
      .run(fp, far, far)
    old.close()
    const store = new SqliteStore({ path })
    expect(await store.recordStep('s', 'k', 3, 'reserve', '1')).toBe(true)
    expect(await store.release('s', 'k', 3)).toBe(true)
    expect(await store.acquire('s', 'k', fp, 30_000)).toEqual({ kind: 'acquired', token: 4, steps: [{ name: 'reserve', result: '1' }] })
    await store.close()
  })

  it('gives a new file 1 KiB pages and leaves the page size of an existing file alone', async () => {
    const fresh = join(dir, 'fresh.db')
    await new SqliteStore({ path: fresh }).close()
    const existing = join(dir, 'existing.db')
    const before = new Database(existing)
    before.pragma('page_size = 4096')
    before.exec('CREATE TABLE other (x)')
    before.close()
    const store = new SqliteStore({ path: existing })
    expect((await store.acquire('s', 'k', 'a'.repeat(64), 1_000)).kind).toBe('acquired')
    await store.close()
    for (const [path, pageSize] of [
      [fresh, 1024],
      [existing, 4096],
    ] as const) {
      const db = new Database(path)
      expect(db.pragma('page_size', { simple: true }), path).toBe(pageSize)
      expect(db.pragma('journal_mode', { simple: true }), path).toBe('wal')
      db.close()
    }
  })

  it('turns operations on a closed database into STORE_UNAVAILABLE, not a crash', async () => {
    const store = new SqliteStore({ path: join(dir, 'closed.db') })
    await store.close()
    await expect(store.get('s', 'k')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
  })

  it('uses an existing better-sqlite3 database without closing it', async () => {
    const db = new Database(':memory:')
    const store = new SqliteStore({ database: db, table: 'my_records' })
    expect(store.driver).toBe('better-sqlite3')
    expect((await store.acquire('s', 'k', 'a'.repeat(64), 1_000)).kind).toBe('acquired')
    await store.close()
    expect(db.open).toBe(true)
    expect(db.prepare('SELECT count(*) AS n FROM my_records').get()).toEqual({ n: 1 })
    db.close()
  })

  it('uses an existing node:sqlite database without closing it', async () => {
    const db = new DatabaseSync(':memory:')
    const store = new SqliteStore({ database: db, table: 'my_records' })
    expect(store.driver).toBe('node:sqlite')
    expect((await store.acquire('s', 'k', 'a'.repeat(64), 1_000)).kind).toBe('acquired')
    await store.close()
    expect(db.isOpen).toBe(true)
    expect({ ...(db.prepare('SELECT count(*) AS n FROM my_records').get() as object) }).toEqual({ n: 1 })
    db.close()
  })

  it('opens its file with node:sqlite by default, and with the driver `open` returns, which it closes', async () => {
    const byDefault = new SqliteStore({ path: join(dir, 'default.db') })
    expect(byDefault.driver).toBe('node:sqlite')
    await byDefault.close()
    let opened: InstanceType<typeof Database> | undefined
    const custom = new SqliteStore({ path: join(dir, 'custom.db'), open: (path) => (opened = new Database(path)) })
    expect(custom.driver).toBe('better-sqlite3')
    await custom.close()
    expect(opened?.open).toBe(false)
  })

  it('refuses { database } and { open } together, and a database of neither driver, with INVALID_OPTION', () => {
    const db = new DatabaseSync(':memory:')
    expect(() => new SqliteStore({ database: db, open: () => db })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    const notADatabase = { prepare() {}, exec() {} } as unknown as DatabaseSync
    expect(() => new SqliteStore({ database: notADatabase })).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: expect.stringMatching(/node:sqlite DatabaseSync .* better-sqlite3 Database/),
      }),
    )
    db.close()
  })

  it('says there is no SQLite driver and what to install on a runtime without node:sqlite, never "not writable"', () => {
    const builtin = vi.spyOn(process, 'getBuiltinModule').mockReturnValue(undefined as never)
    try {
      const error = (() => {
        try {
          new SqliteStore({ path: join(dir, 'no-driver.db') })
        } catch (thrown) {
          return thrown as Error & { code: string }
        }
        throw new Error('expected a throw')
      })()
      expect(error.code).toBe('STORE_UNAVAILABLE')
      expect(error.message).toMatch(/no SQLite driver: Node\.js v\d+.* has no built-in node:sqlite/)
      expect(error.message).toContain('npm i better-sqlite3')
      expect(error.message).not.toMatch(/writable/)
    } finally {
      builtin.mockRestore()
    }
  })
})
