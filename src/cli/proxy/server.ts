import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type Server, type ServerOptions, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { pipeline } from 'node:stream/promises'
import type { Ledger } from '../../core/ledger.js'
import { type CredentialRule, credentialRule } from '../../http/credentials.js'
import { createEngine } from '../../http/engine.js'
import { distinctHeaders, readNodeBody } from '../../http/node-body.js'
import { credentialScope, headerScope, resolveScopeSecret } from '../../http/scope.js'
import type { AnswerOutcome, Decision, EngineEvent, HttpRequestLike, HttpResponseLike } from '../../http/types.js'
import { keyHash } from '../../observability/recorder.js'
import { KEY_HEADER, parseKeyHeader } from '../../protocol/key-header.js'
import {
  badTarget,
  oneLine,
  pathOf,
  proxyProblem,
  Refusal,
  requestHeaders,
  requestTarget,
  responseHeaders,
  send,
  upstreamProblem,
} from './http.js'
import {
  type BudgetTicket,
  ByteBudget,
  capConnections,
  defaultMaxConnections,
  drained,
  lingering,
  sendAndClose,
  throttledLog,
} from './limits.js'
import { refuseRaw, tunnelUpgrade } from './upgrade.js'
import { UpstreamPool, type UpstreamResponse } from './upstream.js'

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

/** One request, as the access log and the HTTP metrics see it. */
export interface AccessEntry {
  /** `X-Request-Id` when the client sent a usable one, else the trace id of `traceparent`, else a new UUID. */
  requestId: string
  method: string
  /** The path, without the query string (which may carry secrets). */
  path: string
  /** The status the client got (or was being sent when it went away). */
  status: number
  /** How the proxy answered: the HTTP layer's outcome, `passthrough` for traffic it does not cover, `proxy_error`. */
  outcome: AnswerOutcome | 'passthrough' | 'proxy_error'
  /** The upstream's status, when the request reached it. */
  upstreamStatus?: number
  /** `keyHash(scope, key)` of a covered request with a key, as `idemkey inspect` and the unrecorded line show it. */
  keyHash?: string
  durationMs: number
}

/** What the access log learns of a request while it is served. */
interface Trail {
  startedAt: number
  outcome: AccessEntry['outcome']
  upstreamStatus?: number
  scope?: string
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
const EMPTY = new Uint8Array(0)

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

  /** A target {@link requestTarget} refuses: `400`, before anything else looks at the request. */
  async function refuseTarget(req: IncomingMessage, res: ServerResponse, trail?: Trail): Promise<void> {
    if (trail) trail.outcome = 'rejected'
    sendAndClose(req, res, badTarget())
  }

