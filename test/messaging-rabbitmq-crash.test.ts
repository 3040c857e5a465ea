/**
 * A message whose effect kills the consumer's process, on a RabbitMQ classic queue (which counts no
 * deliveries): `consumeRabbitMq` with `maxAttempts` counts each redelivered message's attempt in the
 * inbox before it runs, and runs it alone, so the poison message is given up on after maxAttempts + 1
 * runs (the first, cut short, is not counted) and no other message is blamed. Consumer processes are
 * started one after another, as a supervisor restarts a crashed one.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import amqp from 'amqplib'
import { SqliteInbox } from '../src/messaging/inbox/index.js'
import { eventually } from './helpers/eventually.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = await serviceSkipReason('RabbitMQ', 5672)
const WORKER = join(import.meta.dirname, 'fixtures/messaging/workers/poison-consumer.ts')

describe.skipIf(skip !== undefined)('RabbitMQ classic queue: a message that kills the consumer process', () => {
  it('is dead-lettered after maxAttempts + 1 runs, reported once, and every other message is applied once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-poison-'))
    const queue = `idemkey.test.poison.${randomUUID()}`
    const connection = await amqp.connect('amqp://guest:guest@127.0.0.1:5672')
    const admin = await connection.createConfirmChannel()
    const children: ChildProcess[] = []
    try {
      const consumerDb = join(dir, 'consumer.db')
      const db = new DatabaseSync(consumerDb)
      db.exec('PRAGMA journal_mode = WAL')
      db.exec('CREATE TABLE applied (message_id TEXT PRIMARY KEY, n INTEGER NOT NULL)')
      new SqliteInbox({ database: db, consumer: 'poison' }).migrate()
      // A classic queue (no delivery count) whose rejected messages go to `<queue>.dead`.
      await admin.assertQueue(`${queue}.dead`, { durable: false })
      await admin.assertQueue(queue, { durable: false, deadLetterExchange: '', deadLetterRoutingKey: `${queue}.dead` })
      const ids = Array.from({ length: 40 }, (_, i) => `m${i}-${randomUUID()}`)
      const poison = ids[12] as string
      for (const id of ids) admin.sendToQueue(queue, Buffer.from('{}'), { messageId: id })
      await admin.waitForConfirms()
      const files = { RUNS_FILE: join(dir, 'runs'), REPORTS_FILE: join(dir, 'reports') }
      const read = (file: string) => (existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean) : [])
      const appliedCount = () => (db.prepare('SELECT count(*) AS n FROM applied').get() as { n: number }).n
      const deadLettered = async () => (await admin.checkQueue(`${queue}.dead`)).messageCount
      let processes = 0
      let last: ChildProcess | undefined
      // A supervisor: one consumer process at a time, restarted when it dies, at most eight.
      while (processes < 8) {
        const child = spawn(process.execPath, ['--import', 'tsx', WORKER], {
          env: { ...process.env, ...files, POISON_ID: poison, CONSUMER_DB: consumerDb, QUEUE: queue },
          stdio: ['ignore', 'ignore', 'inherit'],
        })
        children.push(child)
        processes++
        last = child
        const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
        let done = false
        await Promise.race([
          exited,
          eventually(
            async () => {
              done = appliedCount() === ids.length - 1 && (await deadLettered()) === 1
              return done || child.exitCode !== null || child.signalCode !== null
            },
            'the consumer to die or to finish',
            30_000,
          ),
        ])
        if (done) break
        await exited
      }
      if (last && last.exitCode === null && last.signalCode === null) {
        const exited = new Promise((resolve) => last?.once('exit', resolve))
        last.kill('SIGTERM')
        await exited
      }
      // Four runs: the first delivery's (not counted, it was cut short), then three counted ones; the
      // fifth delivery was over maxAttempts and went to the dead-letter queue without running.
      expect(read(files.RUNS_FILE)).toHaveLength(4)
      expect(processes).toBe(5)
      expect(read(files.REPORTS_FILE)).toEqual([`${poison} RETRIES_EXHAUSTED`])
      const dead = await admin.get(`${queue}.dead`, { noAck: true })
      expect(dead ? dead.properties.messageId : undefined).toBe(poison)
      const rows = db.prepare('SELECT message_id, n FROM applied').all() as Array<{ message_id: string; n: number }>
      expect(rows.map((r) => r.message_id).sort()).toEqual(ids.filter((id) => id !== poison).sort())
      expect(rows.every((r) => r.n === 1)).toBe(true)
      expect((await admin.checkQueue(queue)).messageCount).toBe(0)
      // Applied or given up on: nothing is left counted.
      expect(db.prepare('SELECT count(*) AS n FROM idemkey_inbox_failures').get()).toEqual({ n: 0 })
      db.close()
    } finally {
      for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
      await admin.deleteQueue(queue).catch(() => {})
      await admin.deleteQueue(`${queue}.dead`).catch(() => {})
      await connection.close()
      rmSync(dir, { recursive: true, force: true })
    }
  }, 120_000)
})
