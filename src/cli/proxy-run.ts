/** What `idemkey proxy` does once its flags are parsed: open the store, listen, drain on SIGTERM. */
import { formatDuration } from '../core/duration.js'
import { sha256Hex } from '../core/fingerprint.js'
import { Ledger, type LedgerEvent } from '../core/ledger.js'
import type { EngineEvent } from '../http/types.js'
import { describeStore, isServerClockStore, openStore, parseStoreUrl } from '../stores/open.js'
import type { ProxyFlags } from './proxy.js'
import { createProxyServer } from './proxy-server.js'
import { ReconnectingStore } from './reconnecting-store.js'
import { CliError } from './run.js'

/** Starts the proxy and keeps it running until SIGTERM or SIGINT. */
export async function runProxy(flags: ProxyFlags): Promise<void> {
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
