/**
 * PgInbox when the effect catches a failed statement of its own and carries on: PostgreSQL has then
 * aborted the transaction, and its COMMIT ends in a rollback without an error (the command tag says
 * ROLLBACK). Neither the effect's writes nor the message ID were kept, so the inbox must not answer
 * `applied` (the caller would ack a message whose effect never committed): it fails the message, and
 * the redelivery is applied.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import postgres from 'postgres'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { PgInbox } from '../../messaging/inbox/index.js'
import { postgresJsPool } from '../../orm/postgres-js/index.js'
import type { PgPool, PgQueryable } from './messaging.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)

const drivers: Array<{ name: string; open(): { inboxPool: PgPool; end(): Promise<void> } }> = [
  {
    name: 'node-postgres',
    open() {
      const inboxPool = new pg.Pool({ connectionString: URL, max: 2 })
      return { inboxPool, end: () => inboxPool.end() }
    },
  },
  {
    name: 'postgres.js (postgresJsPool)',
    open() {
      const sql = postgres(URL, { max: 2, onnotice: () => {} })
      return { inboxPool: postgresJsPool(sql) as unknown as PgPool, end: () => sql.end({ timeout: 5 }) }
    },
  },
]

describe.skipIf(skip !== undefined).each(drivers)('PgInbox on $name: an effect that swallows a failed statement', (driver) => {
  const suffix = randomUUID().slice(0, 8)
  const table = `pg_inbox_swallow_${suffix}`
  const effects = `pg_inbox_swallow_effects_${suffix}`
  const pool = new pg.Pool({ connectionString: URL, max: 2 })
  const { inboxPool, end } = driver.open()
  const inbox = new PgInbox({ pool: inboxPool, consumer: 'billing', table })
  beforeAll(async () => {
    await inbox.migrate()
    await pool.query(`CREATE TABLE ${effects} (id text PRIMARY KEY)`)
    await pool.query(`INSERT INTO ${effects} VALUES ('taken')`)
  })
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS ${table}, ${effects}`)
    await Promise.all([pool.end(), end()])
  })

  /** Writes a row, then tries one that exists and ignores the unique violation, as "insert if absent" code often does. */
  const swallowing = async (tx: PgQueryable, id: string) => {
    await tx.query(`INSERT INTO ${effects} VALUES ($1)`, [id])
    await tx.query(`INSERT INTO ${effects} VALUES ('taken')`).catch(() => {})
    return 'charged'
  }
  const kept = async (id: string) => (await pool.query(`SELECT 1 FROM ${effects} WHERE id = $1`, [id])).rows.length

  it('handle() does not report a message applied when its COMMIT rolled the transaction back, and the redelivery is applied', async () => {
    const message = { id: `m-${randomUUID()}`, payload: '{"amount":1}' }
    await expect(inbox.handle(message, (tx) => swallowing(tx, message.id))).rejects.toThrow(/rolled back/)
    expect(await kept(message.id)).toBe(0)
    const charge = async (tx: PgQueryable) => {
      await tx.query(`INSERT INTO ${effects} VALUES ($1)`, [message.id])
      return 'charged'
    }
    expect(await inbox.handle(message, charge)).toEqual({ status: 'applied', value: 'charged' })
    expect(await kept(message.id)).toBe(1)
  })

  it('handleBatch() does not report its messages applied when its COMMIT rolled the transaction back', async () => {
    const messages = [`b-${randomUUID()}`, `b-${randomUUID()}`].map((id) => ({ id, payload: 'p' }))
    await expect(
      inbox.handleBatch(messages, (tx, message) => (message === messages[1] ? swallowing(tx, message.id) : 'ok')),
    ).rejects.toThrow(/rolled back/)
    expect(await inbox.handleBatch(messages, () => 'again')).toEqual([
      { status: 'applied', value: 'again' },
      { status: 'applied', value: 'again' },
    ])
  })
})
