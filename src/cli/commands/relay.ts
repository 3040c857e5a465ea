import { redactUrl } from '../../core/redact-url.js'
import { durationArg, intArg, sizeOption, urlArg } from '../options.js'
import { type Command, InvalidArgumentError, Option } from '../program.js'
import type { BrokerKind, RelayFlags } from '../relay/flags.js'

/** `idemkey relay`: the CDC relay (docs/messaging.md, "CDC relay") as a standalone process. */
export function registerRelay(program: Command): void {
  program
    .command('relay')
    .description("publish outbox rows from PostgreSQL's logical replication stream to NATS JetStream, RabbitMQ or Redis Streams")
    .requiredOption(
      '--from <url>',
      'the PostgreSQL holding the outbox, postgres://USER@HOST:PORT/DB (wal_level = logical)',
      urlArg('--from <url>', fromArg),
    )
    .requiredOption(
      '--to <url>',
      'the broker: nats://HOST:4222, amqp://USER:PASS@HOST:5672 (or amqps://), redis://HOST:6379',
      urlArg('--to <url>', toArg),
    )
    .option('--table <name>', 'the outbox table (PgOutbox table), optionally schema.table', 'idemkey_outbox')
    .option('--slot <name>', 'replication slot (default: idemkey_cdc_<table>)')
    .option('--publication <name>', 'publication (default: the slot name)')
    .option('--batch-size <n>', 'messages per broker round trip', intArg('--batch-size', 1, 100_000), 256)
    .addOption(sizeOption('--max-lag <size>', '/readyz answers 503 when the slot holds more WAL than this', '256mb'))
    .addOption(
      new Option(
        '--silent-connection-timeout <duration>',
        'replace a PostgreSQL connection that answers nothing this long (half-open); at least 2s',
      )
        .argParser(silentTimeoutArg)
        .default(30_000, '30s'),
    )
    .option('--exchange <name>', 'RabbitMQ exchange to publish to ("" is the default exchange, which routes by queue name)', '')
    .option('--no-setup', 'do not create the publication and slot when missing (they must exist)')
    .option(
      '--health-port <port>',
      'serve /healthz and /readyz (slot lag) on this port (0: any free port)',
      intArg('--health-port', 0, 65535),
    )
    .option('--health-host <host>', 'address of the health port', '127.0.0.1')
    .addHelpText(
      'after',
      `
Examples:
  idemkey relay --from postgres://app@127.0.0.1:5432/app --to nats://127.0.0.1:4222
  idemkey relay --from postgres://app@db:5432/app --to amqp://guest:guest@rabbit:5672 --table orders_outbox
  idemkey relay --from postgres://app@db:5432/app --to redis://cache:6379 --health-port 9091
  One relay per slot publishes; start a second one as a standby, it takes over when the first stops.
  Each outbox row's topic names the NATS subject, the RabbitMQ routing key or the Redis stream key.`,
    )
    .action(async (flags: Omit<RelayFlags, 'to'> & { to: RelayFlags['to'] }) => {
      // Loaded only now: the broker clients and pg stay out of other commands.
      const { runRelay } = await import('../relay/run.js')
      await runRelay(flags)
    })
}

/** `--silent-connection-timeout`: a duration of at least 2 s (the relay asks for a keepalive every second). */
function silentTimeoutArg(value: string): number {
  const ms = durationArg('--silent-connection-timeout', undefined, true)(value)
  if (ms < 2_000) {
    throw new InvalidArgumentError(
      `must be at least 2s (the relay asks the server for a keepalive every second; a shorter limit would replace healthy connections), got "${value}".`,
    )
  }
  return ms
}

/** `--from`: a PostgreSQL URL, checked now so a typo fails before anything connects. */
export function fromArg(value: string): string {
  let url: URL
  try {
    url = new URL(value)
  } catch {
    throw new InvalidArgumentError(`--from expects a PostgreSQL URL such as postgres://app@127.0.0.1:5432/app, got "${redactUrl(value)}".`)
  }
  if (url.protocol !== 'postgres:' && url.protocol !== 'postgresql:') {
    throw new InvalidArgumentError(
      `--from expects a postgres:// URL (the CDC relay reads PostgreSQL's logical replication), got ${url.protocol}//…`,
    )
  }
  return value
}

/** `--to`: a broker URL; its scheme picks the publisher. */
export function toArg(value: string): RelayFlags['to'] {
  const scheme = /^([a-z]+):\/\//i.exec(value)?.[1]?.toLowerCase()
  const kind: BrokerKind | undefined =
    scheme === 'nats' || scheme === 'tls'
      ? 'nats'
      : scheme === 'amqp' || scheme === 'amqps'
        ? 'rabbitmq'
        : scheme === 'redis' || scheme === 'rediss'
          ? 'redis'
          : undefined
  if (!kind) {
    throw new InvalidArgumentError(
      `--to expects a broker URL: nats://HOST:4222 (NATS JetStream), amqp://HOST:5672 or amqps:// (RabbitMQ), redis://HOST:6379 or rediss:// (Redis Streams); got "${redactUrl(value)}".`,
    )
  }
  return { kind, url: value }
}
