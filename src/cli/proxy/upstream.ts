/**
 * The proxy's connection pool to its upstream, on `node:http`/`node:https` with a keep-alive Agent:
 * one request at a time per connection, at most {@link UpstreamOptions.connections} open, idle ones
 * closed before the upstream's announced `Keep-Alive: timeout` (Node's Agent reads it).
 */
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http'
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https'
import type { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { distinctHeaders } from '../../http/node-body.js'

/** Error codes of an upstream that stopped answering: no response headers, or no body bytes, within the timeout. */
export const UPSTREAM_HEADERS_TIMEOUT = 'UPSTREAM_HEADERS_TIMEOUT'
export const UPSTREAM_BODY_TIMEOUT = 'UPSTREAM_BODY_TIMEOUT'

/** Options of {@link UpstreamPool}. */
export interface UpstreamOptions {
  /** Connections open at once at most; requests past it wait for one. */
  connections: number
  /** No response headers, or no body bytes, for this long: the request fails with a timeout code above. */
  timeoutMs: number
  /** An idle connection is closed after this (or sooner when the upstream announces a shorter keep-alive). */
  keepAliveMs: number
}

/** One request to the upstream: `body` whole (a covered request) or streamed (anything else). */
export interface UpstreamRequest {
  path: string
  method: string
  headers: Record<string, string | string[]>
  body?: Uint8Array | Readable
  signal?: AbortSignal
}

/** The upstream's answer: status, headers (lower-case names; repeated fields as arrays) and the body to read. */
export interface UpstreamResponse {
  statusCode: number
  headers: Record<string, string | string[] | undefined>
  body: IncomingMessage
}

/** Keep-alive connections to one origin. */
export class UpstreamPool {
  readonly #agent: HttpAgent
  readonly #request: typeof httpRequest
  readonly #host: string
  readonly #port: string
  readonly #timeoutMs: number

  constructor(origin: URL, options: UpstreamOptions) {
    const secure = origin.protocol === 'https:'
    const agentOptions = {
      keepAlive: true,
      maxSockets: options.connections,
      timeout: options.keepAliveMs,
      scheduling: 'lifo' as const,
      noDelay: true,
    }
    this.#agent = secure ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions)
    this.#request = secure ? httpsRequest : httpRequest
    // URL keeps IPv6 literals bracketed; the socket wants them bare.
    this.#host = origin.hostname.replace(/^\[(.*)\]$/, '$1')
    this.#port = origin.port
    this.#timeoutMs = options.timeoutMs
  }

  /** Sends a request; resolves with the response once its headers arrived, rejects on a failed connection or a timeout. */
  request(options: UpstreamRequest): Promise<UpstreamResponse> {
    return new Promise((resolve, reject) => {
      const req = this.#request({
        agent: this.#agent,
        host: this.#host,
        port: this.#port,
        path: options.path,
        method: options.method,
        headers: options.headers,
        signal: options.signal,
      })
      let answered: IncomingMessage | undefined
      // The socket's idle timer: reset by every byte either way, so one timer serves both timeouts.
      req.setTimeout(this.#timeoutMs, () => {
        const code = answered ? UPSTREAM_BODY_TIMEOUT : UPSTREAM_HEADERS_TIMEOUT
        const what = answered ? 'no body bytes' : 'no response headers'
        req.destroy(Object.assign(new Error(`upstream sent ${what} for ${this.#timeoutMs} ms`), { code }))
      })
      req.once('error', reject)
      req.once('response', (res: IncomingMessage) => {
        answered = res
        // An error after the headers (a reset, a timeout) ends the body: whoever reads it sees it there.
        req.removeListener('error', reject)
        req.on('error', (error) => res.destroy(error))
        resolve({ statusCode: res.statusCode ?? 502, headers: distinctHeaders(res), body: res })
      })
      const body = options.body
      if (body === undefined) req.end()
      else if (body instanceof Uint8Array) req.end(body)
      else pipeline(body, req).catch((error: unknown) => req.destroy(error as Error))
    })
  }

  /** Closes idle connections now and the others as their requests end. */
  async close(): Promise<void> {
    this.#agent.destroy()
  }
}
