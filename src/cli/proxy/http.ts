/**
 * The proxy's HTTP plumbing: what it forwards of a request and a response (RFC 9110 hop-by-hop rules,
 * forwarding headers), how it answers, and the problems only it answers.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import { distinctHeaders } from '../../http/node-body.js'
import type { HttpResponseLike } from '../../http/types.js'
import { DEFAULT_PROBLEM_BASE } from '../../protocol/problem.js'
import { UPSTREAM_BODY_TIMEOUT, UPSTREAM_HEADERS_TIMEOUT } from './upstream.js'

/** Hop-by-hop fields (RFC 9110 §7.6.1), never forwarded; fields named in `Connection` are dropped as well. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'transfer-encoding', 'upgrade', 'trailer', 'expect'])
/**
 * What a header name spelled with `_` for `-` (`Transfer_Encoding`) would stand for at an upstream that
 * reads `_` as `-` (CGI, WSGI and the stacks built on them): framing, hop-by-hop and forwarding fields.
 * Such names are dropped, so no client can frame or forward for the proxy.
 */
const LOOKALIKES = new Set([
  ...HOP_BY_HOP,
  'content-length',
  'host',
  'forwarded',
  'via',
  'x-forwarded-for',
  'x-forwarded-host',
  'x-forwarded-proto',
])
const TIMEOUT_CODES = new Set([UPSTREAM_HEADERS_TIMEOUT, UPSTREAM_BODY_TIMEOUT, 'ETIMEDOUT'])
export const VIA = '1.1 idemkey'

/** Sends a whole response; with `stallMs`, a client that stops reading it for that long is disconnected. */
export function send(res: ServerResponse, response: HttpResponseLike, stallMs = 0): void {
  if (res.headersSent || res.destroyed) return
  if (stallMs > 0) res.setTimeout(stallMs)
  const headers: Record<string, string | string[]> = { ...response.headers }
  // A 204 may not carry Content-Length (RFC 9110 §8.6), and a 304's would be the length of the
  // representation it stands for, not of its empty body: neither gets one it did not come with.
  if (response.status !== 204 && response.status !== 304) headers['content-length'] = String(response.body.byteLength)
  if (!headers.via) headers.via = VIA
  res.writeHead(response.status, headers)
  res.end(response.body)
}

/** Names listed in a Connection field: also hop-by-hop for this message. */
function connectionNames(value: string | string[] | undefined): Set<string> | undefined {
  // Most messages name nothing, or only keep-alive, which is hop-by-hop anyway.
  if (value === undefined || value === 'keep-alive') return undefined
  const text = Array.isArray(value) ? value.join(',') : (value ?? '')
  return new Set(
    text
      .split(',')
      .map((name) => name.trim().toLowerCase())
      .filter(Boolean),
  )
}

