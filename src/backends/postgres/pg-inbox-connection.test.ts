/**
 * PgInbox when the connection it checked out dies mid-transaction (a server restart, a cut connection,
 * here the backend terminated from outside): pg emits that error on the checked-out client, and an
 * error event nobody listens to ends the process. The message fails (nothing recorded, so the broker
 * redelivers it), that client is destroyed, and the message is applied on a fresh one.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { PgInbox } from '../../messaging/inbox/index.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)

describe.skipIf(skip !== undefined)('PgInbox: a checked-out connection that dies', () => {
  const table = `pg_inbox_conn_${randomUUID().slice(0, 8)}`
  const pool = new pg.Pool({ connectionString: URL, max: 2 })
  const admin = new pg.Pool({ connectionString: URL, max: 1 })
  afterAll(async () => {
    await admin.query(`DROP TABLE IF EXISTS ${table}`)
    await Promise.all([pool.end(), admin.end()])
  })

  it('fails the message when its backend is terminated inside the effect, raises no unhandled error, and applies the redelivery on a fresh connection', async () => {
    const inbox = new PgInbox({ pool, consumer: 'billing', table })
    await inbox.migrate()
    const uncaught: unknown[] = []
    const onUncaught = (error: unknown) => uncaught.push(error)
    process.on('uncaughtException', onUncaught)
    try {
      const killed = inbox.handle({ id: 'm-1', payload: '{"amount":1}' }, async (tx) => {
        const { rows } = await tx.query('SELECT pg_backend_pid() AS pid')
        await admin.query('SELECT pg_terminate_backend($1)', [(rows[0] as { pid: number } | undefined)?.pid])
        // The connection is gone: this statement fails, and pg also emits the error on the client.
        await tx.query('SELECT 1')
      })
      await expect(killed).rejects.toBeDefined()
      // Let the client's error events arrive.
      await new Promise((resolve) => setTimeout(resolve, 200))
      expect(uncaught).toEqual([])
      expect(await inbox.handle({ id: 'm-1', payload: '{"amount":1}' }, async () => 'charged')).toEqual({
        status: 'applied',
        value: 'charged',
      })
    } finally {
      process.off('uncaughtException', onUncaught)
    }
  })
})
