import { IdempotencyError } from '../../errors.js'

/**
 * The two SQLite drivers idemkey runs on, behind one small connection:
 * - `node:sqlite` (`DatabaseSync`), built into Node.js 22.16+, 24, 26, Bun and Deno: the default, with
 *   nothing to install or build;
 * - better-sqlite3 (13 or later), a `Database` the user opens and passes: an optional peer for those
 *   who measure it faster for their workload or already use it.
 * Both are synchronous, with the same SQLite underneath; what differs (transaction helpers, pragma
 * helpers, the names of the open and in-transaction flags) is bridged here, in plain SQL.
 */

/** A prepared statement, as both drivers shape it. */
export interface SqliteStatement {
  run(...params: unknown[]): { changes: number | bigint }
  get(...params: unknown[]): unknown
  all(...params: unknown[]): unknown[]
}

/** The part of node:sqlite's `DatabaseSync` idemkey uses (structural: any compatible runtime fits). */
export interface NodeSqliteDatabase {
  prepare(sql: string): SqliteStatement
  exec(sql: string): unknown
  readonly isOpen: boolean
  readonly isTransaction: boolean
  close(): unknown
}

/** The part of better-sqlite3's `Database` idemkey uses (structural: any compatible version fits). */
export interface BetterSqlite3Database {
  prepare(sql: string): SqliteStatement
  exec(sql: string): unknown
  readonly open: boolean
  readonly inTransaction: boolean
  close(): unknown
}

/** An open SQLite database from either driver: node:sqlite's `DatabaseSync` or better-sqlite3's `Database`. */
export type SqliteDatabase = NodeSqliteDatabase | BetterSqlite3Database

/** Which driver a connection runs on. */
export type SqliteDriverName = 'node:sqlite' | 'better-sqlite3'

/** One database, whichever driver opened it. */
export interface SqliteConnection {
  readonly driver: SqliteDriverName
  /** The database object as the driver made it (what the user passed, or what idemkey opened). */
  readonly database: SqliteDatabase
  readonly isOpen: boolean
  readonly inTransaction: boolean
  prepare(sql: string): SqliteStatement
  exec(sql: string): void
  /** Sets a pragma (`name = value`, returns undefined) or reads one (`name`, returns its value). */
  pragma(sql: string): unknown
  /**
   * Runs `fn` in a `BEGIN IMMEDIATE` transaction (the write lock taken up front, so a busy file waits
   * in BEGIN for busy_timeout instead of failing at the first write), committed when `fn` returns and
   * rolled back when it throws. Inside another transaction it is a savepoint instead.
   */
  immediate<R>(fn: () => R): R
  close(): void
}

/** Whether `value` looks like a database of one of the two drivers. */
export function isSqliteDatabase(value: unknown): value is SqliteDatabase {
  const db = value as Partial<NodeSqliteDatabase & BetterSqlite3Database> | null
  return (
    typeof db === 'object' &&
    db !== null &&
    typeof db.prepare === 'function' &&
    typeof db.exec === 'function' &&
    (typeof db.isTransaction === 'boolean' || typeof db.inTransaction === 'boolean')
  )
}

