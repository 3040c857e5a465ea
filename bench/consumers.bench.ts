/**
 * Consumer helpers benchmark (issue 16): producer COMMIT → outbox relay → broker → consumer helper →
 * effect committed with PgInbox, per broker (NATS JetStream, Redis Streams, RabbitMQ), all on loopback:
 * 1. latency: 8 producers commit one event per transaction at a steady rate; time from the producer's
 *    COMMIT returning to the consumer's effect transaction committing (PgInbox `applied`);
 * 2. throughput, end to end: a committed outbox backlog drained by the relay and the consumer at once,
 *    until every effect committed;
 * 3. throughput, consumer alone: the same backlog already in the broker, drained by the consumer.
 * The effect is one UPDATE of the event's account row (64 accounts); the partition key is the
 * account, so events of one account are applied in order and accounts run in parallel.
 * Each runs once per relay (`--relay polling,cdc`): the polling OutboxRelay, and PgCdcRelay reading the
 * logical replication stream. CDC needs wal_level = logical: when the server at IDEMKEY_PG_URL runs
 * another level and CDC rows are asked for, every row (polling too, so they compare) runs on a
 * throwaway PostgreSQL 15 started with wal_level = logical and fsync on (test/fixtures/postgres).
 * Run alone: npx tsx bench/consumers.bench.ts [--events 20000] [--rate 1000] [--seconds 10] [--concurrency 32] [--broker nats,redis,rabbitmq] [--relay polling,cdc]
 */
import { randomUUID } from 'node:crypto'
import amqp from 'amqplib'
import { Redis } from 'ioredis'
import { AckPolicy, connect, nanos } from 'nats'
import pg from 'pg'
import { consumeNats, NatsPublisher } from '../src/messaging/brokers/nats/index.js'
import { consumeRabbitMq, RabbitMqPublisher } from '../src/messaging/brokers/rabbitmq/index.js'
import { consumeRedisStreams, RedisStreamsPublisher } from '../src/messaging/brokers/redis-streams/index.js'
import type { RunningConsumer } from '../src/messaging/consumer-options.js'
import { type PgClientLike, PgInbox } from '../src/messaging/inbox/index.js'
import type { InboxMessage } from '../src/messaging/inbox/types.js'
import type { Publisher } from '../src/messaging/message.js'
import { OutboxRelay, PgCdcRelay, PgOutbox, type RelayEvent } from '../src/messaging/outbox/index.js'
import { startThrowaway, type ThrowawayServer } from '../test/fixtures/postgres/throwaway-server.js'
import { fmt, numberArg, percentile, report, steadyLoad, table } from './lib.js'

const EVENTS = numberArg('events', 20_000)
const RATE = numberArg('rate', 1_000)
const SECONDS = numberArg('seconds', 10)
const CONCURRENCY = numberArg('concurrency', 16)
const brokerArg = process.argv.indexOf('--broker')
const BROKERS = (brokerArg > 0 ? String(process.argv[brokerArg + 1]) : 'nats,redis,rabbitmq').split(',')
const relayArg = process.argv.indexOf('--relay')
const RELAYS = (relayArg > 0 ? String(process.argv[relayArg + 1]) : 'polling,cdc').split(',') as Array<'polling' | 'cdc'>
const ACCOUNTS = 64
const SHARED_PG_URL = process.env.IDEMKEY_PG_URL ?? 'postgres://root@127.0.0.1:5432/test'

/** The server every row runs on: the shared one, or a throwaway with wal_level = logical when CDC needs it and the shared one lacks it. */
async function chooseServer(): Promise<{ url: string; throwaway?: ThrowawayServer }> {
  if (!RELAYS.includes('cdc')) return { url: SHARED_PG_URL }
  const probe = new pg.Client({ connectionString: SHARED_PG_URL })
  await probe.connect()
  const { rows } = await probe.query<{ wal_level: string }>('SHOW wal_level')
  await probe.end()
  if (rows[0]?.wal_level === 'logical') return { url: SHARED_PG_URL }
  const throwaway = await startThrowaway({
    settings: { wal_level: 'logical', fsync: 'on', max_connections: 100, shared_buffers: '256MB', max_wal_size: '2GB' },
  })
  return { url: throwaway.url, throwaway }
}
const server = await chooseServer()
const PG_URL = server.url

