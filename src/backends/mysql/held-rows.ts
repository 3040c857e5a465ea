/** Which records' rows an open transaction holds: MySqlStore's `heldInTransaction`. Not part of the public API. */
import { byKeys } from './batch-statements.js'
import type { MySqlPoolLike } from './pool.js'
import { identity } from './records.js'

const hex = (row: { scope: Buffer; key: Buffer }) => `${row.scope.toString('hex')} ${row.key.toString('hex')}`

/**
 * Whether an open transaction holds each record's row, in the order given: the rows that exist (a plain
 * consistent read, which takes no lock), then those whose lock is free (`FOR UPDATE SKIP LOCKED`: MySQL 8
 * and MariaDB 10.6 have it; it never waits for a row lock, and the locks it takes last its own autocommit
 * statement). A row that exists but is skipped is held by an open transaction: a step or a completion
 * written inside it.
 */
export async function heldRows(
  pool: MySqlPoolLike,
  table: string,
  records: ReadonlyArray<{ scope: string; key: string }>,
): Promise<boolean[]> {
  const ids = records.map((r) => identity(r.scope, r.key))
  const values = ids.flatMap((id) => [id.scope, id.key])
  const where = `FROM \`${table}\` WHERE ${byKeys(ids.length)}`
  const [present] = await pool.query(`SELECT scope, \`key\` ${where}`, values)
  const [free] = await pool.query(`SELECT scope, \`key\` ${where} FOR UPDATE SKIP LOCKED`, values)
  const there = new Set((present as Array<{ scope: Buffer; key: Buffer }>).map(hex))
  const unlocked = new Set((free as Array<{ scope: Buffer; key: Buffer }>).map(hex))
  return ids.map((id) => there.has(hex(id)) && !unlocked.has(hex(id)))
}
