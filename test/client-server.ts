/**
 * A real payments server for the client tests: node:http on 127.0.0.1, port 0, with a ledger behind
 * it, either driven directly (a minimal HTTP layer written here) or through idemkey's fetch adapter.
 * A fault plan per key makes the next attempts of that key fail in chosen ways.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { Ledger } from '../src/core/ledger.js'
import type { StoredResponse } from '../src/core/store.js'
import { withIdempotency } from '../src/http/fetch/index.js'
import { parseKeyHeader } from '../src/protocol/key-header.js'

/** What the server does to the next attempt of a key; the plan is used up attempt by attempt. */
export type Fault =
  /** Runs the charge, commits it, then resets the connection: the client never sees the answer. */
  | 'reset-after-commit'
  /** Resets the connection before anything runs. */
  | 'reset-before'
  /** 503 before the ledger, no Retry-After. */
  | '503'
  /** 429 with `Retry-After: 2`. */
  | '429-retry-after-2'
  /** 503 with `Retry-After` as the HTTP date `retryAtMs`. */
  | '503-retry-after-date'
  /** A plain validation 422 (problem+json, not a key reuse). */
  | '422-validation'
  /** Runs and commits the charge, then never answers this attempt (the client's attempt timeout fires). */
  | 'stall-after-commit'
  /** Answers at once with headers and the first bytes, and the rest of the body 400 ms later. */
  | 'slow-body'

export type ServerMode = 'ledger' | 'fetch-adapter'

const encoder = new TextEncoder()
const decoder = new TextDecoder()

export class PaymentsServer {
  readonly charges = new Map<string, number>()
  /** Request bodies the charge handler saw, in order. */
  readonly bodies: string[] = []
  readonly faults = new Map<string, Fault[]>()
  /** The Idempotency-Key of every request that reached the server, faults included. */
  readonly keysSeen: string[] = []
  /** Set by a test to hold charges of a key until it resolves (a request in flight). */
  readonly gates = new Map<string, Promise<void>>()
  /** Called when the server has its answer for the key (the ledger recorded it), before any fault on the way back. */
  readonly answered = new Map<string, () => void>()
  /** Resolved when a charge of the key has started running. */
  readonly started = new Map<string, () => void>()
  readonly ledger = new Ledger({ store: new MemoryStore(), wait: 0, lease: '2s' })
  readonly #adapter = withIdempotency(this.ledger, (request) => this.#chargeFromRequest(request))
  #server: Server | undefined
  url = ''
  port = 0
  /** When the `503-retry-after-date` fault tells the client to come back. */
  retryAtMs = 0

  constructor(readonly mode: ServerMode) {}