const tag = randomUUID().replaceAll('-', '').slice(0, 10)
const schema = `bench_consumers_${tag}`
const pool = new pg.Pool({ connectionString: PG_URL, max: 16 })
const inboxPool = new pg.Pool({ connectionString: PG_URL, max: CONCURRENCY })
const nc = await connect({ servers: '127.0.0.1:4222' })
const jsm = await nc.jetstreamManager()
const redis = new Redis(6379, '127.0.0.1', { enableAutoPipelining: true })
// noDelay: amqplib leaves Nagle's algorithm on, which holds small frames (publishes, confirms, acks) back by up to 40 ms.
// Publishing and consuming on separate connections, as RabbitMQ advises: flow control throttles a
// publishing connection, and one connection is one socket and one reader process in the broker.
const amqpConnection = await amqp.connect('amqp://guest:guest@127.0.0.1:5672', { noDelay: true })
const amqpConsumeConnection = await amqp.connect('amqp://guest:guest@127.0.0.1:5672', { noDelay: true })
const cleanups: Array<() => Promise<unknown>> = []

/** One broker wired end to end: where the relay publishes, and how a consumer helper starts. */
interface Wiring {
  publisher: Publisher
  topic: (account: number) => string
  consume: (inbox: PgInbox, handler: (tx: PgClientLike, m: InboxMessage) => Promise<unknown>) => Promise<RunningConsumer>
}

const byAccount = (m: InboxMessage) => m.headers?.account ?? null

async function wire(broker: string, run: string): Promise<Wiring> {
  const name = `bench_${tag}_${run}`
  if (broker === 'nats') {
    const stream = name.toUpperCase()
    await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], duplicate_window: nanos(120_000), max_msgs: 1_000_000 })
    await jsm.consumers.add(stream, { durable_name: 'bench', ack_policy: AckPolicy.Explicit, max_ack_pending: 10_000 })
    cleanups.push(() => jsm.streams.delete(stream))
    return {
      publisher: new NatsPublisher({ connection: nc }),
      // A subject per account: the helper's default partition key (the subject) orders per account.
      topic: (account) => `${stream}.account.${account}`,
      consume: (inbox, handler) => consumeNats({ connection: nc, stream, consumer: 'bench', inbox, handler, concurrency: CONCURRENCY }),
    }
  }
  if (broker === 'redis') {
    const reader = new Redis(6379, '127.0.0.1')
    cleanups.push(async () => {
      await redis.del(name)
      reader.disconnect()
    })
    return {
      publisher: new RedisStreamsPublisher({ redis }),
      topic: () => name,
      consume: (inbox, handler) =>
        consumeRedisStreams({
          redis: reader,
          stream: name,
          group: 'bench',
          consumer: 'c1',
          inbox,
          handler,
          concurrency: CONCURRENCY,
          partitionKey: byAccount,
        }),
    }
  }
  const channel = await amqpConnection.createChannel()
  await channel.assertQueue(name, { durable: false, autoDelete: false })
  cleanups.push(() => channel.deleteQueue(name))
  return {
    publisher: new RabbitMqPublisher({ channel: await amqpConnection.createConfirmChannel() }),
    topic: () => name,
    consume: async (inbox, handler) =>
      consumeRabbitMq({
        channel: await amqpConsumeConnection.createChannel(),
        queue: name,
        inbox,
        handler,
        concurrency: CONCURRENCY,
        partitionKey: byAccount,
      }),
  }
}

/** A relay of either kind, as the runs drive it. */
interface BenchRelay {
  start(): void
  stop(): Promise<void>
}

