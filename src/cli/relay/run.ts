/** What `idemkey relay` does once its flags are parsed: open the broker, stream, serve health, stop on SIGTERM. */
import { createServer, type Server } from 'node:http'
import { PgCdcRelay, type PgCdcRelayEvent } from '../../backends/postgres/postgres-cdc-relay.js'
import { cachedDurability } from '../../core/durability.js'
import { redactUrl } from '../../core/redact-url.js'
import type { Publisher } from '../../messaging/message.js'
import { readDurability } from '../commands/doctor-read.js'
import { listen } from '../listen.js'
import { durabilityDetails } from '../proxy/admin-server.js'
import { CliError } from '../run.js'
import { parseStoreUrl } from '../store-url.js'
import type { BrokerKind, RelayFlags } from './flags.js'

interface OpenedPublisher {
  publisher: Publisher
  close(): Promise<void>
}

/** Runs the CDC relay until SIGTERM or SIGINT. */
export async function runRelay(flags: RelayFlags): Promise<void> {
  const broker = await openBroker(flags.to.kind, flags.to.url, flags.exchange)
  let published = 0
  const relay = new PgCdcRelay({
    connection: flags.from,
    publisher: broker.publisher,
    table: flags.table,
    slot: flags.slot,
    publication: flags.publication,
    batchSize: flags.batchSize,
    maxLagBytes: flags.maxLag,
    silentConnectionTimeout: flags.silentConnectionTimeout,
    onEvent: (event) => {
      if (event.type === 'published') published += event.messages.length
      report(event)
    },
  })
  let health: Server | undefined
  try {
    if (flags.setup) await relay.setup()
    if (flags.healthPort !== undefined) health = await serveHealth(relay, flags.healthHost, flags.healthPort, flags.from)
  } catch (error) {
    // Not half started: the broker's connection would keep a relay that cannot run alive.
    await relay.stop().catch(() => {})
    await broker.close().catch(() => {})
    throw error
  }
  relay.start()
  say(`relaying ${flags.table} from slot ${relay.slot} to ${redactUrl(flags.to.url)} (SIGTERM or Ctrl-C stops)`)

  const stop = async (signal: string) => {
    say(`${signal}: finishing the batch in flight`)
    await relay.stop()
    await new Promise<void>((resolve) => (health ? health.close(() => resolve()) : resolve()))
    await broker.close().catch(() => {})
    say(`stopped; published ${published} message${published === 1 ? '' : 's'}`)
    process.exit(0)
  }
  process.once('SIGTERM', () => void stop('SIGTERM'))
  process.once('SIGINT', () => void stop('SIGINT'))
}

function say(line: string): void {
  process.stderr.write(`idemkey relay: ${line}\n`)
}

/** One line per change of state or failure; published batches are summed, not logged one by one. */
function report(event: PgCdcRelayEvent): void {
  if (event.type === 'streaming') say(`streaming from slot ${event.slot}`)
  else if (event.type === 'standby') say(`standing by: ${event.error.message}`)
  else if (event.type === 'error') say(`error (retrying): ${event.error instanceof Error ? event.error.message : String(event.error)}`)
  else if (event.type === 'failed') {
    say(
      `message ${event.message.id} to ${event.message.topic} ${event.dead ? 'dead-lettered' : 'failed, retrying'}: ${event.error.message}`,
    )
  }
}

/** `/healthz`: the process runs. `/readyz`: the slot exists and lags at most `--max-lag` (503 with the slot's state otherwise). */
async function serveHealth(relay: PgCdcRelay, host: string, port: number, from: string): Promise<Server> {
  // What the source database's settings can lose (idemkey doctor's report), read at most once a minute.
  const durability = cachedDurability(() => readDurability(parseStoreUrl(from)))
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' })
      res.end(`${JSON.stringify(body)}\n`)
    }
    if (path === '/healthz') return json(200, { status: 'ok' })
    if (path !== '/readyz') return json(404, { error: 'not found: /healthz or /readyz' })
    relay.ready().then(
      async () =>
        json(200, {
          status: 'ready',
          ...(await relay.health().catch(() => ({}))),
          durability: durabilityDetails(await durability()),
        }),
      (error: unknown) =>
        json(503, {
          status: 'not ready',
          error: error instanceof Error ? error.message : String(error),
          ...((error as { health?: object }).health ?? {}),
        }),
    )
  })
  await listen(server, port, host, { port: '--health-port', host: '--health-host' })
  const address = server.address()
  const actual = typeof address === 'object' && address ? address.port : port
  say(`health on http://${host}:${actual} (/healthz, /readyz)`)
  return server
}

async function openBroker(kind: BrokerKind, url: string, exchange: string): Promise<OpenedPublisher> {
  try {
    if (kind === 'nats') {
      const { connect } = await importPeer<typeof import('nats')>('nats')
      const { NatsPublisher } = await import('../../messaging/brokers/nats/nats-publisher.js')
      const connection = await connect({ servers: url })
      return { publisher: new NatsPublisher({ connection }), close: () => connection.close() }
    }
    if (kind === 'rabbitmq') {
      const amqp = await importPeer<typeof import('amqplib')>('amqplib')
      const { RabbitMqPublisher } = await import('../../messaging/brokers/rabbitmq/rabbitmq-publisher.js')
      // Nagle's algorithm (amqplib's default) holds publishes and their confirms back by up to 40 ms.
      const connection = await amqp.connect(url, { noDelay: true })
      const channel = await connection.createConfirmChannel()
      return { publisher: new RabbitMqPublisher({ channel, exchange }), close: () => connection.close() }
    }
    const { Redis } = await importPeer<typeof import('ioredis')>('ioredis')
    const { RedisStreamsPublisher } = await import('../../messaging/brokers/redis-streams/redis-streams-publisher.js')
    const redis = new Redis(url, { maxRetriesPerRequest: 3 })
    // Until it answers, each failed attempt is the one line below, not an "Unhandled error event" per retry.
    const quiet = () => {}
    redis.on('error', quiet)
    try {
      await redis.ping()
    } catch (error) {
      // ioredis keeps reconnecting, which would keep the process alive after the error is reported.
      redis.disconnect()
      throw error
    }
    redis.off('error', quiet)
    return { publisher: new RedisStreamsPublisher({ redis }), close: async () => void redis.disconnect() }
  } catch (error) {
    if (error instanceof CliError) throw error
    throw new CliError(`Could not connect to ${redactUrl(url)}: ${(error as Error).message}`)
  }
}

async function importPeer<T>(name: string): Promise<T> {
  try {
    const mod = (await import(name)) as T & { default?: T }
    return (mod.default && typeof mod.default === 'object' ? { ...mod.default, ...mod } : mod) as T
  } catch (error) {
    throw new CliError(`idemkey relay needs the ${name} package for this broker: npm install ${name} (${(error as Error).message})`, 2)
  }
}