  async function serve(req: IncomingMessage, res: ServerResponse, ticket: BudgetTicket, trail?: Trail): Promise<void> {
    // Like every adapter: traffic the layer does not cover streams through without touching the engine.
    if (!engine.applies(req.method ?? 'GET', req.headers[KEY_HEADER] !== undefined)) return forwardStreaming(req, res, trail)
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
      if (read) return forwardCovered(req, res, await read, ticket, neutral.headers, undefined, trail)
      return forwardStreaming(req, res, trail)
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
      await forwardCovered(req, res, body, ticket, neutral.headers, decision, trail)
    } catch (error) {
      // Releases the record unless forwardCovered settled it already (then this does nothing).
      await decision.fail(error)
      throw error
    }
  }

  /**
   * Reads a covered request's body within the byte budget and `bodyTimeoutMs`. A declared length is
   * taken from the budget up front, a body without one chunk by chunk. Out of room or out of time: a
   * {@link Refusal} (`503` or `408`), before the ledger has seen the request.
   */
  async function readCoveredBody(req: IncomingMessage, limit: number, ticket: BudgetTicket): Promise<Uint8Array> {
    const declared = Number(req.headers['content-length'] ?? Number.NaN)
    const known = Number.isFinite(declared) && declared >= 0
    // Over the limit, readNodeBody answers 413 before reading: nothing to take then.
    if (!ticket.tryTake(known && declared <= limit ? declared : 0)) throw overloaded()
    const onChunk = known
      ? undefined
      : (bytes: number) => {
          if (!ticket.tryTake(bytes)) throw overloaded()
        }
    // A body received whole already (a small one comes in the packet of its headers) has no deadline
    // left to keep: no timer for it.
    if (req.complete) return readNodeBody(req, limit, { onStop: 'pause', onChunk })
    return readNodeBody(req, limit, { timeoutMs: bodyTimeoutMs, timedOut: bodyTimedOut, onStop: 'pause', onChunk })
  }

  function overloaded(): Refusal {
    log(
      'overloaded',
      `answering 503 to new covered requests: ${budget.used} bytes held, --max-buffered is ${budget.limit} (raise it, or add proxies)`,
    )
    return new Refusal(
      proxyProblem(
        503,
        'proxy-overloaded',
        'Proxy overloaded',
        'The proxy holds as many request and response bytes as it may right now, so this request was not run and nothing was recorded for it. Retry with the same Idempotency-Key after the Retry-After delay.',
      ),
    )
  }

  function bodyTimedOut(): Refusal {
    return new Refusal(
      proxyProblem(
        408,
        'request-timeout',
        'Request body timed out',
        `The request body did not arrive within ${Math.ceil(bodyTimeoutMs / 1_000)} s, so the request was not run and nothing was recorded for it. Retry with the same Idempotency-Key.`,
      ),
    )
  }

  /** Sends an answer; one sent before the request body was read to its end also closes the connection. */
  function answer(req: IncomingMessage, res: ServerResponse, response: HttpResponseLike): void {
    if (req.complete) send(res, response, bodyTimeoutMs)
    else sendAndClose(req, res, response)
  }

  /**
   * Forwards a covered request with its buffered body and answers the client. A response up to
   * `maxStoredBody` is held whole, its record settled, then sent, as before. A larger one (declared or
   * found so), or one the byte budget has no room for, streams through: status and headers, what was
   * held, then the rest with backpressure; its record is settled once the upstream has sent it all,
   * whether or not the client stayed (the operation ran). Upstream failures become 502/504, which
   * release the record.
   */
  async function forwardCovered(
    req: IncomingMessage,
    res: ServerResponse,
    body: Uint8Array,
    ticket: BudgetTicket,
    requestFields: Record<string, string | string[] | undefined>,
    record?: Extract<Decision, { kind: 'execute' }>,
    trail?: Trail,
  ): Promise<void> {
    // Settle the record before answering a held response, so a retry that follows the answer finds it.
    const settle = async (response: HttpResponseLike) => (record ? record.finish(response) : response)
    let upstream: UpstreamResponse
    try {
      upstream = await pool.request({
        path: prefix + (req.url ?? '/'),
        method: req.method ?? 'GET',
        headers: requestHeaders(req, true, requestFields),
        body: body.byteLength > 0 || req.method === 'POST' || req.method === 'PUT' || req.method === 'PATCH' ? body : undefined,
      })
    } catch (error) {
      return send(res, await settle(upstreamProblem(error, req, log)), bodyTimeoutMs)
    }
    const status = upstream.statusCode
    if (trail) trail.upstreamStatus = status
    const headers = responseHeaders(upstream.headers, false)
    const chunks = upstream.body[Symbol.asyncIterator]() as AsyncIterator<Buffer>
    const held: Buffer[] = []
    let total = 0
    let fits = true
    try {
      if (!(Number(upstream.headers['content-length']) > maxStoredBody)) {
        for (;;) {
          const { done, value } = await chunks.next()
          if (done) return send(res, await settle({ status, headers, body: Buffer.concat(held, total) }), bodyTimeoutMs)
          total += value.byteLength
          held.push(value)
          fits = ticket.hold(value.byteLength)
          if (total > maxStoredBody || !fits) break
        }
      }
    } catch (error) {
      return send(res, await settle(upstreamProblem(error, req, log)), bodyTimeoutMs)
    }
    // Streaming from here. A response that only ran out of budget may still be small enough to store:
    // keep its copy (it already ran, so it is never refused) until it proves larger than maxStoredBody.
    let copy = !fits && total <= maxStoredBody ? held : undefined
    res.writeHead(status, responseHeaders(upstream.headers, true))
    let client = true
    for (const chunk of held) if (client && !res.write(chunk)) client = await drained(res, bodyTimeoutMs)
    let broken: unknown
    try {
      for (;;) {
        const { done, value } = await chunks.next()
        if (done) break
        total += value.byteLength
        if (copy && total <= maxStoredBody) {
          copy.push(value)
          ticket.hold(value.byteLength)
        } else copy = undefined
        client &&= !res.destroyed
        if (client && !res.write(value)) client = await drained(res, bodyTimeoutMs)
      }
    } catch (error) {
      broken = error
    }
    if (broken !== undefined) {
      // The client saw a status and part of a body: close its connection so it knows the body is cut.
      res.destroy()
      await settle(upstreamProblem(broken, req, log))
      return
    }
    if (client && !res.destroyed) res.end()
    await settle(copy ? { status, headers, body: Buffer.concat(copy, total) } : { status, headers, body: EMPTY, bodyLength: total })
  }

  /** Streams an uncovered request both ways, untouched but for hop-by-hop and forwarding headers. */
  async function forwardStreaming(req: IncomingMessage, res: ServerResponse, trail?: Trail): Promise<void> {
    const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined
    const abort = new AbortController()
    res.once('close', () => {
      if (!res.writableFinished) abort.abort()
    })
    let upstream: UpstreamResponse
    try {
      upstream = await pool.request({
        path: prefix + (req.url ?? '/'),
        method: req.method ?? 'GET',
        headers: requestHeaders(req, false),
        body: hasBody ? req : undefined,
        signal: abort.signal,
      })
    } catch (error) {
      // The client left before the upstream answered: nothing went wrong upstream, and no one to answer.
      if (abort.signal.aborted) return
      return send(res, upstreamProblem(error, req, log))
    }
    if (trail) trail.upstreamStatus = upstream.statusCode
    res.writeHead(upstream.statusCode, responseHeaders(upstream.headers, true))
    await pipeline(upstream.body, res).catch(() => res.destroy())
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

/** Keeps the scope the engine computed on the request's trail, for the access log's key hash. */
function trailScope(scopeOf: (req: HttpRequestLike) => string): (req: HttpRequestLike) => string {
  return (req) => {
    const scope = scopeOf(req)
    const trail = (req as { trail?: Trail }).trail
    if (trail) trail.scope = scope
    return scope
  }
}

/** The access log's entry of a finished request, answered `status`. */
function accessEntry(req: IncomingMessage, status: number, trail: Trail): AccessEntry {
  const entry: AccessEntry = {
    requestId: requestIdOf(req),
    method: req.method ?? 'GET',
    path: pathOf(req),
    status,
    outcome: trail.outcome,
    durationMs: Math.round((performance.now() - trail.startedAt) * 100) / 100,
  }
  if (trail.upstreamStatus !== undefined) entry.upstreamStatus = trail.upstreamStatus
  if (trail.scope !== undefined) {
    try {
      const key = parseKeyHeader(req.headers[KEY_HEADER])
      if (key !== undefined) entry.keyHash = keyHash(trail.scope, key)
    } catch {
      // A key that does not parse was answered 400 before any record: no hash to log.
    }
  }
  return entry
}

/**
 * The request's id: its `X-Request-Id` when that is 1–200 visible ASCII characters, else the trace id
 * of a W3C `traceparent`, else a new UUID.
 */
export function requestIdOf(req: IncomingMessage): string {
  const given = req.headers['x-request-id']
  if (typeof given === 'string' && /^[\x21-\x7e]{1,200}$/.test(given)) return given
  const parent = req.headers.traceparent
  const trace = typeof parent === 'string' ? /^[\da-f]{2}-([\da-f]{32})-[\da-f]{16}-[\da-f]{2}$/.exec(parent.trim()) : null
  if (trace && trace[1] !== '0'.repeat(32)) return trace[1] as string
  return randomUUID()
}

/**
 * The proxy's scope rule: the trusted header's value when it is there, else the keyed hash of the
 * credential. Each source keeps its own prefix, so a tenant named `public`, or a header value copied
 * from `idemkey list` (`cred:…`), can never land in another source's scope.
 */
function proxyScope(
  scopeHeader: string | undefined,
  scopeSecret: string | undefined,
  credentials: CredentialRule,
): (req: HttpRequestLike) => string {
  const secret = resolveScopeSecret(scopeSecret)
  const name = scopeHeader?.toLowerCase()
  return (req) => {
    const value = name === undefined ? undefined : req.headers[name]
    const first = Array.isArray(value) ? value[0] : value
    return first ? headerScope(first) : credentialScope(req.headers, secret, credentials)
  }
}