/** Outbox, inbox and effect tables of one run, plus the timestamps. */
async function setup(broker: string, run: string, mode: 'polling' | 'cdc', ordering: 'partition' | 'none' = 'partition') {
  run = `${run}_${mode}`
  const wiring = await wire(broker, run)
  const outboxTable = `${schema}.outbox_${broker}_${run}`
  const outbox = new PgOutbox({ pool, table: outboxTable, ordering })
  await outbox.migrate()
  const appliedAt = new Map<string, number>()
  const inbox = new PgInbox({
    pool: inboxPool,
    consumer: 'bench',
    table: `${schema}.inbox_${broker}_${run}`,
    onEvent(event) {
      if (event.type === 'applied') appliedAt.set(event.messageId, performance.now())
    },
  })
  await inbox.migrate()
  const accounts = `"${schema}"."accounts_${broker}_${run}"`
  await pool.query(`CREATE TABLE ${accounts} (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`)
  await pool.query(`INSERT INTO ${accounts} (id) SELECT generate_series(0, ${ACCOUNTS - 1})`)
  const handler = (tx: PgClientLike, m: InboxMessage) =>
    tx.query(`UPDATE ${accounts} SET balance = balance + 1 WHERE id = $1`, [Number(m.headers?.account)])
  // The CDC relay's slot exists before the first event is written (a slot streams what commits after it).
  let cdcEvents: ((event: RelayEvent) => void) | undefined
  const cdc =
    mode === 'cdc'
      ? new PgCdcRelay({
          connection: PG_URL,
          publisher: wiring.publisher,
          table: outboxTable,
          slot: `bench_${tag}_${broker}_${run}`.toLowerCase(),
          batchSize: 500,
          onEvent: (event) => {
            if (event.type === 'published' || event.type === 'failed' || event.type === 'error') cdcEvents?.(event)
          },
        })
      : undefined
  if (cdc) {
    await cdc.setup()
    cleanups.push(async () => {
      await cdc.stop()
      await cdc.drop()
      await cdc.stop() // closes the query connection drop() used
    })
  }
  const relay = (onEvent?: (event: RelayEvent) => void): BenchRelay => {
    if (cdc) {
      cdcEvents = onEvent
      return cdc
    }
    return new OutboxRelay({ outbox, publisher: wiring.publisher, batchSize: 500, concurrency: 2, ...(onEvent ? { onEvent } : {}) })
  }
  const event = (i: number) => {
    const account = i % ACCOUNTS
    return {
      topic: wiring.topic(account),
      payload: { i, at: Date.now() },
      partitionKey: String(account),
      headers: { account: String(account) },
    }
  }
  return { wiring, outbox, inbox, appliedAt, handler, relay, event }
}

async function waitFor(done: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms
  while (!done() && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5))
  return done()
}

async function latency(broker: string, mode: 'polling' | 'cdc') {
  const s = await setup(broker, 'latency', mode)
  const consumer = await s.wiring.consume(s.inbox, s.handler)
  const publishedAt = new Map<string, number>()
  const relay = s.relay((event) => {
    if (event.type !== 'published') return
    const now = performance.now()
    for (const m of event.messages) publishedAt.set(m.id, now)
  })
  relay.start()
  const committedAt = new Map<string, number>()
  const cpuBefore = process.cpuUsage()
  const { produced, achieved, elapsedMs } = await steadyLoad(RATE, SECONDS, async (i) => {
    const client = await pool.connect()
    try {
      await client.query('BEGIN')
      const { id } = await s.outbox.add(client, s.event(i))
      await client.query('COMMIT')
      committedAt.set(id, performance.now())
    } finally {
      client.release()
    }
  })
  const cpu = process.cpuUsage(cpuBefore)
  const cpuShare = (cpu.user + cpu.system) / 1_000 / elapsedMs
  await waitFor(() => s.appliedAt.size >= committedAt.size, 30_000)
  await relay.stop()
  await consumer.stop()
  // An effect committed before its producer's COMMIT reply was timed here counts as 0 ms.
  const values = [...committedAt].flatMap(([id, at]) => {
    const applied = s.appliedAt.get(id)
    return applied === undefined ? [] : [Math.max(0, applied - at)]
  })
  const toBroker = [...committedAt].flatMap(([id, at]) => {
    const published = publishedAt.get(id)
    return published === undefined ? [] : [Math.max(0, published - at)]
  })
  return {
    p50: percentile(values, 50),
    p99: percentile(values, 99),
    max: Math.max(...values),
    samples: values.length,
    produced,
    achieved,
    cpuShare,
    relayP50: percentile(toBroker, 50),
    relayP99: percentile(toBroker, 99),
  }
}

