/**
 * `idemkey proxy` in-process: what a client gets through it is what the upstream sent, on the first
 * answer and on every replay, and a drain lets answers already given reach their clients whole.
 */
import { randomBytes, randomUUID } from 'node:crypto'
import { Agent, createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from 'node:http'
import { type AddressInfo, connect, createServer as createTcpServer } from 'node:net'
import { gunzipSync, gzipSync } from 'node:zlib'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { createProxyServer, type ProxyServer, type ProxyServerOptions } from '../src/cli/proxy/server.js'
import { Ledger } from '../src/core/ledger.js'

const MiB = 1024 * 1024

/** The API behind the proxy: `/gzip` answers gzip-encoded JSON, `/big?mb=N&ms=M` N MiB after M ms. */
class Upstream {
  readonly runs = new Map<string, number>()
  /** The request targets the upstream was sent, in order. */
  readonly targets: string[] = []
  server: Server
  port = 0

  constructor() {
    this.server = createServer((req, res) => {
      req.resume()
      req.on('end', () => {
        const url = new URL(req.url ?? '/', 'http://x')
        const key = String(req.headers['idempotency-key'] ?? '')
        this.targets.push(`${req.method} ${req.url}`)
        this.runs.set(key, (this.runs.get(key) ?? 0) + 1)
        if (url.pathname === '/gzip') {
          // ?pad=N: N random bytes in the JSON, which gzip cannot shrink.
          const pad = randomBytes(Number(url.searchParams.get('pad') ?? 0)).toString('hex')
          const body = gzipSync(JSON.stringify({ id: 'ch_1', run: this.runs.get(key), ...(pad ? { pad } : {}) }))
          res.writeHead(201, { 'content-type': 'application/json', 'content-encoding': 'gzip', vary: 'Accept-Encoding' })
          return void res.end(body)
        }
        if (url.pathname === '/slow') {
          setTimeout(() => {
            if (res.destroyed) return
            res.writeHead(200, { 'content-type': 'text/plain' })
            res.end('late')
          }, 1_000)
          return
        }
        if (url.pathname === '/no-content') {
          res.writeHead(204, { etag: '"v2"' })
          return void res.end()
        }
        if (url.pathname === '/big') {
          const bytes = Number(url.searchParams.get('mb') ?? 1) * MiB
          setTimeout(
            () => {
              res.writeHead(201, { 'content-type': 'application/octet-stream', 'content-length': String(bytes) })
              res.end(Buffer.alloc(bytes, 'y'))
            },
            Number(url.searchParams.get('ms') ?? 0),
          )
          return
        }
        res.writeHead(201, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ run: this.runs.get(key) }))
      })
    })
  }

  async start(): Promise<void> {
    // A WebSocket-style endpoint: switches protocols, then echoes what it gets.
    this.server.on('upgrade', (req, socket) => {
      this.targets.push(`UPGRADE ${req.url} ${req.headers.upgrade} via=${req.headers.via} xff=${req.headers['x-forwarded-for']}`)
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n')
      socket.pipe(socket)
    })
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', () => resolve()))
    this.port = (this.server.address() as AddressInfo).port
  }
}

const upstream = new Upstream()
const proxies: ProxyServer[] = []

async function inProcess(options: Partial<ProxyServerOptions> = {}): Promise<{ proxy: ProxyServer; port: number }> {
  const proxy = createProxyServer({
    upstream: `http://127.0.0.1:${upstream.port}`,
    ledger: new Ledger({ store: new MemoryStore() }),
    scopeSecret: 'proxy-fidelity-test',
    log: () => {},
    ...options,
  })
  proxies.push(proxy)
  await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', () => resolve()))
  return { proxy, port: (proxy.server.address() as AddressInfo).port }
}

/** A POST with an Idempotency-Key; resolves with the raw body bytes, undecoded. */
function post(
  port: number,
  path: string,
  key: string,
  agent?: Agent,
): Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer; complete: boolean }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: '127.0.0.1', port, method: 'POST', path, agent, headers: { 'content-type': 'application/json', 'idempotency-key': key } },
      (res) => {
        const chunks: Buffer[] = []
        res.on('data', (c: Buffer) => chunks.push(c))
        const done = () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks), complete: res.complete })
        res.once('end', done)
        res.once('error', done)
        res.once('aborted', done)
      },
    )
    req.once('error', reject)
    req.end('{"amount":100}')
  })
}

beforeAll(async () => {
  await upstream.start()
})

afterAll(async () => {
  await Promise.all(proxies.map((p) => p.drain(100)))
  upstream.server.closeAllConnections()
  upstream.server.close()
})

