/**
 * A consumer helper over an inbox made with a data-layer adapter (`transactions: drizzleTransactions(db)`):
 * the handler's `tx` is Drizzle's own transaction, in the types and at run time, and the message ID
 * commits with what the handler wrote through it (real Redis Streams, real PostgreSQL), one message at
 * a time and in batches.
 */
import { randomUUID } from 'node:crypto'
import { eq } from 'drizzle-orm'
import { int, mysqlTable, varchar } from 'drizzle-orm/mysql-core'
import { drizzle as drizzleMysql } from 'drizzle-orm/mysql2'
import { drizzle } from 'drizzle-orm/node-postgres'
import { integer, pgSchema, text } from 'drizzle-orm/pg-core'
import { Redis } from 'ioredis'
import mysql from 'mysql2/promise'
import { expectTypeOf } from 'vitest'
import { consumeRedisStreams, RedisStreamsPublisher } from '../src/messaging/brokers/redis-streams/index.js'
import { MySqlInbox, PgInbox } from '../src/messaging/inbox/index.js'
import type { OutboxMessage } from '../src/messaging/outbox/index.js'
import { type DrizzleTransactionOf, drizzleTransactions } from '../src/orm/drizzle/index.js'
import { createSchema, eventually, type TestSchema } from './fixtures/messaging/pg.js'
import { MYSQL_URL } from './fixtures/messaging/sql.js'
import { serviceSkipReason } from './helpers/services.js'

const skip = (await serviceSkipReason('PostgreSQL', 5432)) ?? (await serviceSkipReason('Redis', 6379))
const mysqlSkip = (await serviceSkipReason('MariaDB', 3306)) ?? (await serviceSkipReason('Redis', 6379))

describe.skipIf(skip !== undefined)('a consumer helper over an inbox with transactions: drizzleTransactions(db)', () => {
  let schema: TestSchema
  let redis: Redis
  let reader: Redis

  beforeAll(async () => {
    schema = await createSchema('inbox_orm')
    await schema.pool.query(`CREATE TABLE ${schema.table('credits')} (message_id text PRIMARY KEY, amount integer NOT NULL)`)
    redis = new Redis(6379, '127.0.0.1')
    reader = new Redis(6379, '127.0.0.1')
  })

  afterAll(async () => {
    redis?.disconnect()
    reader?.disconnect()
    await schema?.drop()
  })

  const message = (id: string, amount: number, stream: string): OutboxMessage => ({
    id,
    topic: stream,
    payload: Buffer.from(JSON.stringify({ amount })),
    contentType: 'application/json',
    headers: {},
    partitionKey: id,
    seq: 1,
    attempts: 1,
    createdAtMs: Date.now(),
  })

  it.each([
    ['one message at a time', 1],
    ['in batches', 10],
  ])('hands the handler Drizzle’s transaction, which commits the write with the message ID (%s)', async (_how, batchSize) => {
    const credits = pgSchema(schema.schema).table('credits', {
      messageId: text('message_id').primaryKey(),
      amount: integer('amount').notNull(),
    })
    const db = drizzle(schema.pool)
    const inbox = new PgInbox({
      pool: schema.pool,
      consumer: `billing-${batchSize}`,
      table: schema.table(`inbox_${batchSize}`),
      transactions: drizzleTransactions(db),
    })
    await inbox.migrate()
    const stream = `idemkey:test:inbox-orm:${randomUUID()}`
    await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
    const publisher = new RedisStreamsPublisher({ redis })
    const ids: string[] = [randomUUID(), randomUUID(), randomUUID()]
    let failOnce = true
    const consumer = await consumeRedisStreams({
      redis: reader,
      stream,
      group: 'g',
      consumer: 'c1',
      blockMs: 100,
      claimIdleMs: 200,
      batchSize,
      inbox,
      async handler(tx, received) {
        expectTypeOf(tx).toEqualTypeOf<DrizzleTransactionOf<typeof db>>()
        const { amount } = JSON.parse(Buffer.from(received.payload).toString()) as { amount: number }
        // Drizzle's own API, on the transaction that records the message ID.
        await tx.insert(credits).values({ messageId: received.id, amount })
        // The first attempt fails after its write: the write and the ID roll back together, and the redelivery applies it once.
        if (received.id === ids[1] && failOnce) {
          failOnce = false
          throw new Error('the effect failed after its write')
        }
      },
    })
    try {
      // The same ID twice: a redelivery, applied once.
      const sent = [message(ids[0] as string, 10, stream), message(ids[1] as string, 20, stream), message(ids[2] as string, 30, stream)]
      expect((await publisher.publish([...sent, message(ids[0] as string, 10, stream)])).every((r) => r.ok)).toBe(true)
      await eventually(async () => {
        const [pending] = (await redis.xpending(stream, 'g')) as [number]
        const rows = await db.select().from(credits)
        return rows.filter((row) => ids.includes(row.messageId)).length === 3 && Number(pending) === 0
      }, 'the three messages applied and acked')
      expect(failOnce).toBe(false)
      for (const [i, id] of ids.entries()) {
        expect(await db.select({ amount: credits.amount }).from(credits).where(eq(credits.messageId, id))).toEqual([
          { amount: 10 * (i + 1) },
        ])
      }
      const recorded = await schema.pool.query(`SELECT message_id FROM ${schema.table(`inbox_${batchSize}`)}`)
      expect(recorded.rows.map((row: { message_id: string }) => row.message_id).sort()).toEqual([...ids].sort())
    } finally {
      await consumer.stop()
      await redis.del(stream, `${stream}:dead-letter`)
    }
  })
})

