import type { IncomingMessage, ServerResponse } from 'node:http'
import { pipeline } from 'node:stream/promises'
import type { Decision, HttpResponseLike } from '../../http/types.js'
import type { Trail } from './access.js'
import { requestHeaders, responseHeaders, send, upstreamProblem } from './http.js'
import { type BudgetTicket, drained } from './limits.js'
import type { UpstreamPool, UpstreamResponse } from './upstream.js'

const EMPTY = new Uint8Array(0)

/** Where and how {@link forwarders} send requests on. */
export interface ForwardingOptions {
  pool: UpstreamPool
  /** The upstream base URL's path, without its trailing slash, put before every request's target. */
  prefix: string
  /** Largest response body held whole and stored for replay. */
  maxStoredBody: number
  /** How long a client may stall while it reads a response. */
  bodyTimeoutMs: number
  log: (kind: string, line: string) => void
}

/** The proxy's two ways to the upstream: a covered request with its body held, or any other streamed. */
export interface Forwarders {
  covered(
    req: IncomingMessage,
    res: ServerResponse,
    body: Uint8Array,
    ticket: BudgetTicket,
    requestFields: Record<string, string | string[] | undefined>,
    record?: Extract<Decision, { kind: 'execute' }>,
    trail?: Trail,
  ): Promise<void>
  streaming(req: IncomingMessage, res: ServerResponse, trail?: Trail): Promise<void>
}

/** The {@link Forwarders} of one proxy. */
export function forwarders(options: ForwardingOptions): Forwarders {
  const { pool, prefix, maxStoredBody, bodyTimeoutMs, log } = options
  return { covered: forwardCovered, streaming: forwardStreaming }

  /**
   * Forwards a covered request with its buffered body and answers the client. A response up to
   * `maxStoredBody` is held whole, its record settled, then sent. A larger one (declared or
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
}