describe('idemkey proxy: what reaches the client', () => {
  it('replays a gzip-encoded response with its Content-Encoding, so the replay decodes to the first answer', async () => {
    const { port } = await inProcess()
    const key = randomUUID()
    const first = await post(port, '/gzip', key)
    expect(first.status).toBe(201)
    expect(first.headers['content-encoding']).toBe('gzip')
    const replay = await post(port, '/gzip', key)
    expect(replay.headers['idempotent-replayed']).toBe('true')
    expect(upstream.runs.get(key)).toBe(1)
    expect(replay.body.equals(first.body)).toBe(true)
    expect(replay.headers['content-encoding']).toBe('gzip')
    expect(JSON.parse(gunzipSync(replay.body).toString())).toEqual({ id: 'ch_1', run: 1 })
  })

  it('replays a gzip-encoded response too large to store with a plain body-omitted problem, not labelled gzip', async () => {
    const { port } = await inProcess({ maxStoredBodyBytes: 1024 })
    const key = randomUUID()
    const first = await post(port, '/gzip?pad=4096', key)
    expect(first.headers['content-encoding']).toBe('gzip')
    expect(JSON.parse(gunzipSync(first.body).toString()).id).toBe('ch_1')
    const replay = await post(port, '/gzip?pad=4096', key)
    expect(replay.headers['idempotent-replayed']).toBe('true')
    expect(upstream.runs.get(key)).toBe(1)
    expect(replay.headers['content-encoding']).toBeUndefined()
    expect(replay.headers['content-type']).toBe('application/problem+json')
    expect(JSON.parse(replay.body.toString()).code).toBe('BODY_OMITTED')
  })

  it('answers a 204 without Content-Length (RFC 9110 §8.6), the first time and on replay', async () => {
    const { port } = await inProcess()
    const key = randomUUID()
    const first = await rawExchange(
      port,
      `PATCH /no-content HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: ${key}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
    )
    const replay = await rawExchange(
      port,
      `PATCH /no-content HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: ${key}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
    )
    expect(upstream.runs.get(key)).toBe(1)
    for (const answer of [first, replay]) {
      expect(answer).toMatch(/^HTTP\/1\.1 204 /)
      expect(answer).toMatch(/\r\netag: "v2"\r\n/i)
      expect(answer).not.toMatch(/\r\ncontent-length:/i)
      expect(answer).not.toMatch(/\r\ntransfer-encoding:/i)
    }
    expect(replay).toMatch(/\r\nidempotent-replayed: true\r\n/i)
  })

  it('a drain lets a large answer already being sent reach its client whole', async () => {
    const { proxy, port } = await inProcess({ maxStoredBodyBytes: 64 * MiB, maxBufferedBytes: 128 * MiB })
    const key = randomUUID()
    const answer = post(port, '/big?mb=32&ms=300', key)
    // Wait for the request to reach the proxy, then drain while the upstream still works on it.
    while (proxy.inFlight() === 0) await new Promise((r) => setTimeout(r, 10))
    const finished = await proxy.drain(10_000)
    const got = await answer
    expect(finished).toBe(true)
    expect(got.status).toBe(201)
    expect(got.body.byteLength).toBe(32 * MiB)
    expect(got.complete).toBe(true)
  })

  it('a drain answers the requests it waits for with Connection: close, so keep-alive clients send nothing more on a closing connection', async () => {
    const { proxy, port } = await inProcess()
    const agent = new Agent({ keepAlive: true, maxSockets: 1 })
    try {
      // A keep-alive connection, in use before the drain.
      expect((await post(port, '/charges', randomUUID(), agent)).headers.connection).toBe('keep-alive')
      const answer = post(port, '/big?mb=1&ms=300', randomUUID(), agent)
      while (proxy.inFlight() === 0) await new Promise((r) => setTimeout(r, 10))
      const drained = proxy.drain(5_000)
      const got = await answer
      expect(got.status).toBe(201)
      expect(got.headers.connection).toBe('close')
      expect(await drained).toBe(true)
    } finally {
      agent.destroy()
    }
  })

  it('forwards an absolute-form request target (RFC 9112 §3.2.2) to its path and query, after the upstream prefix', async () => {
    const { port } = await inProcess({ upstream: `http://127.0.0.1:${upstream.port}/v1` })
    const key = randomUUID()
    const target = `http://127.0.0.1:${port}/charges?currency=eur`
    const covered = await rawExchange(
      port,
      `POST ${target} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nIdempotency-Key: ${key}\r\nContent-Type: application/json\r\nContent-Length: 14\r\nConnection: close\r\n\r\n{"amount":100}`,
    )
    expect(covered).toMatch(/^HTTP\/1\.1 201 /)
    expect(upstream.targets.at(-1)).toBe('POST /v1/charges?currency=eur')
    // The same request in origin form is the same request: a replay, not a 422.
    const replay = await post(port, '/charges?currency=eur', key)
    expect(replay.status).toBe(201)
    expect(replay.headers['idempotent-replayed']).toBe('true')
    const uncovered = await rawExchange(
      port,
      `GET http://127.0.0.1:${port}/charges/1 HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: close\r\n\r\n`,
    )
    expect(uncovered).toMatch(/^HTTP\/1\.1 201 /)
    expect(upstream.targets.at(-1)).toBe('GET /v1/charges/1')
  })

  it('tunnels an Upgrade request (WebSocket) to the upstream and relays both ways once it switches protocols', async () => {
    // Short request deadlines: a tunnel is no request, and outlives them.
    const { port } = await inProcess({ upstream: `http://127.0.0.1:${upstream.port}/v1`, headerTimeoutMs: 200, bodyTimeoutMs: 200 })
    const socket = connect(port, '127.0.0.1')
    socket.setEncoding('latin1')
    let received = ''
    socket.on('data', (chunk: string) => {
      received += chunk
    })
    const until = async (what: string) => {
      for (let i = 0; i < 200 && !received.includes(what); i++) await new Promise((r) => setTimeout(r, 10))
    }
    try {
      socket.write(
        'GET /socket HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
      )
      await until('\r\n\r\n')
      expect(received).toMatch(/^HTTP\/1\.1 101 /)
      expect(upstream.targets.at(-1)).toBe('UPGRADE /v1/socket websocket via=1.1 idemkey xff=127.0.0.1')
      socket.write('ping-1')
      await until('ping-1')
      expect(received.endsWith('ping-1')).toBe(true)
      await new Promise((r) => setTimeout(r, 1_000))
      socket.write('ping-2')
      await until('ping-2')
      expect(received.endsWith('ping-2')).toBe(true)
    } finally {
      socket.destroy()
    }
  })

  it('serves a covered POST that offers an h2c upgrade as the covered request it is: run once, then replayed', async () => {
    const { port } = await inProcess()
    const key = randomUUID()
    const request = `POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nIdempotency-Key: ${key}\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{"amount":100}`
    const first = await rawExchange(port, request)
    const replay = await rawExchange(port, request)
    expect(first).toMatch(/^HTTP\/1\.1 201 /)
    expect(replay).toMatch(/\r\nidempotent-replayed: true\r\n/i)
    expect(upstream.runs.get(key)).toBe(1)
  })

  it('answers 502 problem+json to an Upgrade request whose upstream refuses connections', async () => {
    const holder = createTcpServer()
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve))
    const closed = (holder.address() as AddressInfo).port
    await new Promise((resolve) => holder.close(resolve))
    const { port } = await inProcess({ upstream: `http://127.0.0.1:${closed}` })
    const answer = await rawExchange(
      port,
      'GET /socket HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
    )
    expect(answer).toMatch(/^HTTP\/1\.1 502 /)
    expect(answer).toMatch(/\r\ncontent-type: application\/problem\+json\r\n/)
    expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).type).toMatch(/#upstream-unreachable$/)
  })

  it('logs nothing about the upstream when a client gives up on an uncovered request before the upstream answers', async () => {
    const lines: string[] = []
    const { port } = await inProcess({ log: (line) => lines.push(line) })
    const gone = new AbortController()
    const request = fetch(`http://127.0.0.1:${port}/slow`, { signal: gone.signal }).catch((error: Error) => error.name)
    await new Promise((r) => setTimeout(r, 200))
    gone.abort()
    expect(await request).toBe('AbortError')
    await new Promise((r) => setTimeout(r, 300))
    expect(lines).toEqual([])
  })

  it('tunnels an Upgrade request to an upstream given by an IPv6 literal (http://[::1]:PORT)', async () => {
    const v6 = createServer((_req, res) => res.end('plain'))
    v6.on('upgrade', (_req, socket) => {
      socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n')
      socket.pipe(socket)
    })
    await new Promise<void>((resolve) => v6.listen(0, '::1', () => resolve()))
    try {
      const { port } = await inProcess({ upstream: `http://[::1]:${(v6.address() as AddressInfo).port}` })
      const answer = await new Promise<string>((resolve, reject) => {
        const socket = connect(port, '127.0.0.1', () =>
          socket.write(
            'GET /socket HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
          ),
        )
        let received = ''
        socket.setEncoding('latin1')
        socket.on('data', (chunk: string) => {
          received += chunk
          if (received.includes('\r\n\r\n')) {
            socket.destroy()
            resolve(received)
          }
        })
        socket.once('error', reject)
      })
      expect(answer).toMatch(/^HTTP\/1\.1 101 /)
    } finally {
      v6.closeAllConnections()
      v6.close()
    }
  })
})

/** Sends `text` as is on a new connection and resolves with everything the proxy answered. */
function rawExchange(port: number, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(text))
    let answer = ''
    socket.setEncoding('latin1')
    socket.on('data', (chunk: string) => {
      answer += chunk
    })
    socket.once('error', reject)
    socket.once('close', () => resolve(answer))
  })
}
