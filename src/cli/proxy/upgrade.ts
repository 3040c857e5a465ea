/**
 * Upgrade requests (WebSocket, RFC 9110 §7.8) through the proxy. The request goes to the upstream as
 * any forwarded request does (its Host, path prefix and forwarding headers), and the two sockets are
 * joined only once the upstream answers `101 Switching Protocols`. Any other answer is relayed as an
 * ordinary response and the client's connection closed: what the client sent after its upgrade
 * request never reaches the upstream, whose HTTP parser would read it as new requests. A joined
 * tunnel counts against its own limit, not `--max-connections`, and is closed once idle.
 */
import { request as httpRequest, type IncomingMessage, STATUS_CODES } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { isIP, type Socket } from 'node:net'
import type { HttpResponseLike } from '../../http/types.js'
import { proxyProblem, requestHeaders, responseHeaders, VIA } from './http.js'

/** How long a closed connection keeps reading (and dropping) what the client still sends, so it reads the answer rather than a reset. */
const LINGER_MS = 2_000

/** What {@link tunnelUpgrade} needs of the proxy. */
export interface UpgradeTarget {
  /** The upstream's base URL, and its path prefix (without the trailing slash). */
  base: URL
  prefix: string
  /** How long the upstream may take to answer the upgrade. */
  timeoutMs: number
  /** A joined tunnel with no bytes either way for this long is closed. */
  idleMs: number
  /** The tunnels open or being opened, this one included: it leaves the set when its client socket closes. */
  tunnels: Set<Socket>
  /** Called once the upstream answered `101`: the client's socket is a tunnel from then on. */
  joined: (socket: Socket) => void
  /** Called once with the status the client got, and the upstream's when it answered. */
  done: (status: number, upstreamStatus?: number) => void
  log: (kind: string, line: string) => void
}

/**
 * Sends the upgrade request `req` (its target already checked, in origin form) to the upstream and
 * joins `socket` to it on a `101`. `head` is what the client sent after its headers: held until then.
 */
export function tunnelUpgrade(req: IncomingMessage, socket: Socket, head: Buffer, target: UpgradeTarget): void {
  const { base, prefix, timeoutMs, idleMs, tunnels, log } = target
  // Nothing of the client's goes anywhere before the upstream has switched protocols.
  socket.pause()
  tunnels.add(socket)
  socket.once('close', () => tunnels.delete(socket))
  socket.on('error', () => socket.destroy())
  const https = base.protocol === 'https:'
  // A URL writes an IPv6 literal in brackets (`[::1]`), which the resolver would look up as a name.
  const host = base.hostname.replace(/^\[(.*)\]$/, '$1')
  const headers = requestHeaders(req, true)
  headers.host = base.host
  headers.connection = 'upgrade'
  headers.upgrade = String(req.headers.upgrade ?? '')
  const upstream = (https ? httpsRequest : httpRequest)({
    host,
    port: Number(base.port) || (https ? 443 : 80),
    method: req.method,
    path: prefix + (req.url ?? '/'),
    headers,
    agent: false,
    timeout: timeoutMs,
    // SNI carries names only (RFC 6066): none for an address.
    ...(https && !isIP(host) ? { servername: host } : {}),
  })
  let answered = false
  const answer = (status: number, upstreamStatus?: number) => {
    answered = true
    target.done(status, upstreamStatus)
  }
  upstream.on('timeout', () => upstream.destroy(new Error(`no answer to the upgrade within ${timeoutMs} ms`)))
  upstream.on('error', (error) => {
    if (answered) return void socket.destroy()
    log('upstream-unreachable', `upstream unreachable for upgrade ${req.method} ${(req.url ?? '/').split('?')[0]}: ${error.message}`)
    answer(502)
    refuseRaw(
      socket,
      proxyProblem(
        502,
        'upstream-unreachable',
        'Upstream unreachable',
        'The proxy could not reach the upstream. Retry after the Retry-After delay.',
      ),
    )
  })
  upstream.on('response', (res) => {
    // The upstream did not switch: an ordinary answer, after which the connection is closed.
    answer(res.statusCode ?? 502, res.statusCode)
    if (socket.destroyed) return void res.destroy()
    const fields = { ...responseHeaders(res.headers, true), connection: 'close' }
    socket.write(statusHead(res.statusCode ?? 502, Object.entries(fields)))
    res.on('error', () => socket.destroy())
    res.pipe(socket)
    res.once('end', () => linger(socket))
  })
  upstream.on('upgrade', (res, tunnel: Socket, upstreamHead: Buffer) => {
    answer(101, res.statusCode)
    if (socket.destroyed) return void tunnel.destroy()
    target.joined(socket)
    const fields: Array<[string, string]> = []
    for (let i = 0; i < res.rawHeaders.length; i += 2) fields.push([res.rawHeaders[i] as string, res.rawHeaders[i + 1] as string])
    fields.push(['via', VIA])
    socket.write(statusHead(101, fields))
    if (upstreamHead.byteLength > 0) socket.write(upstreamHead)
    if (head.byteLength > 0) tunnel.write(head)
    tunnel.setNoDelay(true)
    // Any byte either way counts as activity on both sockets (reads and writes reset a socket's timer).
    socket.setTimeout(idleMs, () => socket.destroy())
    tunnel.setTimeout(idleMs, () => tunnel.destroy())
    tunnel.on('error', () => socket.destroy())
    tunnel.on('close', () => socket.destroy())
    socket.on('close', () => tunnel.destroy())
    socket.pipe(tunnel)
    tunnel.pipe(socket)
  })
  socket.on('close', () => {
    if (!answered) upstream.destroy()
  })
  upstream.end()
}

/** Answers an upgrade request on its raw socket (the tunnel refused, the upstream unreachable) and closes the connection. */
export function refuseRaw(socket: Socket, response: HttpResponseLike): void {
  if (socket.destroyed) return
  const fields = Object.entries({ ...response.headers, 'content-length': String(response.body.byteLength), connection: 'close', via: VIA })
  socket.write(statusHead(response.status, fields))
  socket.write(response.body)
  linger(socket)
}

function statusHead(status: number, fields: Array<[string, string | string[]]>): Buffer {
  const lines = [`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Unknown'}`]
  for (const [name, value] of fields) for (const one of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${one}`)
  return Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1')
}

/** Ends the socket, dropping what the client still sends until it closes too, or LINGER_MS have passed. */
function linger(socket: Socket): void {
  socket.on('data', () => {})
  socket.resume()
  socket.end()
  setTimeout(() => socket.destroy(), LINGER_MS).unref()
}