async function addBacklog(s: Awaited<ReturnType<typeof setup>>, n: number): Promise<void> {
  const writers = 8
  await Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      const client = await pool.connect()
      try {
        await client.query('BEGIN')
        for (let i = w; i < n; i += writers) await s.outbox.add(client, s.event(i))
        await client.query('COMMIT')
      } finally {
        client.release()
      }
    }),
  )
}

/** End to end: relay and consumer drain a committed backlog together. */
async function endToEnd(broker: string, mode: 'polling' | 'cdc', ordering: 'partition' | 'none' = 'partition'): Promise<number> {
  const s = await setup(broker, `e2e_${ordering}`, mode, ordering)
  await addBacklog(s, EVENTS)
  const started = performance.now()
  const consumer = await s.wiring.consume(s.inbox, s.handler)
  const relay = s.relay()
  relay.start()
  const ok = await waitFor(() => s.appliedAt.size >= EVENTS, 120_000)
  const seconds = (performance.now() - started) / 1_000
  await relay.stop()
  await consumer.stop()
  if (!ok) throw new Error(`${broker}: only ${s.appliedAt.size} of ${EVENTS} applied`)
  return EVENTS / seconds
}

/** Consumer alone: the backlog is in the broker before the consumer starts (the relay alone puts it there, timed too). */
async function consumerOnly(broker: string, mode: 'polling' | 'cdc'): Promise<{ consumer: number; relay: number }> {
  const s = await setup(broker, 'drain', mode)
  await addBacklog(s, EVENTS)
  const relayStarted = performance.now()
  if (mode === 'polling') {
    const relay = new OutboxRelay({ outbox: s.outbox, publisher: s.wiring.publisher, batchSize: 500, concurrency: 2 })
    await Promise.all(
      [0, 1].map(async () => {
        while ((await relay.runOnce()) > 0) {}
      }),
    )
  } else {
    let published = 0
    const relay = s.relay((event) => {
      if (event.type === 'published') published += event.messages.length
    })
    relay.start()
    const ok = await waitFor(() => published >= EVENTS, 120_000)
    await relay.stop()
    if (!ok) throw new Error(`${broker}: the CDC relay published ${published} of ${EVENTS}`)
  }
  const relayRate = EVENTS / ((performance.now() - relayStarted) / 1_000)
  const started = performance.now()
  const consumer = await s.wiring.consume(s.inbox, s.handler)
  const ok = await waitFor(() => s.appliedAt.size >= EVENTS, 120_000)
  const seconds = (performance.now() - started) / 1_000
  await consumer.stop()
  if (!ok) throw new Error(`${broker}: only ${s.appliedAt.size} of ${EVENTS} applied`)
  return { consumer: EVENTS / seconds, relay: relayRate }
}