/** Wraps a database of either driver. Throws INVALID_OPTION, naming what was expected, for anything else. */
export function connect(database: SqliteDatabase, what = 'the SQLite store'): SqliteConnection {
  if (!isSqliteDatabase(database)) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${what} needs an open SQLite database: a node:sqlite DatabaseSync (new DatabaseSync(path)) or a better-sqlite3 Database (13 or later).`,
    )
  }
  return new Connection(database)
}

/** node:sqlite, when this runtime has it (Node.js 22.16+, Bun, Deno); undefined otherwise. */
export function loadNodeSqlite(): typeof import('node:sqlite') | undefined {
  try {
    return process.getBuiltinModule?.('node:sqlite') as typeof import('node:sqlite') | undefined
  } catch {
    return undefined
  }
}

/** The message for a runtime that has no built-in SQLite, saying what to do instead. */
export function noDriverMessage(): string {
  const runtime = process.versions.bun
    ? `Bun ${process.versions.bun}`
    : process.versions.deno
      ? `Deno ${process.versions.deno}`
      : `Node.js ${process.version}`
  return (
    `no SQLite driver: ${runtime} has no built-in node:sqlite (Node.js 22.16 or later, 24 and 26, Bun and Deno 2 have it). ` +
    'Run on a supported Node.js (22.16+, 24 or 26), or install better-sqlite3 13+ (npm i better-sqlite3) and pass ' +
    "its database: new SqliteStore({ database: new Database('idemkey.db') }), or use the URL sqlite:idemkey.db?driver=better-sqlite3."
  )
}

/** Opens (creating it if absent) a database file with node:sqlite. Throws STORE_UNAVAILABLE when there is no driver. */
export function openNodeSqlite(path: string, options: { readOnly?: boolean } = {}): SqliteConnection {
  const sqlite = loadNodeSqlite()
  if (!sqlite) throw new IdempotencyError('STORE_UNAVAILABLE', `sqlite: ${noDriverMessage()}`)
  return new Connection(new sqlite.DatabaseSync(path, { readOnly: options.readOnly ?? false }) as unknown as NodeSqliteDatabase)
}

class Connection implements SqliteConnection {
  readonly driver: SqliteDriverName
  readonly database: SqliteDatabase
  readonly #node: NodeSqliteDatabase | undefined
  readonly #better: BetterSqlite3Database | undefined
  #begin: SqliteStatement | undefined
  #commit: SqliteStatement | undefined
  #rollback: SqliteStatement | undefined
  #savepoints = 0

  constructor(database: SqliteDatabase) {
    this.database = database
    if (typeof (database as NodeSqliteDatabase).isTransaction === 'boolean') {
      this.driver = 'node:sqlite'
      this.#node = database as NodeSqliteDatabase
    } else {
      this.driver = 'better-sqlite3'
      this.#better = database as BetterSqlite3Database
    }
  }

  get isOpen(): boolean {
    return this.#node ? this.#node.isOpen : (this.#better as BetterSqlite3Database).open
  }

  get inTransaction(): boolean {
    return this.#node ? this.#node.isTransaction : (this.#better as BetterSqlite3Database).inTransaction
  }

  prepare(sql: string): SqliteStatement {
    return this.database.prepare(sql)
  }

  exec(sql: string): void {
    this.database.exec(sql)
  }

  pragma(sql: string): unknown {
    // An assignment runs as a script: some return no row, which better-sqlite3's get() refuses.
    if (sql.includes('=')) {
      this.database.exec(`PRAGMA ${sql}`)
      return undefined
    }
    const row = this.database.prepare(`PRAGMA ${sql}`).get() as Record<string, unknown> | undefined
    return row === undefined ? undefined : Object.values(row)[0]
  }

  immediate<R>(fn: () => R): R {
    if (this.inTransaction) return this.#savepoint(fn)
    // Prepared once: the hot path (every group commit) binds nothing and parses nothing.
    this.#begin ??= this.database.prepare('BEGIN IMMEDIATE')
    this.#commit ??= this.database.prepare('COMMIT')
    this.#rollback ??= this.database.prepare('ROLLBACK')
    this.#begin.run()
    let result: R
    try {
      result = fn()
    } catch (error) {
      // SQLite may have rolled back already (some errors end the transaction themselves).
      if (this.inTransaction) this.#rollback.run()
      throw error
    }
    try {
      this.#commit.run()
    } catch (error) {
      if (this.inTransaction) this.#rollback.run()
      throw error
    }
    return result
  }

  #savepoint<R>(fn: () => R): R {
    const name = `idemkey_${++this.#savepoints}`
    this.database.exec(`SAVEPOINT ${name}`)
    try {
      const result = fn()
      this.database.exec(`RELEASE ${name}`)
      return result
    } catch (error) {
      if (this.inTransaction) this.database.exec(`ROLLBACK TO ${name}; RELEASE ${name}`)
      throw error
    } finally {
      this.#savepoints--
    }
  }

  close(): void {
    if (this.isOpen) this.database.close()
  }
}

/**
 * Runs `fn` in one transaction on `database` (either driver): `BEGIN IMMEDIATE`, committed when
 * `fn` returns, rolled back when it throws; a savepoint when a transaction is already open. `fn` must
 * be synchronous: a SQLite transaction cannot span an await.
 *
 * @example
 * sqliteTransaction(db, () => {
 *   db.prepare('INSERT INTO orders (id) VALUES (?)').run(orderId)
 *   outbox.add(db, { topic: 'orders.created', payload: { orderId } })
 * })
 */
export function sqliteTransaction<R>(database: SqliteDatabase, fn: () => R): R {
  const connection = connect(database, 'sqliteTransaction')
  return connection.immediate(() => {
    const result = fn()
    if (result instanceof Promise) {
      result.catch(() => {})
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        'sqliteTransaction: the function returned a promise. SQLite transactions are synchronous and cannot span an await: do the async work before or after.',
      )
    }
    return result
  })
}
