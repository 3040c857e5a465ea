/** The exactly-once path of MySqlStore: business writes and the completion of the record in one transaction. */
import { toStoreError } from './mysql-errors.js'
import type { ConnectionSource, MySqlTransaction, MySqlValue, WriteResult } from './pool.js'
import { bind, type Statement } from './statements.js'

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
  try {
    const result = await fn(connection)
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
