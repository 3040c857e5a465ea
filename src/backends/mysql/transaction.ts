/** The exactly-once path of MySqlStore: business writes and the completion of the record in one transaction. */
import { IdempotencyError } from '../../errors.js'
import { toStoreError } from './mysql-errors.js'
import type { ConnectionSource, MySqlConnectionLike, MySqlTransaction, MySqlValue, WriteResult } from './pool.js'
import { bind, type Statement } from './statements.js'

/** SERVER_STATUS_IN_TRANS, in the status flags of every OK packet: a transaction is open on the connection. */
const IN_TRANSACTION = 0x0001

/**
 * The connection a transaction's work gets, watched: once the server has ended the transaction under
 * the work, every later statement on it is refused, and so is the record's completion. Unwatched, work
 * that caught the error and carried on wrote in autocommit (each statement its own transaction, kept
 * whatever happens next) and the record was completed with the writes before the error lost: "both or
 * neither" broken, and a retry replayed instead of running again.
 * - A deadlock (errno 1213): InnoDB rolls the whole transaction back. The work sees the error itself;
 *   anything it sends afterwards is refused with `STORE_UNAVAILABLE` (a retry is safe: the record is
 *   released).
 * - A statement after which the server reports no transaction open (the OK packet's IN_TRANS flag):
 *   an implicit commit (DDL such as CREATE or ALTER, LOCK TABLES) or a COMMIT or ROLLBACK sent on it.
 *   That statement is answered with `INVALID_ARGUMENT`; what it committed stays committed.
 */
class WatchedTransaction implements MySqlTransaction {
  readonly #connection: MySqlConnectionLike
  /** Why the transaction is over, once it is. */
  ended: IdempotencyError | undefined

  constructor(connection: MySqlConnectionLike) {
    this.#connection = connection
  }

  query(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]> {
    return this.#send(() => this.#connection.query(sql, values))
  }

  execute(sql: string, values?: MySqlValue[]): Promise<[unknown, unknown]> {
    return this.#send(() => this.#connection.execute(sql, values))
  }

  release(): void {
    // The store releases the connection when the transaction ends; the work's release() is ignored (it
    // would hand the connection, mid-transaction, to the next taker).
  }

  async #send(statement: () => Promise<[unknown, unknown]>): Promise<[unknown, unknown]> {
    if (this.ended) throw this.ended
    let result: [unknown, unknown]
    try {
      result = await statement()
    } catch (error) {
      if ((error as { errno?: unknown } | null)?.errno === 1213) {
        this.ended = new IdempotencyError(
          'STORE_UNAVAILABLE',
          'mysql: InnoDB rolled this transaction back after a deadlock (errno 1213), business writes included, so nothing more can be done in it and its record is not completed. Let the deadlock error propagate out of the work: the record is released and a retry runs the work again, in a new transaction.',
          { cause: error },
        )
      }
      throw error
    }
    const status = (result[0] as { serverStatus?: unknown } | null)?.serverStatus
    if (typeof status === 'number' && (status & IN_TRANSACTION) === 0) {
      this.ended = new IdempotencyError(
        'INVALID_ARGUMENT',
        'mysql: a statement ended the transaction under the work (the server reports no transaction open after it): an implicit commit (DDL such as CREATE or ALTER, LOCK TABLES) or a COMMIT or ROLLBACK sent on it. What it committed stays committed, and the record is not completed. Keep DDL and transaction control out of the work.',
      )
      throw this.ended
    }
    return result
  }
}

/**
 * Runs `fn` on one pool connection inside `START TRANSACTION` … `COMMIT`; rolls back when `fn` throws.
 * Nothing is retried here: after a deadlock InnoDB has rolled back the whole transaction, business
 * writes included, so only the caller can decide to run it again.
 */
export async function runTransaction<R>(pool: ConnectionSource, table: string, fn: (tx: MySqlTransaction) => Promise<R>): Promise<R> {
  let connection: MySqlTransaction | undefined
  try {
    connection = await pool.getConnection()
    await connection.query('START TRANSACTION')
  } catch (error) {
    connection?.release()
    throw toStoreError('transaction', error, table)
  }
  const watched = new WatchedTransaction(connection)
  try {
    const result = await fn(watched)
    // The work swallowed the end of its transaction and returned: nothing of it is committed as if whole.
    if (watched.ended) throw watched.ended
    try {
      await connection.query('COMMIT')
    } catch (error) {
      throw toStoreError('commit', error, table)
    }
    return result
  } catch (error) {
    // A failed rollback leaves nothing to undo that the server will not undo when the connection goes.
    await connection.query('ROLLBACK').catch(() => {})
    throw error
  } finally {
    connection.release()
  }
}

/** The completing UPDATE on the transaction's connection; `true` when the token was current. */
export async function completeOn(
  tx: MySqlTransaction,
  table: string,
  statement: Statement,
  values: Record<string, MySqlValue>,
): Promise<boolean> {
  try {
    const [result] = await tx.execute(statement.sql, bind(statement, values))
    return (result as WriteResult).affectedRows === 1
  } catch (error) {
    throw toStoreError('completeInTransaction', error, table)
  }
}
