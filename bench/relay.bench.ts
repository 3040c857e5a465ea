/**
 * Relay benchmark (issue 8), PostgreSQL + NATS JetStream on loopback:
 * 1. throughput: a committed backlog drained to broker confirmation (PubAck) and marked sent, with
 *    one and with two relays side by side;
 * 2. latency: producers commit one event per transaction at a steady rate; commit-to-PubAck p50/p99
 *    with the relay woken by LISTEN/NOTIFY.
 * Run alone: npx tsx bench/relay.bench.ts [--events 20000] [--rate 1000] [--seconds 10] [--batch 500]
 */
import { randomUUID } from 'node:crypto'
import { connect, nanos } from 'nats'
import pg from 'pg'
import { NatsPublisher } from '../src/messaging/brokers/nats/index.js'
import { OutboxRelay, PgOutbox, type RelayEvent } from '../src/messaging/outbox/index.js'
import { fmt, numberArg, percentile, report, steadyLoad, table } from './lib.js'

const EVENTS = numberArg('events', 20_000)
const RATE = numberArg('rate', 1_000)
const SECONDS = numberArg('seconds', 10)
const BATCH = numberArg('batch', 500)
const PG_URL = process.env.IDEMKEY_PG_URL ?? 'postgres://root@127.0.0.1:5432/test'

const schema = `bench_relay_${randomUUID().replaceAll('-', '').slice(0, 10)}`
const stream = `BENCH_RELAY_${randomUUID().replaceAll('-', '').slice(0, 10).toUpperCase()}`
const pool = new pg.Pool({ connectionString: PG_URL, max: 16 })
const nc = await connect({ servers: '127.0.0.1:4222' })
const jsm = await nc.jetstreamManager()

async function addBacklog(outbox: PgOutbox, n: number, topic: string): Promise<void> {
  const writers = 8
  await Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      const client = await pool.connect()
      try {
        await client.query('BEGIN')
        for (let i = w; i < n; i += writers) await outbox.add(client, { topic, payload: { i, at: Date.now() } })
        await client.query('COMMIT')
      } finally {
        client.release()
      }
    }),
  )
}

async function drain(relays: number, concurrency: number, ordering: 'none' | 'partition', table: string): Promise<number> {
  const outbox = new PgOutbox({ pool, table, ordering })
  await outbox.migrate()
  await addBacklog(outbox, EVENTS, `${stream}.bulk`)
  const publisher = new NatsPublisher({ connection: nc })
  const started = performance.now()
  await Promise.all(
    Array.from({ length: relays }, async () => {
      const relay = new OutboxRelay({ outbox, publisher, batchSize: BATCH, concurrency })
      // What start() does with `concurrency` workers, but ending when the backlog is empty.
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          while ((await relay.runOnce()) > 0) {}
        }),
      )
    }),
  )
  const seconds = (performance.now() - started) / 1_000
  const stats = await outbox.stats()
  if (stats.sent !== EVENTS) throw new Error(`expected ${EVENTS} sent, got ${JSON.stringify(stats)}`)
  return EVENTS / seconds
}

async function latency(): Promise<{ p50: number; p99: number; max: number; samples: number; achieved: number }> {
  const outbox = new PgOutbox({ pool, table: `${schema}.latency` })
  await outbox.migrate()
  const committedAt = new Map<string, number>()
  const latencies: number[] = []
  const relay = new OutboxRelay({
    outbox,
    publisher: new NatsPublisher({ connection: nc }),
    batchSize: BATCH,
    onEvent(event: RelayEvent) {
      if (event.type !== 'published') return
      const now = performance.now()
      for (const m of event.messages) {
        const at = committedAt.get(m.id)
        if (at !== undefined) latencies.push(now - at)
      }
    },
  })
  relay.start()
  const { achieved } = await steadyLoad(RATE, SECONDS, async (i) => {
    const client = await pool.connect()
    try {
      await client.query('BEGIN')
      const { id } = await outbox.add(client, { topic: `${stream}.latency`, payload: { p: i % 8 } })
      await client.query('COMMIT')
      committedAt.set(id, performance.now())
    } finally {
      client.release()
    }
  })
  const deadline = Date.now() + 10_000
  while ((await outbox.stats()).pending > 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 50))
  await relay.stop()
  // Events published before their commit was timed in this process (possible: NOTIFY and the COMMIT
  // reply race) count as 0 ms rather than being dropped.
  const values = latencies.map((v) => Math.max(0, v))
  return { p50: percentile(values, 50), p99: percentile(values, 99), max: Math.max(...values), samples: values.length, achieved }
}

try {
  await pool.query(`CREATE SCHEMA "${schema}"`)
  await jsm.streams.add({ name: stream, subjects: [`${stream}.>`], duplicate_window: nanos(120_000), max_msgs: 1_000_000 })
  const runs = [
    { relays: 1, concurrency: 1, ordering: 'none' as const },
    { relays: 1, concurrency: 2, ordering: 'none' as const },
    { relays: 2, concurrency: 1, ordering: 'none' as const },
    { relays: 2, concurrency: 1, ordering: 'partition' as const },
  ]
  const rates: number[] = []
  for (const [i, run] of runs.entries()) rates.push(await drain(run.relays, run.concurrency, run.ordering, `${schema}.drain_${i}`))
  const lat = await latency()
  const throughputTable = table(
    ['relays', 'batches in flight per relay', 'ordering', 'batch', 'events', 'events/s (commit → PubAck → marked sent)', 'target', 'met'],
    runs.map((run, i) => [
      run.relays,
      run.concurrency,
      `\`${run.ordering}\``,
      BATCH,
      EVENTS,
      fmt(rates[i] ?? 0),
      '5,000',
      (rates[i] ?? 0) >= 5_000 ? 'yes' : 'NO',
    ]),
  )
  const latencyTable = table(
    ['offered rate', 'achieved rate', 'samples', 'p50 ms', 'p99 ms', 'max ms', 'target p99', 'met'],
    [
      [
        `${fmt(RATE)}/s`,
        `${fmt(lat.achieved)}/s`,
        lat.samples,
        fmt(lat.p50, 1),
        fmt(lat.p99, 1),
        fmt(lat.max, 1),
        '50 ms',
        lat.p99 <= 50 ? 'yes' : 'NO',
      ],
    ],
  )
  report(
    'relay',
    'Outbox relay: PostgreSQL → NATS JetStream',
    `npx tsx bench/relay.bench.ts --events ${EVENTS} --rate ${RATE} --seconds ${SECONDS} --batch ${BATCH}`,
    `Throughput: a committed backlog of ${EVENTS} events drained by the relay(s), each event confirmed by JetStream (PubAck, \`Nats-Msg-Id\` set) and then marked sent. \`ordering: 'partition'\` (the default) serializes claims with an advisory lock; the events here have no partition key, so it measures only that lock's cost.\n\n${throughputTable}\n\n` +
      `Latency: 8 producers commit one event per transaction at a steady offered rate; time from the producer's COMMIT returning to the PubAck, one relay woken by LISTEN/NOTIFY.\n\n${latencyTable}`,
  )
} finally {
  await jsm.streams.delete(stream).catch(() => {})
  await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {})
  await pool.end()
  await nc.close()
}
