/**
 * The proxy's admin port (`--admin-port`): `/metrics` (Prometheus text), `/healthz` (the process is
 * alive), `/readyz` (the store answers: 503 while it does not, or while the proxy drains) and the
 * operator page at `/`.
 */
import { createServer, type Server } from 'node:http'
import type { DurabilitySummary } from '../../core/durability.js'
import type { OperatorPage } from '../../observability/operator-page.js'
import type { Registry } from './metrics-text.js'

/** Options of {@link createAdminServer}. */
export interface AdminServerOptions {
  registry: Registry
  /** Resolves when the store answered, rejects with why it did not. */
  ready: () => Promise<void>
  page: OperatorPage
  /** `true` once the proxy is shutting down: `/readyz` answers 503 from then on, whatever the store says. */
  draining?: () => boolean
  /** The store server's durability report (`idemkey doctor`), shown in `/readyz`'s body; it never changes the status. */
  durability?: () => Promise<DurabilitySummary>
}

/**
 * The admin server (not yet listening).
 *
 * @example createAdminServer({ registry, ready, page }).listen(9090, '127.0.0.1')
 */
export function createAdminServer(options: AdminServerOptions): Server {
  const { registry, ready, page, draining, durability } = options
  return createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]
    if ((path === '/metrics' || path === '/healthz' || path === '/readyz') && req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' })
      return void res.end('GET only\n')
    }
    if (path === '/healthz') {
      res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' })
      return void res.end('{"status":"ok"}\n')
    }
    if (path === '/readyz') {
      if (draining?.()) {
        // Stopping: new connections are refused already, so the load balancer should send no more.
        res.writeHead(503, { 'content-type': 'application/json', 'cache-control': 'no-store' })
        return void res.end('{"status":"draining"}\n')
      }
      ready().then(
        async () => {
          const details = durability ? { durability: durabilityDetails(await durability()) } : {}
          res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' })
          res.end(`${JSON.stringify({ status: 'ready', ...details })}\n`)
        },
        (error: unknown) => {
          res.writeHead(503, { 'content-type': 'application/json', 'cache-control': 'no-store' })
          const reason = error instanceof Error ? error.message : String(error)
          res.end(`${JSON.stringify({ status: 'store unavailable', error: reason })}\n`)
        },
      )
      return
    }
    if (path === '/metrics') {
      registry.metrics().then(
        (text) => {
          res.writeHead(200, { 'content-type': registry.contentType, 'cache-control': 'no-store' })
          res.end(text)
        },
        (error: unknown) => {
          res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' })
          res.end(`metrics failed: ${error instanceof Error ? error.message : String(error)}\n`)
        },
      )
      return
    }
    page.handler(req, res)
  })
}

/**
 * `/readyz`'s durability detail: the verdict, the failures that lose or are unproven, what could not be
 * read, and each row's verdict (the whole report is `idemkey doctor --json`).
 */
export function durabilityDetails(summary: DurabilitySummary): Record<string, unknown> {
  return {
    status: summary.status,
    losing: summary.losing,
    unproven: summary.unproven,
    unchecked: summary.unchecked,
    ...(summary.error === undefined ? {} : { error: summary.error }),
    ...(summary.report ? { verdicts: Object.fromEntries(summary.report.findings.map((f) => [f.failure, f.verdict])) } : {}),
  }
}
