/**
 * How SqliteStore sets up the database it opens or is given (pragmas, page size), what it says about
 * itself, and its in-process change notifications: the parts the store contract does not look at.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { ManualClock } from '../../core/clock.js'
import { SqliteStore } from './sqlite-store.js'

const dir = mkdtempSync(join(tmpdir(), 'idemkey-sqlite-setup-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
let n = 0
const file = () => join(dir, `setup-${++n}.db`)
const FP = 'a0'.repeat(32)
const OUTCOME = { status: 'completed' as const, response: { status: 200, headers: {}, body: new Uint8Array([123, 125]) } }

/** Reads one pragma of a connection. */
const pragmaOf = (db: DatabaseSync) => (name: string) => Object.values(db.prepare(`PRAGMA ${name}`).get() as object)[0]

/** A store that opens its file through `open`, so the test can read the connection's pragmas. */
function opened(options: ConstructorParameters<typeof SqliteStore>[0] = {}) {
  let db: DatabaseSync | undefined
  const store = new SqliteStore({
    path: file(),
    ...options,
    open: (path) => {
      db = new DatabaseSync(path)
      return db
    },
  })
  return { store, pragma: pragmaOf(db as DatabaseSync) }
}

describe('SqliteStore setup', () => {
  it('runs a file it opens in WAL with synchronous NORMAL, a 5 s busy timeout, 1 KiB pages and a 4 MiB checkpoint', async () => {
    const { store, pragma } = opened()
    expect(pragma('journal_mode')).toBe('wal')
    expect(pragma('synchronous')).toBe(1)
    expect(pragma('busy_timeout')).toBe(5_000)
    expect(pragma('page_size')).toBe(1_024)
    expect(pragma('wal_autocheckpoint')).toBe(4_096)
    await store.close()
  })

  it('takes synchronous FULL and another busy timeout when asked', async () => {
    const { store, pragma } = opened({ synchronous: 'full', busyTimeout: '2s' })
    expect(pragma('synchronous')).toBe(2)
    expect(pragma('busy_timeout')).toBe(2_000)
    await store.close()
  })

  it('leaves the page size of a database it is given, and leaves that database open on close', async () => {
    const db = new DatabaseSync(file())
    const store = new SqliteStore({ database: db })
    const pragma = pragmaOf(db)
    expect(pragma('page_size')).toBe(4_096)
    expect(pragma('journal_mode')).toBe('wal')
    await store.close()
    expect(db.isOpen).toBe(true)
    db.close()
  })

  it('keeps an in-memory database out of WAL', async () => {
    const { store, pragma } = opened({ path: ':memory:' })
    expect(pragma('journal_mode')).toBe('memory')
    await store.close()
  })

  it('says what it is: sqlite, on the caller clock', async () => {
    const store = new SqliteStore({ path: ':memory:' })
    expect(store.name).toBe('sqlite')
    expect(store.serverClock).toBe(false)
    await store.close()
  })

  it('refuses a table name that is no plain identifier, and both database and open, saying why', () => {
    expect(() => new SqliteStore({ path: ':memory:', table: 'records; DROP' })).toThrow(
      'SqliteStore table "records; DROP" must be a plain SQL identifier (letters, digits, underscore).',
    )
    const db = new DatabaseSync(':memory:')
    expect(() => new SqliteStore({ database: db, open: () => db })).toThrow(/takes \{ database \} .* or \{ open \} .*, not both/)
    db.close()
  })

  it('says which file it could not open, with the driver error as the cause', () => {
    let caught: unknown
    try {
      new SqliteStore({ path: join(dir, 'missing-dir', 'x.db') })
    } catch (error) {
      caught = error
    }
    expect(caught).toMatchObject({ code: 'STORE_UNAVAILABLE' })
    expect((caught as Error).message).toMatch(/cannot open ".*missing-dir\/x\.db".*Check that the directory exists/)
    expect((caught as Error).cause).toBeInstanceOf(Error)
  })

  it('answers get only while the record lives: not at its expiry instant', async () => {
    const clock = new ManualClock()
    const store = new SqliteStore({ path: ':memory:', clock })
    await store.acquire('s', 'k', FP, 1_000)
    await store.complete('s', 'k', 1, OUTCOME, 5_000)
    clock.advance(4_999)
    expect(await store.get('s', 'k')).not.toBeNull()
    clock.advance(1)
    expect(await store.get('s', 'k')).toBeNull()
    await store.close()
  })
})

describe('SqliteStore notifications', () => {
  it('tells watchers of a complete, a release and an evict that changed the record, and nothing else', async () => {
    const store = new SqliteStore({ path: ':memory:' })
    const seen: string[] = []
    const stop = store.watch('s', 'k', () => seen.push('k'))
    store.watch('s', 'other', () => seen.push('other'))
    await store.acquire('s', 'k', FP, 60_000)
    expect(await store.release('s', 'k', 2)).toBe(false) // a stale token changes nothing
    expect(seen).toEqual([])
    expect(await store.release('s', 'k', 1)).toBe(true)
    expect(seen).toEqual(['k'])
    await store.acquire('s', 'k', FP, 60_000)
    await store.complete('s', 'k', 2, OUTCOME, 60_000)
    expect(seen).toEqual(['k', 'k'])
    expect(await store.evict('s', 'missing')).toBe(false)
    expect(seen).toEqual(['k', 'k'])
    expect(await store.evict('s', 'k')).toBe(true)
    expect(seen).toEqual(['k', 'k', 'k'])
    stop()
    await store.acquire('s', 'k', FP, 60_000)
    await store.release('s', 'k', 1)
    expect(seen).toEqual(['k', 'k', 'k'])
    await store.close()
  })

  it('keeps the other watchers of a record when one stops', async () => {
    const store = new SqliteStore({ path: ':memory:' })
    const seen: string[] = []
    const stopA = store.watch('s', 'k', () => seen.push('a'))
    store.watch('s', 'k', () => seen.push('b'))
    stopA()
    await store.acquire('s', 'k', FP, 60_000)
    await store.release('s', 'k', 1)
    expect(seen).toEqual(['b'])
    await store.close()
  })
})
