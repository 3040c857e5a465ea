/**
 * A message whose effect kills the consumer's process, on each broker: with `maxAttempts`, a message the
 * broker delivers again runs isolated (alone, its attempt recorded in the inbox before it runs), so the
 * poison message is given up on after maxAttempts + 1 runs (the first, cut short, is not counted), and
 * no other message is blamed. A RabbitMQ classic queue counts no deliveries; the test's JetStream
 * consumer has no max_deliver; Redis has no limit: without the isolation the message went round for
 * ever. Consumer processes are started one after another, as a supervisor restarts a crashed one.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { SqliteInbox } from '../src/messaging/inbox/index.js'
import { BROKER_PORTS, type BrokerName, createResource, openPublisher, topicFor } from './fixtures/messaging/brokers.js'
import { eventually } from './helpers/eventually.js'
import { serviceSkipReason } from './helpers/services.js'

const WORKER = join(import.meta.dirname, 'fixtures/messaging/workers/poison-consumer.ts')
const brokers: BrokerName[] = ['rabbitmq', 'nats', 'redis']
const skips = Object.fromEntries(
  await Promise.all(brokers.map(async (broker) => [broker, await serviceSkipReason(broker, BROKER_PORTS[broker])] as const)),
)

describe.each(brokers)('%s: a message whose effect kills the consumer process', (broker) => {
  it.skipIf(skips[broker] !== undefined)(
    'is given up on after maxAttempts + 1 runs, reported once, and every other message is applied once',
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'idemkey-poison-'))
      const resource = await createResource(broker)
      const { publisher, close } = await openPublisher(broker)
      const children: ChildProcess[] = []
      try {
        const consumerDb = join(dir, 'consumer.db')
        const db = new DatabaseSync(consumerDb)
        db.exec('PRAGMA journal_mode = WAL')
        db.exec('CREATE TABLE applied (message_id TEXT PRIMARY KEY, n INTEGER NOT NULL)')
        new SqliteInbox({ database: db, consumer: 'poison' }).migrate()
        const ids = Array.from({ length: 40 }, (_, i) => `m${i}-${randomUUID()}`)
        const poison = ids[12] as string
        const topic = topicFor(broker, resource.name)
        const results = await publisher.publish(
          ids.map((id, seq) => ({
            id,
            topic,
            payload: Buffer.from('{}'),
            contentType: 'application/json',
            headers: {},
            partitionKey: null,
            seq,
            attempts: 1,
            createdAtMs: Date.now(),
          })),
        )
        expect(results.every((r) => r.ok)).toBe(true)
        const files = { RUNS_FILE: join(dir, 'runs'), REPORTS_FILE: join(dir, 'reports') }
        const read = (file: string) => (existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean) : [])
        const appliedCount = () => (db.prepare('SELECT count(*) AS n FROM applied').get() as { n: number }).n
        let processes = 0
        let last: ChildProcess | undefined
        // A supervisor: one consumer process at a time, restarted when it dies, at most eight.
        while (processes < 8) {
          const child = spawn(process.execPath, ['--import', 'tsx', WORKER], {
            env: { ...process.env, ...files, FAULT_BROKER: broker, FAULT_NAME: resource.name, POISON_ID: poison, CONSUMER_DB: consumerDb },
            stdio: ['ignore', 'ignore', 'inherit'],
          })
          children.push(child)
          processes++
          last = child
          const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
          let done = false
          await eventually(
            async () => {
              done = appliedCount() === ids.length - 1 && read(files.REPORTS_FILE).length > 0 && (await resource.idle())
              return done || child.exitCode !== null || child.signalCode !== null
            },
            'the consumer to die or to finish',
            30_000,
          )
          if (done) break
          await exited
        }
        if (last && last.exitCode === null && last.signalCode === null) {
          const exited = new Promise((resolve) => last?.once('exit', resolve))
          last.kill('SIGTERM')
          await exited
        }
        // Four runs: the first delivery's (not counted, it was cut short), then three counted ones; the
        // fifth delivery was over maxAttempts and was given up on without running.
        expect(read(files.RUNS_FILE)).toHaveLength(4)
        expect(processes).toBe(5)
        expect(read(files.REPORTS_FILE)).toEqual([`${poison} RETRIES_EXHAUSTED`])
        const rows = db.prepare('SELECT message_id, n FROM applied').all() as Array<{ message_id: string; n: number }>
        expect(rows.map((r) => r.message_id).sort()).toEqual(ids.filter((id) => id !== poison).sort())
        expect(rows.every((r) => r.n === 1)).toBe(true)
        expect(await resource.idle()).toBe(true)
        // Applied or given up on: nothing is left counted.
        expect(db.prepare('SELECT count(*) AS n FROM idemkey_inbox_failures').get()).toEqual({ n: 0 })
        db.close()
      } finally {
        for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
        await close()
        await resource.teardown()
        rmSync(dir, { recursive: true, force: true })
      }
    },
    120_000,
  )
})