describe.skipIf(mysqlSkip !== undefined)('a consumer helper over a MySqlInbox with transactions: drizzleTransactions(db)', () => {
  it('hands the handler Drizzle’s transaction, which commits the write with the message ID', async () => {
    const suffix = randomUUID().replaceAll('-', '').slice(0, 12)
    const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: 4 })
    const redis = new Redis(6379, '127.0.0.1')
    const reader = new Redis(6379, '127.0.0.1')
    const stream = `idemkey:test:inbox-orm-mysql:${suffix}`
    await pool.query(`CREATE TABLE credits_${suffix} (message_id varchar(64) PRIMARY KEY, amount int NOT NULL)`)
    const credits = mysqlTable(`credits_${suffix}`, {
      messageId: varchar('message_id', { length: 64 }).primaryKey(),
      amount: int('amount').notNull(),
    })
    const db = drizzleMysql(pool)
    const inbox = new MySqlInbox({ pool, consumer: 'billing', table: `inbox_${suffix}`, transactions: drizzleTransactions(db) })
    try {
      await inbox.migrate()
      await redis.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM')
      const ids: string[] = [randomUUID(), randomUUID()]
      let failOnce = true
      const consumer = await consumeRedisStreams({
        redis: reader,
        stream,
        group: 'g',
        consumer: 'c1',
        blockMs: 100,
        claimIdleMs: 200,
        inbox,
        async handler(tx, received) {
          expectTypeOf(tx).toEqualTypeOf<DrizzleTransactionOf<typeof db>>()
          await tx.insert(credits).values({ messageId: received.id, amount: 5 })
          if (received.id === ids[1] && failOnce) {
            failOnce = false
            throw new Error('the effect failed after its write')
          }
        },
      })
      try {
        const publisher = new RedisStreamsPublisher({ redis })
        const sent = ids.map((id) => ({
          id,
          topic: stream,
          payload: Buffer.from('{}'),
          contentType: 'application/json',
          headers: {},
          partitionKey: id,
          seq: 1,
          attempts: 1,
          createdAtMs: Date.now(),
        }))
        expect((await publisher.publish([...sent, sent[0] as OutboxMessage])).every((r) => r.ok)).toBe(true)
        await eventually(async () => {
          const [pending] = (await redis.xpending(stream, 'g')) as [number]
          return (await db.select().from(credits)).length === 2 && Number(pending) === 0
        }, 'both messages applied and acked')
        expect(failOnce).toBe(false)
        expect((await db.select().from(credits)).map((row) => row.messageId).sort()).toEqual([...ids].sort())
      } finally {
        await consumer.stop()
      }
    } finally {
      await redis.del(stream)
      await pool.query(`DROP TABLE IF EXISTS credits_${suffix}, inbox_${suffix}, inbox_${suffix}_failures`)
      await pool.end()
      redis.disconnect()
      reader.disconnect()
    }
  })
})
