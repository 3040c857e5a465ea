/** What `idemkey proxy` does once its flags are parsed: open the store, listen, drain on SIGTERM. */

import { cachedDurability } from '../../core/durability.js'
import { formatDuration } from '../../core/duration.js'
import { sha256Hex } from '../../core/fingerprint.js'
import { Ledger, type LedgerEvent } from '../../core/ledger.js'
import { redactUrl } from '../../core/redact-url.js'
import type { EngineEvent } from '../../http/types.js'
import { operatorPage } from '../../observability/operator-page.js'
import { keyHash } from '../../observability/recorder.js'
import { readDurability } from '../commands/doctor-read.js'
import { listen } from '../listen.js'
import { CliError } from '../run.js'
import { describeStore, isServerClockStore, openStore, parseStoreUrl } from '../store-url.js'
import { createAdminServer } from './admin-server.js'
import type { ProxyFlags } from './flags.js'
import { throttledLog } from './limits.js'
import { createLogger } from './logger.js'
import { type PrometheusMetrics, prometheusMetrics } from './prometheus.js'
import { ReconnectingStore } from './reconnecting-store.js'
import { type AccessEntry, createProxyServer } from './server.js'

/** Starts the proxy and keeps it running until SIGTERM or SIGINT. */
export async function runProxy(flags: ProxyFlags): Promise<void> {
  if (flags.maxBuffered < flags.maxBody) {
    throw new CliError(
      `--max-buffered (${flags.maxBuffered} bytes) must be at least --max-body (${flags.maxBody} bytes): a covered request with the largest body allowed would always get 503.`,
      2,
    )
  }
  const spec = parseStoreUrl(flags.store)
  const { log: logger, access } = createLogger({ level: flags.logLevel, format: flags.logFormat })
  const admin = flags.adminPort !== undefined
  // Made once the store is: its holders gauge reads it at each scrape (onStoreState runs later, on first use).
  let metrics: PrometheusMetrics | undefined
  // Said once per change: an outage is one error line and one line when it ends, not one per request.
  let wasDown = false
  const onStoreState = (up: boolean, error?: unknown) => {
    metrics?.storeUp(up)
    if (up && wasDown) logger.warn({ store: spec.kind }, 'store answering again: covered requests are served again')
    else if (up) logger.info({ store: spec.kind }, 'store connected')
    wasDown = !up
    if (up) return

    logger.error({ store: spec.kind, err: errorText(error) }, `store unavailable, answering 503 to covered requests: ${errorText(error)}`)
  }
  // The proxy starts even when its store is down; until it answers, covered requests get 503.
  const store = new ReconnectingStore(
    spec.kind,
    isServerClockStore(spec),
    async () => {
      const opened = await openStore(flags.store)
      try {
        await opened.migrate()
      } catch (error) {
        await opened.store.close().catch(() => {})
        throw error
      }
      return opened.store
    },
    1_000,
    onStoreState,
  )
  if (admin) metrics = prometheusMetrics({ store })
  const ledger = new Ledger({ store, lease: flags.lease, ttl: flags.ttl, wait: flags.wait, telemetry: metrics?.telemetry })
  const configLog = throttledLog((line) => logger.error(`idemkey proxy: ${line}`))
  // The store server's durability (idemkey doctor's report), read at most once a minute, on the page and in /readyz.
  const durability = admin ? cachedDurability(() => readDurability(spec)) : undefined
  const page = admin
    ? operatorPage({ store, token: flags.adminToken, allowedHosts: flags.adminAllowedHosts, ...(durability ? { durability } : {}) })
    : undefined
  const onEvent = (event: EngineEvent) => {
    page?.onEvent(event)
    // A call that timed out above the store still means it is not answering.
    if (event.type === 'store_error') store.markDown(event.error)
    // A request refused for the scope (a cookie or API key no --scope-credentials names): say why and what to set.
    if (event.type === 'config_error') configLog('config-error', errorText(event.error))
    // Never rate-limited: each one is a request that a retry after its lease will run a second time.
    if (event.type === 'unrecorded') {
      metrics?.unrecorded()
      logger.error(
        { keyHash: keyHash(event.scope, event.key), token: event.token, attempts: event.attempts, outcome: event.status },
        unrecordedLine(event),
      )
    }
  }
  const accessLog = logger.isLevelEnabled('info')
  const onAccess =
    accessLog || metrics
      ? (entry: AccessEntry) => {
          metrics?.answered(entry.outcome, entry.status, entry.durationMs / 1_000)
          if (accessLog) access.info(entry, 'request')
        }
      : undefined
  const proxy = createProxyServer({
    upstream: flags.upstream,
    ledger,
    methods: flags.methods,
    requireKey: flags.requireKey,
    scopeHeader: flags.scopeHeader,
    scopeSecret: flags.scopeSecret,
    scopeCredentials: flags.scopeCredentials,
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
    maxTunnels: flags.maxTunnels,
    tunnelIdleTimeoutMs: flags.tunnelIdleTimeout,
    onEvent,
    onAccess,
    log: (line) => logger.warn(`idemkey proxy: ${line}`),
  })
  await listen(proxy.server, flags.port, flags.host, { port: '--port', host: '--host' })
  const address = proxy.server.address()
  const port = typeof address === 'object' && address ? address.port : flags.port
  /** Set on SIGTERM/SIGINT: the drain has begun (and `/readyz` says so). */
  let stopping = false
  let adminServer: ReturnType<typeof createAdminServer> | undefined
  if (metrics && page && flags.adminPort !== undefined) {
    adminServer = createAdminServer({
      registry: metrics.registry,
      page,
      ready: () => probeStore(store),
      draining: () => stopping,
      ...(durability ? { durability } : {}),
    })
    try {
      await listen(adminServer, flags.adminPort, flags.adminHost, { port: '--admin-port', host: '--admin-host' })
    } catch (error) {
      // Not half started: a proxy without the admin port it was asked for stops, and says why.
      proxy.server.close()
      throw error
    }
  }
  // A store that is down at start-up is reported as any outage: one line now, one when it answers.
  store.connect().then(
    () => store.markUp(),
    (error: unknown) => store.markDown(error),
  )
  process.stdout.write(
    `idemkey proxy listening on http://${flags.host}:${port} -> ${redactUrl(flags.upstream)} (store ${describeStore(spec)}, methods ${flags.methods.join(',')}, lease ${formatDuration(flags.lease)})\n`,
  )
  if (adminServer) {
    const address = adminServer.address()
    const adminPort = typeof address === 'object' && address ? address.port : flags.adminPort
    process.stdout.write(
      `idemkey proxy admin on http://${flags.adminHost}:${adminPort} (/metrics, /healthz, /readyz, operator page at /)\n`,
    )
  }

  const stop = async (signal: string) => {
    if (stopping) return
    stopping = true
    logger.info(`idemkey proxy: ${signal}, draining ${proxy.inFlight()} in-flight request(s)`)
    const drained = await proxy.drain(flags.drainTimeout)
    adminServer?.close()
    adminServer?.closeAllConnections()
    // Records of requests still running keep their lease: it ends by itself and another proxy takes over.
    await store.close().catch(() => {})
    logger.info(`idemkey proxy: stopped${drained ? '' : ' (drain timeout: unfinished requests keep their lease until it ends)'}`)
    await new Promise<void>((resolve) => logger.flush(() => resolve()))
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

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}

/** `/readyz`: the store answers a read within 2 s. */
async function probeStore(store: ReconnectingStore): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${store.name}: no answer within 2 s`)), 2_000)
  })
  try {
    await Promise.race([store.get('idemkey', 'readyz-probe'), timeout])
  } catch (error) {
    store.markDown(error)
    throw error
  } finally {
    clearTimeout(timer)
  }
}
