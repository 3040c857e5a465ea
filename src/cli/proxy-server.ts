import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { pipeline } from 'node:stream/promises'
import { Pool } from 'undici'
import type { Ledger } from '../core/ledger.js'
import { createEngine } from '../http/engine.js'
import { KEY_HEADER } from '../http/key-header.js'
import { distinctHeaders, readNodeBody } from '../http/node-body.js'
import { DEFAULT_PROBLEM_BASE } from '../http/problem.js'
import { credentialScope, headerScope, resolveScopeSecret } from '../http/scope.js'
import type { EngineEvent, HttpRequestLike, HttpResponseLike } from '../http/types.js'

/** Options of {@link createProxyServer}. */
export interface ProxyServerOptions {
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
}

/** A running proxy's handle. */
export interface ProxyServer {
  server: Server
  /** Requests being served now. */
  inFlight(): number
  /** Stops accepting, waits for in-flight requests (up to `timeoutMs`), then closes connections. Resolves `true` when all finished. */
  drain(timeoutMs: number): Promise<boolean>
}

/** Hop-by-hop fields (RFC 9110 §7.6.1), never forwarded; fields named in `Connection` are dropped as well. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'transfer-encoding', 'upgrade', 'trailer', 'expect'])
const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT'])
const VIA = '1.1 idemkey'

/**
 * A reverse proxy that gives any HTTP API SPEC §5 through idemkey's HTTP engine: covered requests
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
  const pool = new Pool(base.origin, {
    connections: 256,
    headersTimeout: timeoutMs,
    bodyTimeout: timeoutMs,
    keepAliveTimeout: 10_000,
    connect: { noDelay: true },
  })
  const engine = createEngine(
    {
      ledger: options.ledger,
      methods: options.methods,
      required: options.requireKey ?? false,
      wait: options.waitMs,
      lease: options.leaseMs,
      ttl: options.ttlMs,
      maxRequestBody: options.maxBodyBytes,
      onEvent: options.onEvent,
    },
    { scopeOf: proxyScope(options.scopeHeader, options.scopeSecret) },
  )
  let active = 0
  let idle: (() => void) | undefined

  async function serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // Like every adapter: traffic the layer does not cover streams through without touching the engine.
    if (!engine.applies(req.method ?? 'GET', req.headers[KEY_HEADER] !== undefined)) return forwardStreaming(req, res)
    let read: Promise<Uint8Array> | undefined
    const neutral: HttpRequestLike = {
      method: req.method ?? 'GET',
      url: req.url ?? '/',
      headers: distinctHeaders(req),
      body: (limit) => {
        read ??= readNodeBody(req, limit)
        return read
      },
    }
    const decision = await engine.begin(neutral)
    if (decision.kind === 'respond') return send(res, decision.response)
    if (decision.kind === 'passthrough') {
      if (read) return send(res, await forwardBuffered(req, await read))
      return forwardStreaming(req, res)
    }
    let response: HttpResponseLike
    try {
      response = await forwardBuffered(req, await (read ?? neutral.body(options.maxBodyBytes ?? 1024 * 1024)))
    } catch (error) {
      await decision.fail(error)
      throw error
    }
    // Settle the record before answering, so a retry that follows the answer finds it.
    await decision.finish(response)
    send(res, response)
  }

  /** Sends a covered request with its buffered body; upstream failures become 502/504 (transient: released). */
  async function forwardBuffered(req: IncomingMessage, body: Uint8Array): Promise<HttpResponseLike> {
    try {
      const upstream = await pool.request({
        path: prefix + (req.url ?? '/'),
        method: (req.method ?? 'GET') as 'POST',
        headers: requestHeaders(req, true),
        body: body.byteLength > 0 || req.method === 'POST' || req.method === 'PUT' || req.method === 'PATCH' ? body : undefined,
      })
      const bytes = new Uint8Array(await upstream.body.arrayBuffer())
      return { status: upstream.statusCode, headers: responseHeaders(upstream.headers, false), body: bytes }
    } catch (error) {
      return upstreamProblem(error)
    }
  }

  /** Streams an uncovered request both ways, untouched but for hop-by-hop and forwarding headers. */
  async function forwardStreaming(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const hasBody = req.headers['content-length'] !== undefined || req.headers['transfer-encoding'] !== undefined
    const abort = new AbortController()
    res.once('close', () => {
      if (!res.writableFinished) abort.abort()
    })
    let upstream: Awaited<ReturnType<Pool['request']>>
    try {
      upstream = await pool.request({
        path: prefix + (req.url ?? '/'),
        method: (req.method ?? 'GET') as 'GET',
        headers: requestHeaders(req, false),
        body: hasBody ? req : undefined,
        signal: abort.signal,
      })
    } catch (error) {
      return send(res, upstreamProblem(error))
    }
    res.writeHead(upstream.statusCode, responseHeaders(upstream.headers, true))
    await pipeline(upstream.body, res).catch(() => res.destroy())
  }

  const server = createServer({ noDelay: true, keepAlive: true }, (req, res) => {
    active++
    serve(req, res)
      .catch((error: unknown) => {
        if (!res.headersSent) {
          send(
            res,
            proxyProblem(
              500,
              'proxy-error',
              'Proxy error',
              `The proxy failed while serving this request (${(error as Error).message}); nothing was stored for it. Retry with the same Idempotency-Key.`,
            ),
          )
        } else res.destroy()
      })
      .finally(() => {
        active--
        if (active === 0) idle?.()
      })
  })
  server.keepAliveTimeout = 5_000

  return {
    server,
    inFlight: () => active,
    async drain(timeoutMs) {
      server.close()
      server.closeIdleConnections()
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
      await pool.close().catch(() => {})
      return finished
    },
  }
}

