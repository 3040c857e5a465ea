import { redactUrl } from '../../core/redact-url.js'
import { credentialRule } from '../../http/credentials.js'
import { isHeaderName } from '../../protocol/key-header.js'
import {
  durationOption,
  hostArg,
  intArg,
  logFormatOption,
  logLevelOption,
  methodsArg,
  sizeOption,
  storeOption,
  TIMEOUT_OF_ZERO,
  urlArg,
} from '../options.js'
import { type Command, InvalidArgumentError, Option } from '../program.js'
import type { ProxyFlags } from '../proxy/flags.js'
import { defaultMaxConnections } from '../proxy/limits.js'

/** `idemkey proxy`: idempotency keys (the HTTP layer of docs/http.md) in front of any HTTP API. */
export function registerProxy(program: Command): void {
  program
    .command('proxy')
    .description('reverse proxy that gives any HTTP API idempotency keys: replays, 422 on reuse, 409 while in flight')
    .requiredOption('--upstream <url>', 'the API behind the proxy, e.g. http://127.0.0.1:3000', urlArg('--upstream <url>', upstreamArg))
    .option('--port <port>', 'port to listen on (0: any free port)', intArg('--port', 0, 65535), 8080)
    .option('--host <host>', 'address to listen on', hostArg('--host'), '127.0.0.1')
    .addOption(storeOption())
    .addOption(
      durationOption(
        '--lease <duration>',
        'how long a request owns its key without renewal (renewed while it runs)',
        '30s',
        'a request must own its key for some time',
      ),
    )
    .addOption(durationOption('--ttl <duration>', 'how long outcomes are replayed', '24h', 'an outcome kept for no time is never replayed'))
    .addOption(durationOption('--wait <duration>', 'how long a duplicate waits for the first request before 409', '10s'))
    .addOption(
      new Option('--methods <list>', 'methods covered; others stream through untouched')
        .argParser(methodsArg)
        .default(['POST', 'PATCH'], 'POST,PATCH'),
    )
    .option('--require-key', 'answer 400 to a covered request without Idempotency-Key')
    .option(
      '--scope-header <name>',
      'scope keys by this header, set by a trusted gateway (e.g. X-Tenant-Id); default: a keyed hash of Authorization',
      headerNameArg,
    )
    .option(
      '--scope-credentials <list>',
      'what identifies a caller, e.g. cookie:session or header:x-api-key (comma-separated; authorization, cookie:<name>, header:<name>); default: Authorization, refusing keyed requests that carry an unnamed cookie or API key',
      credentialsArg,
    )
    .option(
      '--scope-secret <secret>',
      'secret that keys the Authorization hash, the same on every proxy (default: $IDEMKEY_SCOPE_SECRET; prefer the variable, flags show in ps)',
    )
    .addOption(sizeOption('--max-body <size>', 'largest covered request body (413 beyond)', '1mb'))
    .addOption(
      durationOption('--upstream-timeout <duration>', 'upstream slower than this: 504, record released', '30s', TIMEOUT_OF_ZERO, true),
    )
    .addOption(limitOptions.headerTimeout())
    .addOption(limitOptions.bodyTimeout())
    .addOption(limitOptions.maxConnections())
    .addOption(limitOptions.maxBuffered())
    .addOption(limitOptions.maxStoredBody())
    .addOption(limitOptions.maxTunnels())
    .addOption(limitOptions.tunnelIdleTimeout())
    .addOption(
      durationOption('--drain-timeout <duration>', 'on SIGTERM/SIGINT, how long to wait for in-flight requests', '30s', undefined, true),
    )
    .option(
      '--admin-port <port>',
      'serve /metrics (Prometheus), /healthz, /readyz and the operator page on this port (0: any free port)',
      intArg('--admin-port', 0, 65535),
    )
    .option(
      '--admin-host <host>',
      'address of the admin port; the operator page answers other hosts only with --admin-token',
      hostArg('--admin-host'),
      '127.0.0.1',
    )
    .option(
      '--admin-allowed-hosts <list>',
      'host names the operator page answers besides loopback names and IP addresses (comma-separated): the names you reach it by',
      (value: string) =>
        value
          .split(',')
          .map((h) => h.trim())
          .filter(Boolean),
    )
    .addOption(
      new Option(
        '--admin-token <token>',
        'bearer token the operator page asks for, at least 16 characters (prefer $IDEMKEY_ADMIN_TOKEN: flags show in ps)',
      ).env('IDEMKEY_ADMIN_TOKEN'),
    )
    .addOption(logLevelOption())
    .addOption(logFormatOption())
    .addHelpText(
      'after',
      `
Examples:
  idemkey proxy --upstream http://127.0.0.1:3000
  idemkey proxy --upstream http://127.0.0.1:3000 --port 8080 --require-key --scope-header X-Tenant-Id
  idemkey proxy --upstream http://api.internal:3000 --host 0.0.0.0 --store postgres://idemkey@db:5432/app
  idemkey proxy --upstream http://127.0.0.1:3000 --admin-port 9090 --log-level warn
  Several proxies may share one PostgreSQL or Redis store behind a load balancer (see docs/proxy.md).`,
    )
    .action(async (flags: ProxyFlags) => {
      // Loaded only now: the proxy's HTTP client, the engine and the store stay out of other commands.
      const { runProxy } = await import('../proxy/run.js')
      await runProxy(flags)
    })
}

