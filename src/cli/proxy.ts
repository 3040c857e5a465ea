import { type Command, InvalidArgumentError, Option } from 'commander'
import { formatDuration } from '../core/duration.js'
import { sha256Hex } from '../core/fingerprint.js'
import { Ledger, type LedgerEvent } from '../core/ledger.js'
import type { EngineEvent } from '../http/types.js'
import { DEFAULT_STORE_URL, describeStore, isServerClockStore, openStore, parseStoreUrl } from '../stores/open.js'
import { durationArg, intArg, methodsArg, sizeArg, storeArg } from './options.js'
import { defaultMaxConnections } from './proxy-limits.js'
import { createProxyServer } from './proxy-server.js'
import { ReconnectingStore } from './reconnecting-store.js'
import { CliError } from './run.js'

interface ProxyFlags {
  upstream: string
  port: number
  host: string
  store: string
  lease: number
  ttl: number
  wait: number
  methods: string[]
  requireKey?: boolean
  scopeHeader?: string
  scopeSecret?: string
  maxBody: number
  upstreamTimeout: number
  drainTimeout: number
  headerTimeout: number
  bodyTimeout: number
  maxConnections: number
  maxBuffered: number
  maxStoredBody: number
}

/** `idemkey proxy`: SPEC §5 in front of any HTTP API. */
export function registerProxy(program: Command): void {
  program
    .command('proxy')
    .description('reverse proxy that gives any HTTP API idempotency keys (SPEC §5)')
    .requiredOption('--upstream <url>', 'the API behind the proxy, e.g. http://127.0.0.1:3000', upstreamArg)
    .option('--port <port>', 'port to listen on (0: any free port)', intArg('--port', 0, 65535), 8080)
    .option('--host <host>', 'address to listen on', '127.0.0.1')
    .option('--store <url>', 'store URL: memory:, sqlite:PATH, postgres://…, mysql://…, redis://…', storeArg, DEFAULT_STORE_URL)
    .option('--lease <duration>', 'how long a request owns its key without renewal (renewed while it runs)', durationArg('--lease'), 30_000)
    .option('--ttl <duration>', 'how long outcomes are replayed', durationArg('--ttl'), 24 * 3_600_000)
    .option('--wait <duration>', 'how long a duplicate waits for the first request before 409', durationArg('--wait'), 10_000)
    .option('--methods <list>', 'methods covered; others stream through untouched', methodsArg, ['POST', 'PATCH'])
    .option('--require-key', 'answer 400 to a covered request without Idempotency-Key')
    .option(
      '--scope-header <name>',
      'scope keys by this header, set by a trusted gateway (e.g. X-Tenant-Id); default: a keyed hash of Authorization',
    )
    .option(
      '--scope-secret <secret>',
      'secret that keys the Authorization hash, the same on every proxy (default: $IDEMKEY_SCOPE_SECRET; prefer the variable, flags show in ps)',
    )
    .option('--max-body <size>', 'largest covered request body (413 beyond)', sizeArg('--max-body'), 1024 * 1024)
    .option('--upstream-timeout <duration>', 'upstream slower than this: 504, record released', durationArg('--upstream-timeout'), 30_000)
    .addOption(limitOptions.headerTimeout())
    .addOption(limitOptions.bodyTimeout())
    .addOption(limitOptions.maxConnections())
    .addOption(limitOptions.maxBuffered())
    .addOption(limitOptions.maxStoredBody())
    .option(
      '--drain-timeout <duration>',
      'on SIGTERM/SIGINT, how long to wait for in-flight requests',
      durationArg('--drain-timeout'),
      30_000,
    )
    .addHelpText(
      'after',
      `
Examples:
  idemkey proxy --upstream http://127.0.0.1:3000
  idemkey proxy --upstream http://127.0.0.1:3000 --port 8080 --require-key --scope-header X-Tenant-Id
  idemkey proxy --upstream http://api.internal:3000 --host 0.0.0.0 --store postgres://idemkey@db:5432/app
  Several proxies may share one PostgreSQL or Redis store behind a load balancer (see docs/proxy.md).`,
    )
    .action(async (flags: ProxyFlags) => {
      await runProxy(flags)
    })
}

/** The flags that bound what clients can hold of the proxy (docs/proxy.md, "Limits and timeouts"). */
const limitOptions = {
  headerTimeout: () =>
    new Option('--header-timeout <duration>', 'request headers slower than this: 408 and the connection closed (idle connections too)')
      .argParser(durationArg('--header-timeout'))
      .default(10_000, '10s'),
  bodyTimeout: () =>
    new Option(
      '--body-timeout <duration>',
      'a covered request body slower than this: 408, connection closed, nothing recorded; also how long a client may stall reading a covered response',
    )
      .argParser(durationArg('--body-timeout'))
      .default(30_000, '30s'),
  maxConnections: () =>
    new Option('--max-connections <n>', 'open client connections at most; past it the longest-idle one is closed to make room')
      .argParser(intArg('--max-connections', 1))
      .default(defaultMaxConnections(), '1024, fewer under a low open-file limit'),
  maxBuffered: () =>
    new Option(
      '--max-buffered <size>',
      'bytes held at once across covered request bodies and held responses; past it new covered requests get 503',
    )
      .argParser(sizeArg('--max-buffered'))
      .default(64 * 1024 * 1024, '64mb'),
  maxStoredBody: () =>
    new Option('--max-stored-body <size>', 'largest response stored for replay; a larger one streams through and replays without its body')
      .argParser(sizeArg('--max-stored-body'))
      .default(1024 * 1024, '1mb'),
}

