/**
 * Copies of one message delivered at once (a broker redelivering while the first is still running,
 * several consumers of one queue, a relay publishing twice): every inbox applies the effect once and
 * reports every other copy as a duplicate, with no error (an error is a retry, and counts toward
 * `maxAttempts`). Against the real databases, with real parallel connections.
 */

import { randomUUID } from 'node:crypto'
import { type InboxDatabase, inboxDatabases } from './helpers/inbox-databases.js'

const COPIES = 20

for (const [name, open] of Object.entries(inboxDatabases(COPIES))) {
  const opened = await open()
  describe.skipIf(typeof opened === 'string')(`${name} inbox: concurrent copies of one message`, () => {
    const db = opened as InboxDatabase
    const table = `idemkey_inbox_copies_${randomUUID().slice(0, 8)}`
    beforeAll(async () => {
      await db.inbox('c', table).migrate()
    })
    afterAll(async () => {
      await db.drop(table)
      await db.close()
    })

    it(`applies ${COPIES} concurrent copies of one ID once and reports the other ${COPIES - 1} as duplicates, without an error`, async () => {
      const message = { id: `copy-${randomUUID()}`, payload: '{"amount":5}' }
      let effects = 0
      // One inbox object per copy: as many consumers (processes) as copies.
      const outcomes = await Promise.allSettled(
        Array.from({ length: COPIES }, () =>
          db.inbox('copies', table).handle(message, () => {
            effects++
          }),
        ),
      )
      const errors = outcomes.flatMap((o) => (o.status === 'rejected' ? [String(o.reason)] : []))
      expect(errors).toEqual([])
      const statuses = outcomes.map((o) => (o.status === 'fulfilled' ? o.value.status : 'error'))
      expect(statuses.filter((s) => s === 'applied')).toHaveLength(1)
      expect(statuses.filter((s) => s === 'duplicate')).toHaveLength(COPIES - 1)
      expect(effects).toBe(1)
    })

    it('applies the ID once when the copy that took it first fails and rolls back while the others wait', async () => {
      const message = { id: `failing-${randomUUID()}`, payload: '{"amount":5}' }
      let effects = 0
      // The first effect fails, a while after its copy took the ID (SQLite's effects are synchronous).
      const effect = () => {
        effects++
        if (effects > 1) return
        if (name === 'sqlite') throw new Error('effect failed')
        return new Promise<void>((_, reject) => setTimeout(() => reject(new Error('effect failed')), 300))
      }
      const outcomes = await Promise.allSettled(Array.from({ length: COPIES }, () => db.inbox('failing', table).handle(message, effect)))
      const errors = outcomes.flatMap((o) => (o.status === 'rejected' ? [String(o.reason)] : []))
      expect(errors).toEqual(['Error: effect failed'])
      const statuses = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value.status] : []))
      expect(statuses.filter((s) => s === 'applied')).toHaveLength(1)
      expect(statuses.filter((s) => s === 'duplicate')).toHaveLength(COPIES - 2)
      expect(effects).toBe(2)
    })
  })
}