/** The flags that bound what clients can hold of the proxy (docs/proxy.md, "Limits and timeouts"). */
const limitOptions = {
  headerTimeout: () =>
    durationOption(
      '--header-timeout <duration>',
      'request headers slower than this: 408 and the connection closed (idle connections too)',
      '10s',
      TIMEOUT_OF_ZERO,
      true,
    ),
  bodyTimeout: () =>
    durationOption(
      '--body-timeout <duration>',
      'a covered request body slower than this: 408, connection closed, nothing recorded; also how long a client may stall reading a covered response',
      '30s',
      TIMEOUT_OF_ZERO,
      true,
    ),
  maxConnections: () =>
    new Option('--max-connections <n>', 'open client connections at most; past it the longest-idle one is closed to make room')
      .argParser(intArg('--max-connections', 1))
      .default(defaultMaxConnections(), '1024, fewer under a low open-file limit'),
  maxBuffered: () =>
    sizeOption(
      '--max-buffered <size>',
      'bytes held at once across covered request bodies and held responses; past it new covered requests get 503',
      '64mb',
    ),
  maxTunnels: () =>
    new Option('--max-tunnels <n>', 'WebSocket tunnels open at once (not counted in --max-connections); past it an upgrade gets 503')
      .argParser(intArg('--max-tunnels', 0))
      .default(128),
  tunnelIdleTimeout: () =>
    durationOption(
      '--tunnel-idle-timeout <duration>',
      'a WebSocket tunnel with no bytes either way for this long is closed',
      '60s',
      TIMEOUT_OF_ZERO,
      true,
    ),
  maxStoredBody: () =>
    sizeOption(
      '--max-stored-body <size>',
      'largest response stored for replay; a larger one streams through and replays without its body',
      '1mb',
    ),
}

/** `--scope-header`: a name requests can carry; another one would never match, and every request would fall back to the credential's scope. */
function headerNameArg(value: string): string {
  if (!isHeaderName(value)) {
    throw new InvalidArgumentError(
      `expected an HTTP header name such as X-Tenant-Id (letters, digits and !#$%&'*+-.^_\`|~, no spaces or colons), got ${JSON.stringify(value)}.`,
    )
  }
  return value
}

/** `--scope-credentials`: checked as the engine checks its `credentials`, so a typo fails at start. */
function credentialsArg(value: string): string[] {
  const list = value
    .split(',')
    .map((entry) => entry.trim())
    .filter(Boolean)
  try {
    credentialRule(list, '--scope-credentials')
  } catch (error) {
    throw new InvalidArgumentError((error as Error).message)
  }
  return list
}

function upstreamArg(value: string): string {
  let url: URL
  try {
    url = new URL(value)
  } catch {
    throw new InvalidArgumentError(`expected an http:// URL such as http://127.0.0.1:3000, got "${redactUrl(value)}".`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new InvalidArgumentError(`expected an http:// or https:// URL, got "${redactUrl(value)}".`)
  }
  // The proxy forwards to the upstream's origin and path prefix only: say so rather than drop the rest.
  if (url.username || url.password) {
    throw new InvalidArgumentError(
      `the upstream URL takes no user or password (the proxy sends none; each client's own Authorization header passes through), got "${redactUrl(value)}".`,
    )
  }
  if (value.includes('?') || value.includes('#')) {
    throw new InvalidArgumentError(
      `the upstream URL is an origin with an optional path prefix, without ?query or #fragment (each request's own path and query follow the prefix), got "${value}".`,
    )
  }
  return value
}
