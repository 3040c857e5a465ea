/**
 * The scale benchmark's fill (bench/pg-fill.ts) is only worth its figures if its rows are what it says:
 * keys it can name again for replays, each day's rows in that day, and exactly the oldest day expired.
 * Evaluated by PostgreSQL itself over generate_series, no table written.
 */
import pg from 'pg'
import { dayTimeline, firstRowOfDay, KEY_SQL, keyOf, SCOPE_SQL, scopeOf } from '../bench/pg-fill.js'
import { serviceSkipReason } from './helpers/services.js'

const URL = process.env.PG_URL ?? 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const DAY = 86_400_000

describe.skipIf(skip !== undefined)('bench/pg-fill.ts on PostgreSQL', () => {
  let pool: pg.Pool
  beforeAll(() => {
    pool = new pg.Pool({ connectionString: URL, max: 1 })
  })
  afterAll(() => pool.end())

  it('names in JavaScript the same scope and key the SQL fill writes for a row', async () => {
    const { rows } = await pool.query(
      `SELECT i, ${SCOPE_SQL} AS scope, ${KEY_SQL} AS key FROM generate_series(0::bigint, 2500::bigint, 833) i`,
    )
    for (const row of rows as Array<{ i: string; scope: string; key: string }>) {
      expect([row.scope, row.key]).toEqual([scopeOf(Number(row.i)), keyOf(Number(row.i))])
    }
  })

  it('puts each day its rows, none in the future, and expires exactly the oldest day', async () => {
    const [rowCount, days] = [10_007, 4]
    const today = 20_000 * DAY
    const now = today + 5 * 3_600_000 + 123
    const firstDay = today - (days - 1) * DAY
    const { createdAt, expiresAt } = dayTimeline(rowCount, days, firstDay, now - today)
    const { rows } = await pool.query(
      `SELECT i, ${createdAt} AS created, ${expiresAt} AS expires FROM generate_series(0::bigint, ${rowCount - 1}::bigint) i`,
    )
    for (const row of rows as Array<{ i: string; created: string; expires: string }>) {
      const [i, created, expires] = [Number(row.i), Number(row.created), Number(row.expires)]
      const day = Math.floor((created - firstDay) / DAY)
      expect(i >= firstRowOfDay(day, rowCount, days) && i < firstRowOfDay(day + 1, rowCount, days)).toBe(true)
      expect(created).toBeLessThan(now)
      expect(expires <= now).toBe(day === 0)
    }
  })
})