function upstreamArg(value: string): string {
  let url: URL
  try {
    url = new URL(value)
  } catch {
    throw new InvalidArgumentError(`expected an http:// URL such as http://127.0.0.1:3000, got "${value}".`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new InvalidArgumentError(`expected an http:// or https:// URL, got "${value}".`)
  }
  return value
}

async function runProxy(flags: ProxyFlags): Promise<void> {
  if (flags.maxBuffered < flags.maxBody) {
    throw new CliError(
      `--max-buffered (${flags.maxBuffered} bytes) must be at least --max-body (${flags.maxBody} bytes): a covered request with the largest body allowed would always get 503.`,
      2,
    )
  }
  const spec = parseStoreUrl(flags.store)
  // The proxy starts even when its store is down; until it answers, covered requests get 503.
  const store = new ReconnectingStore(spec.kind, isServerClockStore(spec), async () => {
    const opened = await openStore(flags.store)
    try {
      await opened.migrate()
    } catch (error) {
      await opened.store.close().catch(() => {})
      throw error
    }
    return opened.store
  })
  const ledger = new Ledger({ store, lease: flags.lease, ttl: flags.ttl, wait: flags.wait })
  let lastStoreLogMs = 0
  const onEvent = (event: EngineEvent) => {
    if (event.type === 'store_error' && Date.now() - lastStoreLogMs > 5_000) {
      lastStoreLogMs = Date.now()
      process.stderr.write(`idemkey proxy: store unavailable, answering 503 to covered requests: ${(event.error as Error).message}\n`)
    }
    // Never rate-limited: each one is a request that a retry after its lease will run a second time.
    if (event.type === 'unrecorded') process.stderr.write(`${unrecordedLine(event)}\n`)
  }
  const proxy = createProxyServer({
    upstream: flags.upstream,
    ledger,
    methods: flags.methods,
    requireKey: flags.requireKey,
    scopeHeader: flags.scopeHeader,
    scopeSecret: flags.scopeSecret,
    waitMs: flags.wait,
    leaseMs: flags.lease,
    ttlMs: flags.ttl,
    maxBodyBytes: flags.maxBody,
    upstreamTimeoutMs: flags.upstreamTimeout,
    headerTimeoutMs: flags.headerTimeout,
    bodyTimeoutMs: flags.bodyTimeout,
    maxConnections: flags.maxConnections,
    maxBufferedBytes: flags.maxBuffered,
    maxStoredBodyBytes: flags.maxStoredBody,
    onEvent,
  })
  await new Promise<void>((resolve, reject) => {
    proxy.server.once('error', reject)
    proxy.server.listen(flags.port, flags.host, () => resolve())
  })
  const address = proxy.server.address()
  const port = typeof address === 'object' && address ? address.port : flags.port
  store.connect().catch((error: unknown) => {
    process.stderr.write(`idemkey proxy: store not reachable yet (covered requests get 503 until it is): ${(error as Error).message}\n`)
  })
  process.stdout.write(
    `idemkey proxy listening on http://${flags.host}:${port} -> ${flags.upstream} (store ${describeStore(spec)}, methods ${flags.methods.join(',')}, lease ${formatDuration(flags.lease)})\n`,
  )

  let stopping = false
  const stop = async (signal: string) => {
    if (stopping) return
    stopping = true
    process.stderr.write(`idemkey proxy: ${signal}, draining ${proxy.inFlight()} in-flight request(s)\n`)
    const drained = await proxy.drain(flags.drainTimeout)
    // Records of requests still running keep their lease: it ends by itself and another proxy takes over.
    await store.close().catch(() => {})
    process.stderr.write(`idemkey proxy: stopped${drained ? '' : ' (drain timeout: unfinished requests keep their lease until it ends)'}\n`)
    process.exit(0)
  }
  process.once('SIGTERM', () => void stop('SIGTERM'))
  process.once('SIGINT', () => void stop('SIGINT'))
}

/**
 * The log line of an outcome the store did not take while the lease lasted. The key is hashed, as in
 * every other line: keys can carry customer data. What to do about it: docs/proxy.md, "Unrecorded".
 */
export function unrecordedLine(event: Extract<LedgerEvent, { type: 'unrecorded' }>): string {
  const cause = event.error instanceof Error ? event.error.message : String(event.error)
  return `idemkey proxy: UNRECORDED outcome (${event.status}) for key sha256:${sha256Hex(event.scope, '\n', event.key).slice(0, 16)} token ${event.token} after ${event.attempts} tries: the upstream ran, but the store did not take the outcome before the lease ended, so a retry after the lease will run it again (${cause})`
}
