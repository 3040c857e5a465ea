/**
 * Statements with a deadline (docs/mysql.md, `queryTimeout`). mysql2 has a per-query `timeout`, but
 * when it fires the command stays queued on its connection: on a half-open connection (a NAT or
 * firewall that forgot it, a vanished host) every later statement on that connection waits behind it
 * for ever, and `pool.end()` never resolves. So the store takes a connection per statement, and when a
 * statement outlives its deadline it destroys that connection: the statement fails with
 * STORE_UNAVAILABLE and the pool opens a fresh connection for the next one.
 */
import { endWithin, type PoolSocket } from '../end-pool.js'
import type { ConnectionSource, MySqlConnectionLike, MySqlPoolLike, MySqlValue } from './pool.js'

/** The error a statement past its deadline fails with (typed STORE_UNAVAILABLE by the store). */
export class StatementTimeoutError extends Error {
  readonly code = 'IDEMKEY_STATEMENT_TIMEOUT'
  constructor(timeoutMs: number) {
    super(
      `no answer from the server within queryTimeout (${timeoutMs} ms); the connection was dropped (half-open, or the server is stalled)`,
    )
    this.name = 'StatementTimeoutError'
  }
}

/** A pool connection as mysql2 hands it out: `destroy()` takes it out of the pool for good. */
interface Destroyable extends MySqlConnectionLike, Underlying {
  destroy?(): void
  /** mysql2's promise wrapper (a new one at every `getConnection`) around the pool's own connection. */
  connection?: Underlying
}

/** mysql2's connection under the promise wrapper: the same object each time the pool lends it. */
interface Underlying {
  destroy?(): void
  _closing?: boolean
  stream?: PoolSocket
}

/**
 * A view of `pool` whose statements are bounded by `timeoutMs`, and whose connections (for the store's
 * own transactions: migrate's lock, a group-commit batch) are too; `end()` is bounded the same way.
 */
export class BoundedPool implements MySqlPoolLike {
  readonly #pool: MySqlPoolLike
  readonly #timeoutMs: number
  /** The pool's connections (mysql2's own, under the wrapper): what `end()` destroys if the server never says goodbye. */
  readonly #seen = new Set<Underlying>()

  /**
   * The same pool without deadlines, for statements that may rightly run long (your transactions,
   * migrate's named lock). Its connections are still the ones `end()` knows: one left half-open is
   * destroyed at close like the rest, rather than keeping the process alive.
   */
  readonly unbounded: ConnectionSource = { getConnection: () => this.#take() }

  constructor(pool: MySqlPoolLike, timeoutMs: number) {
    this.#pool = pool
    this.#timeoutMs = timeoutMs
  }

  query(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]> {
    return this.#once((connection) => connection.query(sql, values))
  }

  execute(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]> {
    return this.#once((connection) => connection.execute(sql, values))
  }

  async getConnection(): Promise<MySqlConnectionLike> {
    return new BoundedConnection(await this.#take(), this.#timeoutMs)
  }

  /**
   * Ends the pool and closes every connection it lent. mysql2 counts a connection as ended once its QUIT
   * is written (on a busy one, once the statement before it answers) and leaves the socket for the
   * server to close; the far side of a half-open connection does neither. So the connections get the
   * deadline to close, and those still open then are destroyed: a statement still waiting on one fails
   * with {@link StatementTimeoutError}.
   */
  async end(): Promise<void> {
    const ended = this.#pool.end?.() ?? Promise.resolve()
    const sockets = [...this.#seen].flatMap((connection) => (connection.stream ? [connection.stream] : []))
    try {
      await endWithin(ended, sockets, this.#timeoutMs, () => new StatementTimeoutError(this.#timeoutMs))
    } finally {
      this.#seen.clear()
    }
  }

  async #take(): Promise<Destroyable> {
    const connection = (await this.#pool.getConnection()) as Destroyable
    const underlying = connection.connection ?? connection
    if (!this.#seen.has(underlying)) {
      // A connection the pool just opened: forget the ones it has closed since (few; reconnects are rare).
      for (const known of this.#seen) if (known._closing || known.stream?.destroyed) this.#seen.delete(known)
      this.#seen.add(underlying)
    }
    return connection
  }

  async #once<R>(statement: (connection: MySqlConnectionLike) => Promise<R>): Promise<R> {
    const connection = new BoundedConnection(await this.#take(), this.#timeoutMs)
    try {
      return await statement(connection)
    } finally {
      connection.release()
    }
  }
}

/** One pool connection whose statements are bounded; once one timed out, releasing it destroys it. */
class BoundedConnection implements MySqlConnectionLike {
  readonly #connection: Destroyable
  readonly #timeoutMs: number
  #dropped = false

  constructor(connection: Destroyable, timeoutMs: number) {
    this.#connection = connection
    this.#timeoutMs = timeoutMs
  }

  query(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]> {
    return this.#bounded(this.#connection.query(sql, values))
  }

  execute(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]> {
    return this.#bounded(this.#connection.execute(sql, values))
  }

  release(): void {
    if (!this.#dropped) this.#connection.release()
  }

  #bounded<R>(statement: Promise<R>): Promise<R> {
    if (this.#timeoutMs === 0) return statement
    if (this.#dropped) return Promise.reject(new StatementTimeoutError(this.#timeoutMs))
    return new Promise<R>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#drop()
        reject(new StatementTimeoutError(this.#timeoutMs))
      }, this.#timeoutMs)
      statement.then(
        (result) => {
          clearTimeout(timer)
          resolve(result)
        },
        (error: unknown) => {
          clearTimeout(timer)
          reject(error)
        },
      )
    })
  }

  /**
   * Out of the pool for good: its queued statement fails, and the pool opens a new connection when it
   * needs one. The socket itself is destroyed: mysql2's own `destroy()` only sends a FIN, which the far
   * side of a half-open connection never answers, so the socket would stay open (keeping the process
   * alive). mysql2 fails what waits on the connection with the error and takes it out of its pool.
   */
  #drop(): void {
    if (this.#dropped) return
    this.#dropped = true
    const stream = (this.#connection.connection ?? this.#connection).stream
    if (stream?.destroy) stream.destroy(new StatementTimeoutError(this.#timeoutMs))
    else if (this.#connection.destroy) this.#connection.destroy()
    else this.#connection.release()
  }
}