const names: Record<string, string> = { nats: 'NATS JetStream', redis: 'Redis Streams', rabbitmq: 'RabbitMQ' }
try {
  await pool.query(`CREATE SCHEMA "${schema}"`)
  const rows: Array<Array<string | number>> = []
  const latencyRows: Array<Array<string | number>> = []
  for (const broker of BROKERS)
    for (const mode of RELAYS) {
      if (process.argv.includes('--drain-only')) {
        console.log(broker, mode, 'alone', await consumerOnly(broker, mode))
        continue
      }
      const lat = await latency(broker, mode)
      const e2e = await endToEnd(broker, mode)
      // The CDC relay has no claim to order: the outbox's `ordering` does not apply to it.
      const e2eNone = mode === 'polling' ? await endToEnd(broker, mode, 'none') : Number.NaN
      const drain = await consumerOnly(broker, mode)
      console.log(broker, mode, { ...lat, e2e, e2eNone, drain })
      latencyRows.push([
        names[broker] ?? broker,
        mode === 'cdc' ? 'CDC' : 'polling',
        `${fmt(RATE)}/s`,
        `${fmt(lat.achieved)}/s`,
        `${lat.samples}/${lat.produced}`,
        fmt(lat.p50, 1),
        fmt(lat.p99, 1),
        fmt(lat.max, 1),
        `${fmt(lat.relayP50, 1)} / ${fmt(lat.relayP99, 1)}`,
        '50 ms',
        lat.p99 <= 50 && lat.samples === lat.produced ? 'yes' : 'NO',
      ])
      rows.push([
        names[broker] ?? broker,
        mode === 'cdc' ? 'CDC' : 'polling',
        EVENTS,
        fmt(e2e),
        Number.isNaN(e2eNone) ? 'n/a' : fmt(e2eNone),
        fmt(drain.consumer),
        fmt(drain.relay),
        '5,000',
        e2e >= 5_000 ? 'yes' : 'NO',
        drain.consumer >= 5_000 ? 'yes' : 'NO',
      ])
    }
  report(
    'consumers',
    'Consumer helpers: COMMIT → relay → broker → helper → effect committed with PgInbox',
    `npx tsx bench/consumers.bench.ts --events ${EVENTS} --rate ${RATE} --seconds ${SECONDS} --concurrency ${CONCURRENCY} --broker ${BROKERS.join(',')} --relay ${RELAYS.join(',')}`,
    `${server.throwaway ? `PostgreSQL: a throwaway PostgreSQL 15 with wal_level = logical and fsync on, started by the bench (the server at IDEMKEY_PG_URL does not run wal_level = logical); every row ran on it. ` : ''}Each event goes through a PgOutbox, one relay: the polling OutboxRelay (batch 500, 2 batches in flight, woken by LISTEN/NOTIFY) or the CDC PgCdcRelay (a pgoutput slot read through pg-logical-replication, batch 500), the broker, and the broker's consumer helper (\`concurrency: ${CONCURRENCY}\`), whose effect (an UPDATE of the event's account row, ${ACCOUNTS} accounts) commits in one PgInbox transaction with the message ID; the ack follows that commit. The partition key is the account: on NATS a subject per account (the helper's default key), on Redis and RabbitMQ \`partitionKey\` reading an \`account\` header. Producers, relay, consumer, PostgreSQL and the brokers share the machine.\n\n` +
      `Latency: 8 producers commit one event per transaction at a steady offered rate for ${SECONDS} s; time from the producer's COMMIT returning to the effect's COMMIT (PgInbox \`applied\`). Samples: effects seen / events produced. The relay column is the part up to the broker's confirm (the relay's \`published\` event), to show what binds.\n\n${table(
        [
          'broker',
          'relay',
          'offered rate',
          'achieved rate',
          'samples',
          'p50 ms',
          'p99 ms',
          'max ms',
          'of which COMMIT → broker confirm (relay) p50 / p99 ms',
          'target p99',
          'met',
        ],
        latencyRows,
      )}\n\n` +
      `Throughput: a committed outbox backlog of ${EVENTS} events. End to end: the relay and the consumer start together, timed until the last effect committed. Relay alone: the same backlog published and marked sent by the relay (2 batches in flight) with no consumer running. Consumer alone: then, with the backlog in the broker, timed from the consumer's start to its last effect. The events carry the account as their outbox partition key, with the outbox's default \`ordering: 'partition'\`; the next column repeats the end-to-end run with \`ordering: 'none'\` (the relay then claims without regard to partitions; the consumer still orders per account).\n\n${table(
        [
          'broker',
          'relay',
          'events',
          'events/s end to end (relay + consumer)',
          "same, outbox `ordering: 'none'`",
          'events/s consumer alone',
          'events/s relay alone',
          'target',
          'met end to end',
          'met by the consumer alone',
        ],
        rows,
      )}`,
  )
} finally {
  for (const cleanup of cleanups) await cleanup().catch(() => {})
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {})
  await pool.end()
  await inboxPool.end()
  await server.throwaway?.destroy()
  await nc.close()
  redis.disconnect()
  await amqpConnection.close().catch(() => {})
  await amqpConsumeConnection.close().catch(() => {})
}
