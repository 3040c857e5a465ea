/**
 * The inbox window against the broker's horizon: a JetStream consumer helper whose inbox forgets IDs
 * sooner than the stream keeps messages (max_age) warns once, by name (IDEMKEY_INBOX_WINDOW); one whose
 * retention covers max_age, or a stream without max_age, does not.
 */
import { randomUUID } from 'node:crypto'
import { DatabaseSync } from 'node:sqlite'
import { AckPolicy, connect, nanos } from 'nats'
import { SqliteInbox } from '../src/messaging/inbox/index.js'
import { consumeNats } from '../src/messaging/publishers/nats/index.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = await serviceSkipReason('NATS', 4222)

describe.skipIf(skip !== undefined)('the inbox window against a JetStream stream max_age', () => {
  it('warns once, naming the inbox and the stream, when the inbox keeps IDs for less than max_age; not when it covers it', async () => {
    const connection = await connect({ servers: '127.0.0.1:4222' })
    const jsm = await connection.jetstreamManager()
    const name = `WINDOW_${randomUUID().slice(0, 8).toUpperCase()}`
    const bare = `${name}_NOAGE`
    await jsm.streams.add({ name, subjects: [`${name.toLowerCase()}.>`], max_age: nanos(2 * 3_600_000) })
    await jsm.streams.add({ name: bare, subjects: [`${bare.toLowerCase()}.>`] })
    for (const stream of [name, bare]) await jsm.consumers.add(stream, { durable_name: 'c', ack_policy: AckPolicy.Explicit })
    const warnings: Error[] = []
    const onWarning = (warning: Error) => {
      if ((warning as Error & { code?: string }).code === 'IDEMKEY_INBOX_WINDOW') warnings.push(warning)
    }
    process.on('warning', onWarning)
    const db = new DatabaseSync(':memory:')
    const inbox = (consumer: string, retention: string) => {
      const created = new SqliteInbox({ database: db, consumer, retention })
      created.migrate()
      return created
    }
    const start = (stream: string, consumer: string, retention: string) =>
      consumeNats({ connection, stream, consumer: 'c', inbox: inbox(consumer, retention), handler: () => undefined })
    try {
      const short = await start(name, 'billing-short', '1h')
      const again = await start(name, 'billing-short', '1h')
      const covered = await start(name, 'billing-covered', '3h')
      const unlimited = await start(bare, 'billing-unlimited', '1h')
      await new Promise((resolve) => setImmediate(resolve))
      expect(warnings.map((w) => w.message)).toEqual([
        expect.stringMatching(
          new RegExp(
            `^Inbox "billing-short" keeps processed message IDs for 1\\.0 h, but JetStream stream "${name}" \\(max_age\\) can redeliver a message for up to 2\\.0 h`,
          ),
        ),
      ])
      expect(warnings[0]?.message).toContain("retention: '2h'")
      for (const running of [short, again, covered, unlimited]) await running.stop()
    } finally {
      process.off('warning', onWarning)
      for (const stream of [name, bare]) await jsm.streams.delete(stream).catch(() => {})
      await connection.close()
      db.close()
    }
  })
})
