/**
 * Upgrade requests (WebSocket, RFC 9110 §7.8) through the proxy: the request goes to the upstream with
 * its `Upgrade` and the forwarding headers, and once the upstream answers (a `101`, or any refusal),
 * the bytes flow both ways untouched until either side closes. Nothing is buffered or recorded: an
 * upgrade is never a covered request.
 */
import type { IncomingMessage } from 'node:http'
import { connect as connectTcp, isIP, type Socket } from 'node:net'
import { connect as connectTls } from 'node:tls'
import { originForm, proxyProblem, requestHeaders } from './proxy-http.js'

/** What {@link tunnelUpgrade} needs of the proxy. */
export interface UpgradeTarget {
  /** The upstream's base URL; its path prefix comes before the request's path. */
  base: URL
  prefix: string
  /** How long the upstream may take to accept the connection. */
  timeoutMs: number
  log: (kind: string, line: string) => void
}

/**
 * Opens a connection to the upstream, sends it the upgrade request, and joins the two sockets.
 * The client's socket is `socket`, with `head` the bytes it sent after its headers.
 */
export function tunnelUpgrade(req: IncomingMessage, socket: Socket, head: Buffer, target: UpgradeTarget): void {
  const { base, prefix, timeoutMs, log } = target
  const port = Number(base.port) || (base.protocol === 'https:' ? 443 : 80)
  // A URL writes an IPv6 literal in brackets (`[::1]`), which net.connect would look up as a name.
  const host = base.hostname.replace(/^\[(.*)\]$/, '$1')
  const upstream =
    base.protocol === 'https:'
      ? // SNI carries names only (RFC 6066): none for an address.
        connectTls({ host, port, ...(isIP(host) ? {} : { servername: host }) })
      : connectTcp({ host, port })
  upstream.setNoDelay(true)
  upstream.setTimeout(timeoutMs, () => upstream.destroy(Object.assign(new Error('upstream connect timed out'), { code: 'ETIMEDOUT' })))
  let joined = false
  upstream.once(base.protocol === 'https:' ? 'secureConnect' : 'connect', () => {
    upstream.setTimeout(0)
    joined = true
    upstream.write(requestHead(req, base, prefix))
    if (head.byteLength > 0) upstream.write(head)
    socket.pipe(upstream)
    upstream.pipe(socket)
  })
  upstream.on('error', (error) => {
    log('upstream-unreachable', `upstream unreachable for upgrade ${req.method} ${originForm(req.url).split('?')[0]}: ${error.message}`)
    if (!joined && socket.writable) {
      const problem = proxyProblem(
        502,
        'upstream-unreachable',
        'Upstream unreachable',
        'The proxy could not reach the upstream. Retry after the Retry-After delay.',
      )
      const fields = Object.entries({ ...problem.headers, 'content-length': String(problem.body.byteLength), connection: 'close' })
      socket.end(
        Buffer.concat([
          Buffer.from(`HTTP/1.1 502 Bad Gateway\r\n${fields.map(([name, value]) => `${name}: ${value}\r\n`).join('')}\r\n`, 'latin1'),
          problem.body,
        ]),
      )
    } else socket.destroy()
  })
  upstream.on('close', () => socket.destroy())
  socket.on('error', () => upstream.destroy())
  socket.on('close', () => upstream.destroy())
}

/** The request line and headers sent upstream: the forwarded headers, and the upgrade's own hop-by-hop pair. */
function requestHead(req: IncomingMessage, base: URL, prefix: string): string {
  const headers = requestHeaders(req, false)
  const lines = [`${req.method ?? 'GET'} ${prefix}${originForm(req.url)} HTTP/1.1`, `host: ${base.host}`]
  for (const [name, value] of Object.entries(headers)) {
    for (const one of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${one}`)
  }
  lines.push('connection: upgrade', `upgrade: ${String(req.headers.upgrade ?? '')}`)
  return `${lines.join('\r\n')}\r\n\r\n`
}