function send(res: ServerResponse, response: HttpResponseLike): void {
  if (res.headersSent || res.destroyed) return
  const headers: Record<string, string | string[]> = { ...response.headers, 'content-length': String(response.body.byteLength) }
  if (!headers.via) headers.via = VIA
  res.writeHead(response.status, headers)
  res.end(response.body)
}

/** Names listed in a Connection field: also hop-by-hop for this message. */
function connectionNames(value: string | string[] | undefined): Set<string> {
  const text = Array.isArray(value) ? value.join(',') : (value ?? '')
  return new Set(
    text
      .split(',')
      .map((name) => name.trim().toLowerCase())
      .filter(Boolean),
  )
}

function requestHeaders(req: IncomingMessage, buffered: boolean): Record<string, string | string[]> {
  const dropped = connectionNames(req.headers.connection)
  const out: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(distinctHeaders(req))) {
    if (value === undefined || HOP_BY_HOP.has(name) || dropped.has(name) || name === 'host') continue
    if (buffered && name === 'content-length') continue
    out[name] = value
  }
  const remote = req.socket.remoteAddress ?? 'unknown'
  const prior = req.headers['x-forwarded-for']
  out['x-forwarded-for'] = prior ? `${Array.isArray(prior) ? prior.join(', ') : prior}, ${remote}` : remote
  out['x-forwarded-proto'] ??= 'http'
  if (req.headers.host) out['x-forwarded-host'] ??= req.headers.host
  const via = req.headers.via
  out.via = via ? `${via}, ${VIA}` : VIA
  return out
}

function responseHeaders(headers: Record<string, string | string[] | undefined>, streaming: boolean): Record<string, string | string[]> {
  const dropped = connectionNames(headers.connection)
  const out: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name) || dropped.has(name)) continue
    if (!streaming && name === 'content-length') continue
    out[name] = value
  }
  out.via = headers.via ? `${headers.via}, ${VIA}` : VIA
  return out
}

/** 504 for an upstream timeout, 502 for a refused or broken connection: both transient, so the record is released. */
function upstreamProblem(error: unknown): HttpResponseLike {
  const code = (error as { code?: string }).code ?? ''
  const timedOut = TIMEOUT_CODES.has(code)
  const reason = code || (error as Error).message
  return timedOut
    ? proxyProblem(
        504,
        'upstream-timeout',
        'Upstream timed out',
        `The upstream did not answer in time (${reason}). Retry with the same Idempotency-Key.`,
      )
    : proxyProblem(
        502,
        'upstream-unreachable',
        'Upstream unreachable',
        `The proxy could not reach the upstream (${reason}). Retry with the same Idempotency-Key.`,
      )
}

/** A problem only the proxy answers (its slug has a section in docs/errors.md); always worth a retry. */
function proxyProblem(status: number, slug: string, title: string, detail: string): HttpResponseLike {
  return {
    status,
    headers: { 'content-type': 'application/problem+json', 'cache-control': 'no-store', 'retry-after': '1' },
    body: new TextEncoder().encode(JSON.stringify({ type: `${DEFAULT_PROBLEM_BASE}${slug}`, title, status, detail })),
  }
}

/**
 * The proxy's scope rule: the trusted header's value when it is there, else the keyed hash of the
 * credential. Each source keeps its own prefix, so a tenant named `public`, or a header value copied
 * from `idemkey list` (`cred:…`), can never land in another source's scope.
 */
function proxyScope(scopeHeader: string | undefined, scopeSecret: string | undefined): (req: HttpRequestLike) => string {
  const secret = resolveScopeSecret(scopeSecret)
  const name = scopeHeader?.toLowerCase()
  return (req) => {
    const value = name === undefined ? undefined : req.headers[name]
    const first = Array.isArray(value) ? value[0] : value
    return first ? headerScope(first) : credentialScope(req.headers, secret)
  }
}