/** What is forwarded of a request's headers; `headers` is `distinctHeaders(req)` when the caller has it already. */
export function requestHeaders(
  req: IncomingMessage,
  buffered: boolean,
  headers: Record<string, string | string[] | undefined> = distinctHeaders(req),
): Record<string, string | string[]> {
  const dropped = connectionNames(req.headers.connection)
  const out: Record<string, string | string[]> = {}
  for (const name in headers) {
    const value = headers[name]
    if (value === undefined || HOP_BY_HOP.has(name) || dropped?.has(name) || name === 'host') continue
    if (buffered && name === 'content-length') continue
    if (name.includes('_') && LOOKALIKES.has(name.replaceAll('_', '-'))) continue
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

export function responseHeaders(
  headers: Record<string, string | string[] | undefined>,
  streaming: boolean,
): Record<string, string | string[]> {
  const dropped = connectionNames(headers.connection)
  const out: Record<string, string | string[]> = {}
  for (const name in headers) {
    const value = headers[name]
    if (value === undefined || HOP_BY_HOP.has(name) || dropped?.has(name)) continue
    if (!streaming && name === 'content-length') continue
    out[name] = value
  }
  out.via = headers.via ? `${headers.via}, ${VIA}` : VIA
  return out
}

/**
 * 504 for an upstream timeout, 502 for a refused or broken connection: both transient, so the record
 * is released. The client gets a generic detail; the cause (addresses, codes) goes to the log.
 */
export function upstreamProblem(error: unknown, req: IncomingMessage, log: (kind: string, line: string) => void): HttpResponseLike {
  const code = (error as { code?: string }).code ?? ''
  const timedOut = TIMEOUT_CODES.has(code)
  log(
    timedOut ? 'upstream-timeout' : 'upstream-unreachable',
    `upstream ${timedOut ? 'timed out' : 'unreachable'} for ${req.method} ${pathOf(req)}: ${oneLine(error)}${code ? ` (${code})` : ''}`,
  )
  return timedOut
    ? proxyProblem(
        504,
        'upstream-timeout',
        'Upstream timed out',
        'The upstream did not answer in time. Retry with the same Idempotency-Key.',
      )
    : proxyProblem(
        502,
        'upstream-unreachable',
        'Upstream unreachable',
        'The proxy could not reach the upstream. Retry with the same Idempotency-Key.',
      )
}

/** An answer the proxy gives instead of reading a covered body any further (`408`, `503`). */
export class Refusal extends Error {
  constructor(readonly response: HttpResponseLike) {
    super(`refused with ${response.status}`)
  }
}

export function oneLine(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).replace(/\s+/g, ' ').trim()
}

/**
 * The request target in origin form (`/path?query`), or `undefined` for one the proxy refuses. A client
 * may send the absolute form (`POST http://host/path HTTP/1.1`, RFC 9112 §3.2.2), which a server must
 * accept: forwarded as it came, it would be appended to the upstream's prefix as a path, and an
 * upstream would prefer its authority over Host. So it is read with the URL parser, and one it cannot
 * read (`http://evil.example:99999/x`) is refused, as is a target that is no path at all (`*`, an
 * authority) and a path with a dot segment (`/../internal`, `/%2e%2e/`, `/..%2f`), which an upstream
 * that resolves them would take outside the `--upstream` path prefix. Clients remove dot segments
 * before sending (RFC 3986 §5.2.4), so none sends one to mean anything else.
 */
export function requestTarget(url: string | undefined): string | undefined {
  if (url === undefined) return '/'
  let target = url
  if (!url.startsWith('/')) {
    if (!/^[a-z][a-z\d+.-]*:\/\//i.test(url)) return undefined
    try {
      const parsed = new URL(url)
      target = `${parsed.pathname}${parsed.search}`
    } catch {
      return undefined
    }
  }
  const query = target.indexOf('?')
  return DOT_SEGMENT.test(query < 0 ? target : target.slice(0, query)) ? undefined : target
}

/** A `.` or `..` segment, with `/`, `\\` or their percent-encodings as separators and `.` possibly encoded. */
const DOT_SEGMENT = /(?:^|[/\\]|%2f|%5c)(?:\.|%2e){1,2}(?:[/\\]|%2f|%5c|$)/i

/** The 400 of a target {@link requestTarget} refuses. */
export function badTarget(): HttpResponseLike {
  return proxyProblem(
    400,
    'bad-target',
    'Bad request target',
    'The request target is not a path the proxy forwards: an absolute URL that does not parse, no path at all, or a path with a "." or ".." segment (plain or percent-encoded). Send the path as a browser would, with dot segments resolved.',
    false,
  )
}

/** The request's path without its query, which may carry secrets: for log lines. */
export function pathOf(req: IncomingMessage): string {
  return (req.url ?? '/').split('?')[0] as string
}

/** A problem only the proxy answers (its slug has a section in docs/errors.md); worth a retry unless `retry` is false. */
export function proxyProblem(status: number, slug: string, title: string, detail: string, retry = true): HttpResponseLike {
  const headers: Record<string, string> = { 'content-type': 'application/problem+json', 'cache-control': 'no-store' }
  if (retry) headers['retry-after'] = '1'
  return {
    status,
    headers,
    body: new TextEncoder().encode(JSON.stringify({ type: `${DEFAULT_PROBLEM_BASE}${slug}`, title, status, detail })),
  }
}
