import { Agent, createServer, type IncomingMessage, request, type Server, type ServerResponse } from 'node:http'
import type { WorkerPool } from './workers.js'

/** What goes wrong on the first attempt of an intent. */
export type Fault =
  /** Nothing: the network behaves. */
  | 'none'
  /** The server commits, then the response is lost (the ambiguous case): the client sees a reset. */
  | 'drop'
  /** The bank is slow: the client times out and retries while the first attempt still runs. */
  | 'timeout'
  /** The worker is killed mid-request, before it commits; it is restarted. */
  | 'crash'
  /** The user clicks twice: two concurrent requests for one intent (sent by the client side). */
  | 'double'
  /** After the intent succeeded, a buggy client reuses its key with another amount. */
  | 'reuse'

/**
 * The demo's network between clients and workers: a small reverse proxy that applies each intent's
 * fault to the first request it sees for that intent (by the `x-demo-intent` header), and counts
 * every HTTP attempt that reaches it.
 */
export class FaultInjector {
  /** HTTP attempts received. */
  attempts = 0
  readonly #faults: Map<string, Fault>
  readonly #applied = new Set<string>()
  readonly #pool: WorkerPool
  readonly #agent = new Agent({ keepAlive: true, timeout: 10_000, maxSockets: 64 })
  readonly #server: Server

  constructor(pool: WorkerPool, faults: Map<string, Fault>) {
    this.#pool = pool
    this.#faults = faults
    this.#server = createServer((req, res) => {
      this.#forward(req, res).catch(() => res.destroy())
    })
    this.#server.keepAliveTimeout = 10_000
  }

  /** Starts listening on a loopback port; resolves with the origin clients use. */
  listen(): Promise<string> {
    return new Promise((resolve) => {
      this.#server.listen(0, '127.0.0.1', () => {
        const address = this.#server.address()
        resolve(`http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`)
      })
    })
  }

  async #forward(req: IncomingMessage, res: ServerResponse): Promise<void> {
    this.attempts++
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const intent = String(req.headers['x-demo-intent'] ?? '')
    let fault = this.#faults.get(intent) ?? 'none'
    // A fault hits the first attempt only: the retries are what the demo is about.
    if (this.#applied.has(intent)) fault = 'none'
    else this.#applied.add(intent)

    const headers: Record<string, string> = {}
    for (const [name, value] of Object.entries(req.headers)) {
      if (value !== undefined && name !== 'connection' && name !== 'keep-alive' && name !== 'host') headers[name] = String(value)
    }
    if (fault === 'crash') headers['x-demo-fault'] = 'crash'
    if (fault === 'timeout') headers['x-demo-fault'] = 'slow'

    const origin = await this.#pool.pick()
    let upstream: { statusCode: number; headers: Record<string, string | string[] | undefined>; body: Uint8Array }
    try {
      upstream = await this.#send(origin, req, headers, Buffer.concat(chunks))
    } catch {
      // The worker died mid-request: answer as a load balancer would.
      if (!res.headersSent) {
        res.writeHead(502, { 'content-type': 'text/plain' })
        res.end('bad gateway: the worker went away')
      }
      return
    }
    if (fault === 'drop') {
      // The charge is committed; the response never reaches the client.
      res.socket?.destroy()
      return
    }
    const out: Record<string, string | string[]> = {}
    for (const [name, value] of Object.entries(upstream.headers)) {
      if (value !== undefined && !['connection', 'keep-alive', 'transfer-encoding'].includes(name)) out[name] = value
    }
    if (!res.destroyed) {
      res.writeHead(upstream.statusCode, out)
      res.end(upstream.body)
    }
  }

  /** One request to a worker, its response read whole. */
  #send(
    origin: string,
    req: IncomingMessage,
    headers: Record<string, string>,
    body: Buffer,
  ): Promise<{ statusCode: number; headers: Record<string, string | string[] | undefined>; body: Uint8Array }> {
    const { hostname, port } = new URL(origin)
    return new Promise((resolve, reject) => {
      const out = request(
        { agent: this.#agent, host: hostname, port, path: req.url ?? '/', method: req.method ?? 'GET', headers },
        (res) => {
          const parts: Buffer[] = []
          res.on('data', (chunk: Buffer) => parts.push(chunk))
          res.once('error', reject)
          res.once('end', () => resolve({ statusCode: res.statusCode ?? 502, headers: res.headers, body: Buffer.concat(parts) }))
        },
      )
      out.once('error', reject)
      out.end(body)
    })
  }

  /** Stops listening and closes connections. */
  async close(): Promise<void> {
    this.#server.closeAllConnections()
    await new Promise<void>((resolve) => this.#server.close(() => resolve()))
    this.#agent.destroy()
  }
}
