import { createServer, type IncomingMessage, type Server, type ServerOptions, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { Ledger } from '../../core/ledger.js'
import { credentialRule } from '../../http/credentials.js'
import { createEngine } from '../../http/engine.js'
import { distinctHeaders } from '../../http/node-body.js'
import type { Decision, EngineEvent, HttpRequestLike, HttpResponseLike } from '../../http/types.js'
import { KEY_HEADER } from '../../protocol/key-header.js'
import { type AccessEntry, accessEntry, type Trail, trailScope } from './access.js'
import { coveredBodyReader } from './covered-body.js'
import { forwarders } from './forward.js'
import { badTarget, oneLine, pathOf, proxyProblem, Refusal, requestTarget, send } from './http.js'
import { type BudgetTicket, ByteBudget, capConnections, defaultMaxConnections, lingering, sendAndClose, throttledLog } from './limits.js'
import { proxyScope } from './scope.js'
import { refuseRaw, tunnelUpgrade } from './upgrade.js'
import { UpstreamPool } from './upstream.js'

export { type AccessEntry, requestIdOf } from './access.js'

/** Options of {@link createProxyServer}; the {@link ProxyLimits} bound what clients can hold of it. */
export interface ProxyServerOptions extends ProxyLimits {
  /** Base URL of the API behind the proxy, e.g. `http://127.0.0.1:3000` (a path prefix is kept). */
  upstream: string
  ledger: Ledger
  /** @default ['POST', 'PATCH'] */
  methods?: string[]
  /** Answer `400` to a covered request without `Idempotency-Key`. @default false */
  requireKey?: boolean
  /**
   * Scope records by this request header's value (a tenant or principal id set by a trusted gateway),
   * stored as `header:<value>`; a request without it falls back to the credential scope.
   * @default none: a keyed hash of Authorization (`cred:…`), or `public`
   */
  scopeHeader?: string
  /**
   * The credentials that identify a caller (`authorization`, `cookie:<name>`, `header:<name>`), as the
   * engine's `credentials` option: see there, and docs/proxy.md "Security model".
   * @default ['authorization'], refusing keyed requests with an unnamed cookie or API key
   */
  scopeCredentials?: string[]
  /** The secret that keys credential scopes. @default process.env.IDEMKEY_SCOPE_SECRET (warned about when unset) */
  scopeSecret?: string
  waitMs?: number
  leaseMs?: number
  ttlMs?: number
  /** Largest covered request body buffered to fingerprint it; `413` beyond. @default 1 MiB */
  maxBodyBytes?: number
  /** Upstream headers or body slower than this: `504`, and the record is released. @default 30s */
  upstreamTimeoutMs?: number
  onEvent?: (event: EngineEvent) => void
  /** Called once per request when it is over (answered, and its answer sent or its client gone): the access log. */
  onAccess?: (entry: AccessEntry) => void
}

/** A running proxy's handle. */
export interface ProxyServer {
  server: Server
  /** Requests being served now: from their arrival until their answer has left (or their client is gone). */
  inFlight(): number
  /** Bytes the byte budget counts now (covered request bodies and upstream responses held); 0 when idle. */
  buffered(): number
  /**
   * Stops accepting, waits for in-flight requests (up to `timeoutMs`) until their answers have left,
   * then closes connections. Resolves `true` when all finished.
   */
  drain(timeoutMs: number): Promise<boolean>
}

/** What one client, or many, may hold of the proxy (docs/proxy.md, "Limits and timeouts"). */
export interface ProxyLimits {
  /** Request headers must arrive within this (new and keep-alive connections alike), or Node answers `408` and closes. @default 10s */
  headerTimeoutMs?: number
  /**
   * A covered request's body must arrive within this from its headers, or `408` and the connection is
   * closed, before the ledger sees the request. Also how long a client may stall while it reads a
   * covered response before its connection is closed. @default 30s
   */
  bodyTimeoutMs?: number
  /** Open client connections at most; past it the longest-idle one is closed to make room. @default {@link defaultMaxConnections} */
  maxConnections?: number
  /**
   * Bytes held at once across all in-flight covered requests: their bodies and the upstream responses
   * held to be stored. A new covered request past it gets `503` with `Retry-After`. @default 64 MiB
   */
  maxBufferedBytes?: number
  /** Largest response body stored for replay; a larger one streams through and is stored without its body. @default 1 MiB */
  maxStoredBodyBytes?: number
  /**
   * WebSocket tunnels open at once (each holds a client and an upstream connection); past it an upgrade
   * gets `503`. Tunnels do not count against `maxConnections`. @default 128
   */
  maxTunnels?: number
  /** A tunnel with no bytes either way for this long is closed. @default 60s */
  tunnelIdleTimeoutMs?: number
  /** Where the proxy's own failures go, one line each, at most one a second per kind. @default stderr, as `idemkey proxy: …` */
  log?: (line: string) => void
}

const MiB = 1024 * 1024

/**
 * A reverse proxy that gives any HTTP API idempotency keys (docs/http.md) through idemkey's HTTP engine: covered requests
 * with a key are buffered, run once and replayed; everything else streams through untouched.
 *
 * @example
 * const proxy = createProxyServer({ upstream: 'http://127.0.0.1:3000', ledger })
 * proxy.server.listen(8080, '127.0.0.1')
 */
export function createProxyServer(options: ProxyServerOptions): ProxyServer {
  const base = new URL(options.upstream)
  const prefix = base.pathname.replace(/\/$/, '')
  const timeoutMs = options.upstreamTimeoutMs ?? 30_000
  const pool = new UpstreamPool(base, { connections: 256, timeoutMs, keepAliveMs: 10_000 })
  const engine = createEngine(
    {
      ledger: options.ledger,
      methods: options.methods,
      required: options.requireKey ?? false,
      wait: options.waitMs,
      lease: options.leaseMs,
      ttl: options.ttlMs,
      maxRequestBody: options.maxBodyBytes,
      maxStoredBody: options.maxStoredBodyBytes,
      // The upstream's body is stored as it came, encoded: a replay without its Content-Encoding would
      // hand the client gzip bytes labelled as plain JSON.
      storedHeaders: ['content-encoding'],
      onEvent: options.onEvent,
    },
    {
      scopeOf: trailScope(
        proxyScope(options.scopeHeader, options.scopeSecret, credentialRule(options.scopeCredentials, '--scope-credentials')),
      ),
    },
  )
  let active = 0
  let idle: (() => void) | undefined
  /** Set by drain(): answers from then on close their connection, so keep-alive clients send nothing more on it. */
  let draining = false
  /** Responses not over yet (see `active`), for drain() to mark `Connection: close`. */
  const answering = new Set<ServerResponse>()
  const maxBody = options.maxBodyBytes ?? MiB
  const maxStoredBody = options.maxStoredBodyBytes ?? MiB
  const headerTimeoutMs = options.headerTimeoutMs ?? 10_000
  const bodyTimeoutMs = options.bodyTimeoutMs ?? 30_000
  const budget = new ByteBudget(options.maxBufferedBytes ?? 64 * MiB)
  const log = throttledLog(options.log ?? ((line) => process.stderr.write(`idemkey proxy: ${line}\n`)))
  const onAccess = options.onAccess
  const readCoveredBody = coveredBodyReader(budget, bodyTimeoutMs, log)
  const forward = forwarders({ pool, prefix, maxStoredBody, bodyTimeoutMs, log })

  /** A target {@link requestTarget} refuses: `400`, before anything else looks at the request. */
  async function refuseTarget(req: IncomingMessage, res: ServerResponse, trail?: Trail): Promise<void> {
    if (trail) trail.outcome = 'rejected'
    sendAndClose(req, res, badTarget())
  }

  async function serve(req: IncomingMessage, res: ServerResponse, ticket: BudgetTicket, trail?: Trail): Promise<void> {
    // Like every adapter: traffic the layer does not cover streams through without touching the engine.
    if (!engine.applies(req.method ?? 'GET', req.headers[KEY_HEADER] !== undefined)) return forward.streaming(req, res, trail)
    let read: Promise<Uint8Array> | undefined
    const neutral: HttpRequestLike & { trail?: Trail } = {
      trail,
      method: req.method ?? 'GET',
      url: req.url ?? '/',
      headers: distinctHeaders(req),
      body: (limit) => {
        read ??= readCoveredBody(req, limit, ticket)
        return read
      },
    }
    let decision: Decision
    try {
      decision = await engine.begin(neutral)
    } catch (error) {
      // Body too slow, or no room in the budget: answered before the ledger saw the request.
      if (error instanceof Refusal) return sendAndClose(req, res, error.response)
      throw error
    }
    if (decision.kind === 'respond') {
      if (trail) trail.outcome = decision.outcome ?? 'rejected'
      return answer(req, res, decision.response)
    }
    if (decision.kind === 'passthrough') {
      if (read) return forward.covered(req, res, await read, ticket, neutral.headers, undefined, trail)
      return forward.streaming(req, res, trail)
    }
    if (trail) trail.outcome = 'executed'
    let body: Uint8Array
    try {
      body = await (read ?? neutral.body(maxBody))
    } catch (error) {
      await decision.fail(error)
      if (error instanceof Refusal) return sendAndClose(req, res, error.response)
      throw error
    }
    try {
      await forward.covered(req, res, body, ticket, neutral.headers, decision, trail)
    } catch (error) {
      // Releases the record unless forward.covered settled it already (then this does nothing).
      await decision.fail(error)
      throw error
    }
  }

  /** Sends an answer; one sent before the request body was read to its end also closes the connection. */
  function answer(req: IncomingMessage, res: ServerResponse, response: HttpResponseLike): void {
    if (req.complete) send(res, response, bodyTimeoutMs)
    else sendAndClose(req, res, response)
  }

  const checkMs = Math.max(50, Math.min(1_000, Math.floor(headerTimeoutMs / 2)))
  const serverOptions: ServerOptions & { shouldUpgradeCallback?: (req: IncomingMessage) => boolean } = {
    noDelay: true,
    keepAlive: true,
    headersTimeout: headerTimeoutMs,
    // Every request, covered or not, is received whole by then, or Node answers 408 and closes; a
    // covered body's own deadline (bodyTimeoutMs from its headers) comes first.
    requestTimeout: headerTimeoutMs + bodyTimeoutMs + checkMs,
    // How often Node checks those two: its default (30 s) would let them run over by that much.
    connectionsCheckingInterval: checkMs,
    // Only a WebSocket upgrade the layer does not cover is tunnelled (below); any other request with
    // an Upgrade header (curl's `Upgrade: h2c` on a POST) is served as the plain request it also is.
    shouldUpgradeCallback: (req: IncomingMessage) => isTunnelled(req),
  }
  const server = createServer(serverOptions, (req, res) => {
    // A request that follows an early answer on a closing connection: dropped, as is the rest of it.
    if (lingering.has(req.socket)) return void req.resume()
    const target = requestTarget(req.url)
    if (target !== undefined) req.url = target
    active++
    answering.add(res)
    if (draining) res.shouldKeepAlive = false
    connections.busy(req.socket)
    const ticket = budget.ticket()
    const closed = new Promise<void>((resolve) => res.once('close', resolve))
    // Kept only for an access log: without one a request costs what it did.
    const trail: Trail | undefined = onAccess ? { startedAt: performance.now(), outcome: 'passthrough' } : undefined
    const served = (target === undefined ? refuseTarget(req, res, trail) : serve(req, res, ticket, trail)).catch((error: unknown) => {
      if (req.destroyed && !req.complete) return // the client went away mid-body: no one to answer
      if (trail) trail.outcome = 'proxy_error'
      log('proxy-error', `proxy error on ${req.method} ${pathOf(req)}: ${oneLine(error)}`)
      if (!res.headersSent) {
        answer(
          req,
          res,
          proxyProblem(
            500,
            'proxy-error',
            'Proxy error',
            'The proxy failed while serving this request; nothing was stored for it. Retry with the same Idempotency-Key.',
          ),
        )
      } else res.destroy()
    })
    // The bytes a request took are given back once it is over in every way: served, and its answer
    // sent or its connection gone. The connection counts as idle again from then, and a drain waits
    // for this too: served alone means the answer was handed to the socket, not that it left, and
    // closing the connection then would cut a large answer short.
    void Promise.all([served, closed]).then(() => {
      ticket.release()
      connections.free(req.socket)
      if (trail && onAccess) onAccess(accessEntry(req, res.statusCode, trail))
      answering.delete(res)
      active--
      if (active === 0) idle?.()
    })
  })
  server.keepAliveTimeout = 5_000
  const connections = capConnections(server, options.maxConnections ?? defaultMaxConnections(), log)
  /** A WebSocket upgrade of a request the layer does not cover: tunnelled to the upstream. */
  function isTunnelled(req: IncomingMessage): boolean {
    const upgrade = req.headers.upgrade
    return (
      typeof upgrade === 'string' &&
      upgrade.toLowerCase() === 'websocket' &&
      !engine.applies(req.method ?? 'GET', req.headers[KEY_HEADER] !== undefined)
    )
  }
  // Node lines without shouldUpgradeCallback would hand every request with an Upgrade header to this
  // listener, covered POSTs included: there, upgrades stay plain requests (the upstream sees no Upgrade).
  /** WebSocket tunnels open or being opened: closed by drain() once the requests in flight are done. */
  const tunnels = new Set<Socket>()
  if (typeof (server as { shouldUpgradeCallback?: unknown }).shouldUpgradeCallback === 'function') {
    const maxTunnels = options.maxTunnels ?? 128
    const idleMs = options.tunnelIdleTimeoutMs ?? 60_000
    server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
      if (!isTunnelled(req)) return void socket.destroy()
      const trail: Trail = { startedAt: performance.now(), outcome: 'passthrough' }
      const done = (status: number, upstreamStatus?: number) => {
        if (upstreamStatus !== undefined) trail.upstreamStatus = upstreamStatus
        if (onAccess) onAccess(accessEntry(req, status, trail))
      }
      const target = requestTarget(req.url)
      if (target === undefined) {
        trail.outcome = 'rejected'
        done(400)
        return refuseRaw(socket, badTarget())
      }
      req.url = target
      if (tunnels.size >= maxTunnels) {
        log('tunnels', `--max-tunnels ${maxTunnels} reached: answering 503 to new WebSocket upgrades`)
        done(503)
        return refuseRaw(
          socket,
          proxyProblem(
            503,
            'too-many-tunnels',
            'Too many tunnels',
            'The proxy holds as many WebSocket tunnels as it may. Retry after the Retry-After delay.',
          ),
        )
      }
      // Busy while the upstream answers, never the idle one closed to make room; a tunnel leaves the count.
      connections.busy(socket)
      tunnelUpgrade(req, socket, head, { base, prefix, timeoutMs, idleMs, tunnels, joined: connections.forget, done, log })
    })
  }

  return {
    server,
    inFlight: () => active,
    buffered: () => budget.used,
    async drain(timeoutMs) {
      server.close()
      server.closeIdleConnections()
      // Node keeps serving keep-alive connections after close() and says keep-alive: a client would
      // send its next request on a connection about to be closed under it.
      draining = true
      for (const res of answering) if (!res.headersSent) res.shouldKeepAlive = false
      const finished =
        active === 0 ||
        (await new Promise<boolean>((resolve) => {
          const timer = setTimeout(() => resolve(false), timeoutMs)
          idle = () => {
            clearTimeout(timer)
            resolve(true)
          }
        }))
      server.closeAllConnections()
      for (const socket of tunnels) socket.destroy()
      await pool.close().catch(() => {})
      return finished
    },
  }
}
