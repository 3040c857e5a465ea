/**
 * The inboxes' record of failed attempts (`recordFailure`, `forgetFailures`), which the consumer helpers
 * count `maxAttempts` with: shared by every process of a consumer and kept across restarts, one count per
 * consumer and message, forgotten on demand and by `purge()`. Against the real databases.
 */

import { randomUUID } from 'node:crypto'
import type { InboxMessage } from '../src/messaging/inbox/types.js'
import { type InboxDatabase, inboxDatabases } from './helpers/inbox-databases.js'

const message = (id: string): InboxMessage => ({ id, payload: 'x' })

for (const [name, open] of Object.entries(inboxDatabases())) {
  const opened = await open()
  describe.skipIf(typeof opened === 'string')(`${name} inbox: failed attempts, for maxAttempts`, () => {
    const db = opened as InboxDatabase
    const table = `idemkey_inbox_failures_${randomUUID().slice(0, 8)}`
    afterAll(async () => {
      await db.drop(table)
      await db.close()
    })

    it('migrates the failures table beside the inbox, idempotently', async () => {
      await db.inbox('c', table).migrate()
      await db.inbox('c', table).migrate()
    })

    it("counts one consumer's failures of a message across its processes, apart from other consumers and messages", async () => {
      const [first, second] = [db.inbox('billing', table), db.inbox('billing', table)]
      expect(await first.recordFailure(message('m1'))).toBe(1)
      expect(await second.recordFailure(message('m1'))).toBe(2)
      expect(await first.recordFailure(message('m1'))).toBe(3)
      expect(await db.inbox('shipping', table).recordFailure(message('m1'))).toBe(1)
      expect(await first.recordFailure(message('m2'))).toBe(1)
    })

    it('counts every concurrent failure once', async () => {
      const [first, second] = [db.inbox('busy', table), db.inbox('busy', table)]
      const counts = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? first : second).recordFailure(message('hot'))))
      expect(await first.recordFailure(message('hot'))).toBe(21)
      // Each count is one statement: concurrent callers each see their own.
      expect([...counts].sort((a, b) => a - b)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1))
    })

    it("forgets a message's failures on demand: moved back after it was given up on, it starts afresh", async () => {
      const inbox = db.inbox('forget', table)
      await inbox.recordFailure(message('f1'))
      await inbox.recordFailure(message('f1'))
      await inbox.recordFailure(message('f2'))
      await inbox.forgetFailures('f1')
      expect(await inbox.recordFailure(message('f1'))).toBe(1)
      expect(await inbox.recordFailure(message('f2'))).toBe(2)
    })

    it('purges failures last recorded longer ago than the retention', async () => {
      const inbox = db.inbox('purged', table, 50)
      await inbox.recordFailure(message('old'))
      await new Promise((resolve) => setTimeout(resolve, 200))
      await inbox.recordFailure(message('fresh'))
      await inbox.purge()
      expect(await inbox.recordFailure(message('old'))).toBe(1)
      expect(await inbox.recordFailure(message('fresh'))).toBe(2)
    })

    it('names the failures table within the identifier limit for the longest inbox table name', async () => {
      // 59 characters, the longest MySqlInbox takes: "<table>_failures" would be 68, past MySQL's 64 and PostgreSQL's 63.
      const long = `${table}_${'x'.repeat(59 - table.length - 1)}`
      expect(long).toHaveLength(59)
      const inbox = db.inbox('c', long)
      await inbox.migrate()
      expect(await inbox.recordFailure(message('m'))).toBe(1)
      expect(await db.inbox('c', long).recordFailure(message('m'))).toBe(2)
    })

    it("lists a consumer's failing messages, most attempts first, then the latest, within a limit; none once forgotten", async () => {
      const inbox = db.inbox('listed', table)
      const before = Date.now()
      for (const id of ['once', 'thrice', 'twice', 'thrice', 'twice', 'thrice', 'once-later']) {
        await inbox.recordFailure(message(id))
        await new Promise((resolve) => setTimeout(resolve, 5))
      }
      await db.inbox('other', table).recordFailure(message('elsewhere'))
      const failing = await inbox.failing()
      expect(failing.map((f) => [f.messageId, f.attempts])).toEqual([
        ['thrice', 3],
        ['twice', 2],
        ['once-later', 1],
        ['once', 1],
      ])
      for (const f of failing) {
        expect(f.lastAttemptAtMs).toBeGreaterThanOrEqual(before - 1_000)
        expect(f.lastAttemptAtMs).toBeLessThanOrEqual(Date.now() + 1_000)
      }
      expect((await inbox.failing(2)).map((f) => f.messageId)).toEqual(['thrice', 'twice'])
      await inbox.forgetFailures('thrice')
      expect((await inbox.failing(1)).map((f) => f.messageId)).toEqual(['twice'])
      await expect(inbox.failing(0)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' })
      // An inbox not migrated since the failures table came has none recorded.
      expect(await db.inbox('c', `${table}_none`).failing()).toEqual([])
    })

    it('refuses to count on an inbox not migrated since, naming migrate()', async () => {
      const unmigrated = `${table}_none`
      await expect(db.inbox('c', unmigrated).recordFailure(message('m'))).rejects.toMatchObject({
        message: expect.stringMatching(/migrate\(\)/),
      })
    })
  })
}