  /** Listens on `port` (0: a free one). After {@link close}, `start(port)` restarts it on the same port, ledger and all. */
  async start(port = 0): Promise<void> {
    this.#server = createServer((req, res) => {
      this.#serve(req, res).catch((error: unknown) => {
        res.destroy(error as Error)
      })
    })
    await new Promise<void>((resolve) => this.#server?.listen(port, '127.0.0.1', resolve))
    this.port = (this.#server.address() as AddressInfo).port
    this.url = `http://127.0.0.1:${this.port}`
  }

  close(): Promise<void> {
    const server = this.#server
    if (!server) return Promise.resolve()
    server.closeAllConnections()
    return new Promise((resolve) => server.close(() => resolve()))
  }

  count(key: string): number {
    return this.keysSeen.filter((seen) => seen === key).length
  }

  async #serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const key = String(req.headers['idempotency-key'] ?? '')
    this.keysSeen.push(key)
    const fault = this.faults.get(key)?.shift()
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const body = Buffer.concat(chunks)
    if (fault === 'reset-before') return void res.socket?.destroy()
    if (fault === '503') return send(res, { status: 503, headers: { 'content-type': 'text/plain' }, body: encoder.encode('busy') })
    if (fault === '429-retry-after-2') return send(res, { status: 429, headers: { 'retry-after': '2' }, body: new Uint8Array() })
    if (fault === '503-retry-after-date') {
      return send(res, { status: 503, headers: { 'retry-after': new Date(this.retryAtMs).toUTCString() }, body: new Uint8Array() })
    }
    if (fault === '422-validation') {
      const problem = { type: 'https://example.com/probs/amount', title: 'Invalid amount', status: 422, detail: 'amount must be positive' }
      return send(res, {
        status: 422,
        headers: { 'content-type': 'application/problem+json' },
        body: encoder.encode(JSON.stringify(problem)),
      })
    }
    const answer = this.mode === 'ledger' ? await this.#throughLedger(req, key, body) : await this.#throughAdapter(req, body)
    this.answered.get(key)?.()
    if (fault === 'reset-after-commit') return void res.socket?.destroy()
    if (fault === 'stall-after-commit') return // the client gives up on this attempt; closeAllConnections ends it
    if (fault === 'slow-body') {
      res.writeHead(answer.status, answer.headers)
      res.write(answer.body.subarray(0, 1))
      await new Promise((resolve) => setTimeout(resolve, 400))
      res.end(answer.body.subarray(1))
      return
    }
    send(res, answer)
  }

  /** A minimal HTTP layer over the ledger, written out here so the client is tested without the adapters. */
  async #throughLedger(req: IncomingMessage, rawKey: string, body: Buffer): Promise<StoredResponse> {
    const key = parseKeyHeader(rawKey || undefined)
    if (key === undefined) return problemOf(400, 'KEY_MISSING', 'send an Idempotency-Key')
    const result = await this.ledger.run<StoredResponse>(
      { key, payload: { method: req.method, path: req.url, body: body.toString('base64') } },
      () => this.#charge(key, decoder.decode(body)),
      { encode: (value) => value, decode: (stored) => stored },
    )
    switch (result.kind) {
      case 'executed':
        return result.value
      case 'replayed':
        return { ...result.value, headers: { ...result.value.headers, 'idempotent-replayed': 'true' } }
      case 'mismatch':
        return problemOf(422, 'FINGERPRINT_MISMATCH', `the key ${key} was used with another request`)
      case 'in_progress':
        return {
          ...problemOf(409, 'IN_PROGRESS', 'still running'),
          headers: { 'content-type': 'application/problem+json', 'retry-after': String(Math.ceil(result.retryAfterMs / 1_000)) },
        }
    }
  }

  async #throughAdapter(req: IncomingMessage, body: Buffer): Promise<StoredResponse> {
    const request = new Request(this.url + (req.url ?? '/'), {
      method: req.method,
      headers: Object.entries(req.headers).flatMap(([name, value]) =>
        value === undefined ? [] : (Array.isArray(value) ? value : [value]).map((v): [string, string] => [name, v]),
      ),
      body: req.method === 'GET' || req.method === 'HEAD' ? undefined : new Uint8Array(body),
    })
    const response = await this.#adapter(request)
    return { status: response.status, headers: Object.fromEntries(response.headers), body: new Uint8Array(await response.arrayBuffer()) }
  }

  async #chargeFromRequest(request: Request): Promise<Response> {
    const key = request.headers.get('idempotency-key') ?? ''
    const charged = await this.#charge(parseKeyHeader(key) ?? key, await request.text())
    return new Response(charged.body as Uint8Array<ArrayBuffer>, { status: charged.status, headers: charged.headers })
  }

  async #charge(key: string, text: string): Promise<StoredResponse> {
    this.bodies.push(text)
    this.started.get(key)?.()
    await this.gates.get(key)
    this.charges.set(key, (this.charges.get(key) ?? 0) + 1)
    const body = JSON.stringify({ charged: text.startsWith('{') ? JSON.parse(text) : text, n: this.charges.get(key) })
    return { status: 201, headers: { 'content-type': 'application/json' }, body: encoder.encode(body) }
  }
}

function send(res: ServerResponse, response: StoredResponse): void {
  res.writeHead(response.status, response.headers)
  res.end(response.body)
}

function problemOf(status: number, code: string, detail: string): StoredResponse {
  const type = `https://idemkey.dev/docs/errors#${code.toLowerCase().replaceAll('_', '-')}`
  return {
    status,
    headers: { 'content-type': 'application/problem+json' },
    body: encoder.encode(JSON.stringify({ type, title: code, status, detail, code })),
  }
}
