/**
 * `idemkey proxy` and the Express middleware probed as an attacker would (issue 60): raw TCP on
 * loopback, an upstream that logs every byte it receives, and a second server standing for "another
 * host". Request smuggling, SSRF, tunnels, caller identity, request targets and the operator page's
 * Host. docs/proxy.md, "Security model", says what each case pins.
 *
 * The tunnel cases need a Node.js line with `shouldUpgradeCallback` (24.9 and later, what `npm test`
 * runs on); on older lines the proxy tunnels nothing and they are skipped.
 */
import type { ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type Server } from 'node:http'
import { type AddressInfo, connect, type Socket } from 'node:net'
import express from 'express'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { type AccessEntry, createProxyServer, type ProxyServerOptions } from '../src/cli/proxy/server.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotency } from '../src/http/express/index.js'
import type { EngineOptions } from '../src/http/types.js'
import { operatorPage } from '../src/observability/operator-page.js'
import { startProxy } from './helpers/proxy-process.js'

const canTunnel = typeof (createServer() as { shouldUpgradeCallback?: unknown }).shouldUpgradeCallback === 'function'
const WS_HEADERS =
  'Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n'
const BODY = '{"amount":100}'

/** An HTTP server that keeps every byte it is sent, and each request it parsed. */
class LoggingServer {
  bytes = ''
  readonly requests: Array<{ method: string; url: string; headers: IncomingMessage['headers'] }> = []
  readonly runs = new Map<string, number>()
  /** Upgraded sockets, which the server no longer tracks: destroyed by stop(). */
  readonly upgraded = new Set<Socket>()
  readonly server: Server
  port = 0

  /** `upgrades`: answer `101` to WebSocket upgrades and echo what follows; else a plain API that ignores `Upgrade`. */
  constructor(upgrades = false) {
    this.server = createServer((req, res) => {
      this.requests.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers })
      req.resume()
      req.on('end', () => {
        const caller = `${req.headers.cookie ?? ''}|${req.headers['x-api-key'] ?? ''}|${req.headers['idempotency-key'] ?? ''}`
        this.runs.set(caller, (this.runs.get(caller) ?? 0) + 1)
        res.writeHead(req.method === 'GET' ? 200 : 201, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ caller, run: this.runs.get(caller) }))
      })
    })
    this.server.on('connection', (socket: Socket) => {
      socket.on('data', (chunk: Buffer) => {
        this.bytes += chunk.toString('latin1')
      })
    })
    if (upgrades) {
      this.server.on('upgrade', (req: IncomingMessage, socket: Socket) => {
        this.requests.push({ method: `UPGRADE ${req.method}`, url: req.url ?? '', headers: req.headers })
        this.upgraded.add(socket)
        socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n')
        socket.on('data', (chunk: Buffer) => socket.write(chunk))
        socket.on('error', () => {})
      })
    }
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve))
    this.port = (this.server.address() as AddressInfo).port
    return this
  }

  reset(): void {
    this.bytes = ''
    this.requests.length = 0
  }

  async stop(): Promise<void> {
    for (const socket of this.upgraded) socket.destroy()
    this.server.closeAllConnections()
    await new Promise((resolve) => this.server.close(resolve))
  }
}

/** A raw connection: what was written to it, and everything that came back. */
function open(port: number): { socket: Socket; received: () => string; closed: Promise<void>; until: (text: string) => Promise<void> } {
  const socket = connect(port, '127.0.0.1')
  socket.setEncoding('latin1')
  let received = ''
  socket.on('data', (chunk: string) => {
    received += chunk
  })
  socket.on('error', () => {})
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()))
  const until = async (text: string) => {
    for (let i = 0; i < 300 && !received.includes(text) && !socket.destroyed; i++) await sleep(10)
  }
  return { socket, received: () => received, closed, until }
}

/** Sends `bytes` on a new connection; resolves with what came back once it closed, or nothing more came for `quietMs`. */
async function exchange(port: number, bytes: string, quietMs = 300): Promise<string> {
  const conn = open(port)
  conn.socket.write(bytes, 'latin1')
  let seen = -1
  for (let i = 0; i < 100; i++) {
    const done = await Promise.race([conn.closed.then(() => true), sleep(quietMs).then(() => false)])
    if (done || (conn.received().length > 0 && conn.received().length === seen)) break
    seen = conn.received().length
  }
  conn.socket.destroy()
  return conn.received()
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

function statusOf(answer: string): number {
  return Number(/^HTTP\/1\.1 (\d{3}) /.exec(answer)?.[1] ?? 0)
}

function post(path: string, key: string, headers: string[] = [], body = BODY): string {
  return [
    `POST ${path} HTTP/1.1`,
    'Host: 127.0.0.1',
    'Content-Type: application/json',
    `Idempotency-Key: ${key}`,
    ...headers,
    `Content-Length: ${Buffer.byteLength(body)}`,
    'Connection: close',
    '',
    body,
  ].join('\r\n')
}

const upstream = new LoggingServer()
const sockets = new LoggingServer(true)
const elsewhere = new LoggingServer()
const closers: Array<() => Promise<void>> = []

beforeAll(async () => {
  await Promise.all([upstream.start(), sockets.start(), elsewhere.start()])
})

afterAll(async () => {
  for (const close of closers.splice(0)) await close()
  await Promise.all([upstream.stop(), sockets.stop(), elsewhere.stop()])
})

beforeEach(() => {
  upstream.reset()
  sockets.reset()
  elsewhere.reset()
})

/** The proxy in this process on a memory store; its upstream is the logging server under `/v1` unless given. */
async function proxy(options: Partial<ProxyServerOptions> = {}): Promise<number> {
  const server = createProxyServer({
    upstream: `http://127.0.0.1:${upstream.port}/v1`,
    ledger: new Ledger({ store: new MemoryStore() }),
    scopeSecret: 'test-secret',
    log: () => {},
    ...options,
  })
  await new Promise<void>((resolve) => server.server.listen(0, '127.0.0.1', resolve))
  closers.push(async () => {
    await server.drain(100)
  })
  return (server.server.address() as AddressInfo).port
}

/** An Express app with the idempotency middleware in front of a handler that answers like the logging upstream. */
async function expressApp(options: Partial<EngineOptions<unknown>> = {}): Promise<{ port: number; runs: () => number }> {
  const app = express()
  let runs = 0
  app.use(express.json())
  app.use(idempotency({ ledger: new Ledger({ store: new MemoryStore() }), scopeSecret: 'test-secret', ...options }))
  app.post(/.*/, (req, res) => {
    runs++
    res.status(201).json({ caller: `${req.headers.cookie ?? ''}|${req.headers['x-api-key'] ?? ''}`, run: runs })
  })
  const server = app.listen(0, '127.0.0.1')
  await new Promise<void>((resolve) => server.once('listening', resolve))
  closers.push(async () => {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
  })
  return { port: (server.address() as AddressInfo).port, runs: () => runs }
}

/** Framing attacks (RFC 9112 §6, §11.2) that must be refused before anything reaches the application. */
const SMUGGLING: Record<string, string> = {
  'CL.TE': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-clte\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG`,
  'TE.CL': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-tecl\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n`,
  'duplicate Content-Length': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-dup\r\nContent-Length: 14\r\nContent-Length: 3\r\n\r\n${BODY}`,
  'signed Content-Length': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-sign\r\nContent-Length: +14\r\n\r\n${BODY}`,
  'obfuscated Transfer-Encoding (space before colon)': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-te1\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n`,
  'chunked then identity': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-te2\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n`,
  'obs-fold': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-fold\r\nX-Note: a\r\n b\r\nContent-Length: 14\r\n\r\n${BODY}`,
  'bare LF': `POST /charges HTTP/1.1\nHost: x\nIdempotency-Key: k-lf\nContent-Length: 14\n\n${BODY}`,
  'bad chunk size': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-chunk\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n${BODY}\r\n0\r\n\r\n`,
  'chunk size overflow': `POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-over\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n${BODY}\r\n0\r\n\r\n`,
}

describe('request smuggling', () => {
  for (const [name, bytes] of Object.entries(SMUGGLING)) {
    it(`the proxy refuses ${name} with nothing sent upstream`, async () => {
      const port = await proxy()
      const answer = await exchange(port, bytes)
      expect(statusOf(answer)).toBe(400)
      await sleep(50)
      expect(upstream.bytes).toBe('')
    })

    it(`the Express middleware refuses ${name} without running the handler`, async () => {
      const app = await expressApp()
      const answer = await exchange(app.port, bytes)
      expect(statusOf(answer)).toBe(400)
      expect(app.runs()).toBe(0)
    })
  }
})

describe('targets and other hosts', () => {
  it('sends an absolute-form request to the upstream, never to the host it names', async () => {
    const port = await proxy()
    const answer = await exchange(
      port,
      `GET http://127.0.0.1:${elsewhere.port}/x HTTP/1.1\r\nHost: 127.0.0.1:${elsewhere.port}\r\nConnection: close\r\n\r\n`,
    )
    expect(statusOf(answer)).toBe(200)
    expect(elsewhere.bytes).toBe('')
    expect(upstream.requests.map((r) => `${r.url} ${r.headers.host}`)).toEqual([`/v1/x 127.0.0.1:${upstream.port}`])
  })

  it("rewrites a foreign Host to the upstream's", async () => {
    const port = await proxy()
    await exchange(port, `GET /x HTTP/1.1\r\nHost: 127.0.0.1:${elsewhere.port}\r\nConnection: close\r\n\r\n`)
    expect(elsewhere.bytes).toBe('')
    expect(upstream.requests[0]?.headers.host).toBe(`127.0.0.1:${upstream.port}`)
  })

  it('opens no tunnel for CONNECT', async () => {
    const port = await proxy()
    const answer = await exchange(
      port,
      `CONNECT 127.0.0.1:${elsewhere.port} HTTP/1.1\r\nHost: 127.0.0.1:${elsewhere.port}\r\n\r\nGET / HTTP/1.1\r\n\r\n`,
    )
    expect(answer).not.toMatch(/^HTTP\/1\.1 200 /)
    await sleep(50)
    expect(elsewhere.bytes).toBe('')
    expect(upstream.bytes).toBe('')
  })

  for (const target of ['http://evil.example:99999/x', 'http://[127.0.0.1:3999/x']) {
    it(`answers 400 to the absolute-form target ${target}, which no URL parser reads, and sends nothing upstream`, async () => {
      const port = await proxy()
      const answer = await exchange(port, `POST ${target} HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\nConnection: close\r\n\r\n${BODY}`)
      expect(statusOf(answer)).toBe(400)
      expect(answer).toMatch(/#bad-target/)
      expect(upstream.bytes).toBe('')
    })
  }

  for (const path of [
    '/../internal/admin',
    '/charges/../../internal/admin',
    '/%2e%2e/internal/admin',
    '/.%2E/internal',
    '/..%2finternal',
  ]) {
    it(`answers 400 to ${path}, which would leave the upstream's path prefix, and sends nothing upstream`, async () => {
      const port = await proxy()
      for (const request of [
        `GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`,
        post(path, randomUUID()),
        `GET ${path} HTTP/1.1\r\nHost: x\r\n${WS_HEADERS}\r\n`,
      ]) {
        const answer = await exchange(port, request)
        expect(statusOf(answer)).toBe(400)
      }
      expect(upstream.bytes).toBe('')
      expect(sockets.bytes).toBe('')
    })
  }

  it('forwards a path whose dots are not segments of their own (/v1/a..b/.well-known)', async () => {
    const port = await proxy()
    expect(statusOf(await exchange(port, 'GET /a..b/.well-known/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'))).toBe(200)
    expect(upstream.requests[0]?.url).toBe('/v1/a..b/.well-known/x')
  })

  it('drops header names with underscores that stand for framing and forwarding headers', async () => {
    const port = await proxy()
    const answer = await exchange(
      port,
      post('/charges', randomUUID(), ['Transfer_Encoding: chunked', 'Content_Length: 99', 'X_Forwarded_For: 6.6.6.6', 'X_Custom: kept']),
    )
    expect(statusOf(answer)).toBe(201)
    expect(upstream.bytes).not.toMatch(/transfer_encoding|content_length|x_forwarded_for/i)
    expect(upstream.requests[0]?.headers.x_custom).toBe('kept')
  })

  it('answers 431 to headers larger than Node allows, with nothing sent upstream', async () => {
    const port = await proxy()
    const answer = await exchange(port, `GET /x HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`)
    expect(statusOf(answer)).toBe(431)
    expect(upstream.bytes).toBe('')
  })
})

describe.runIf(canTunnel)('WebSocket upgrades', () => {
  it('joins nothing when the upstream answers without 101: the bytes after the upgrade never reach it', async () => {
    const port = await proxy({ requireKey: true })
    const smuggled = `POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n${BODY}`
    const conn = open(port)
    conn.socket.write(`GET /feed HTTP/1.1\r\nHost: x\r\n${WS_HEADERS}\r\n${smuggled}`)
    await conn.until('\r\n\r\n')
    // Sent again once the answer came: still nothing may reach the upstream's HTTP parser.
    if (!conn.socket.destroyed) conn.socket.write(smuggled)
    await Promise.race([conn.closed, sleep(1_000)])
    await sleep(100)
    expect(upstream.requests.map((r) => `${r.method} ${r.url}`)).toEqual(['GET /v1/feed'])
    expect(upstream.bytes).not.toContain('POST')
    expect(statusOf(conn.received())).toBe(200)
    expect(conn.received()).toMatch(/\r\nconnection: close\r\n/i)
    expect(conn.socket.destroyed).toBe(true)
    conn.socket.destroy()
  })

  it("sends the upgrade with the upstream's Host, the path prefix and X-Forwarded-For, and logs it", async () => {
    const access: AccessEntry[] = []
    const port = await proxy({ upstream: `http://127.0.0.1:${sockets.port}/v1`, onAccess: (entry) => access.push(entry) })
    const conn = open(port)
    conn.socket.write(`GET /socket HTTP/1.1\r\nHost: attacker.test\r\nX-Forwarded-For: 6.6.6.6\r\n${WS_HEADERS}\r\n`)
    await conn.until('\r\n\r\n')
    expect(statusOf(conn.received())).toBe(101)
    conn.socket.write('ping')
    await conn.until('ping')
    expect(conn.received().endsWith('ping')).toBe(true)
    const [seen] = sockets.requests
    expect(seen?.url).toBe('/v1/socket')
    expect(seen?.headers.host).toBe(`127.0.0.1:${sockets.port}`)
    expect(seen?.headers['x-forwarded-for']).toBe('6.6.6.6, 127.0.0.1')
    expect(seen?.headers['x-forwarded-host']).toBe('attacker.test')
    expect(access).toEqual([expect.objectContaining({ method: 'GET', path: '/socket', status: 101, upstreamStatus: 101 })])
    conn.socket.destroy()
  })

  it('keeps tunnels out of --max-connections, caps them with their own limit, and closes idle ones', async () => {
    const port = await proxy({
      upstream: `http://127.0.0.1:${sockets.port}`,
      maxConnections: 2,
      maxTunnels: 2,
      tunnelIdleTimeoutMs: 600,
    })
    const tunnels = [open(port), open(port)]
    for (const conn of tunnels) {
      conn.socket.write(`GET /socket HTTP/1.1\r\nHost: x\r\n${WS_HEADERS}\r\n`)
      await conn.until('\r\n\r\n')
      expect(statusOf(conn.received())).toBe(101)
    }
    // Two tunnels open, --max-connections 2: plain clients are still served.
    for (let i = 0; i < 3; i++) expect(statusOf(await exchange(port, 'GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'))).toBe(200)
    const third = await exchange(port, `GET /socket HTTP/1.1\r\nHost: x\r\n${WS_HEADERS}\r\n`)
    expect(statusOf(third)).toBe(503)
    expect(third).toMatch(/#too-many-tunnels/)
    // A tunnel that carries bytes stays; one idle past the timeout is closed.
    for (let i = 0; i < 5; i++) {
      tunnels[0]?.socket.write('ping')
      await sleep(200)
    }
    expect(tunnels[0]?.socket.destroyed).toBe(false)
    expect(tunnels[1]?.socket.destroyed).toBe(true)
    for (const conn of tunnels) conn.socket.destroy()
  })
})

/** Two callers' requests, and who got what: for the proxy and the Express middleware alike. */
async function twoCallers(port: number, first: string[], second: string[], key = randomUUID()) {
  const a = await exchange(port, post('/charges', key, first))
  const b = await exchange(port, post('/charges', key, second))
  return { a, b, bodyOf: (answer: string) => JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as { caller: string } }
}

/** Each front end under test: its port, and how many requests reached the application behind it. */
const targets: Record<string, (options: Partial<ProxyServerOptions>) => Promise<{ port: number; runs: () => number }>> = {
  proxy: async (options) => ({ port: await proxy(options), runs: () => upstream.requests.length }),
  express: (options) => expressApp(options.scopeCredentials ? { credentials: options.scopeCredentials } : {}),
}

for (const [name, start] of Object.entries(targets)) {
  describe(`caller identity (${name})`, () => {
    it('refuses (500 invalid-option) a keyed request that authenticates by cookie when no credential is configured', async () => {
      const { port, runs } = await start({})
      const answer = await exchange(port, post('/charges', randomUUID(), ['Cookie: session=alice']))
      expect(statusOf(answer)).toBe(500)
      expect(answer).toMatch(/#invalid-option/)
      expect(runs()).toBe(0)
    })

    it('refuses a keyed request that authenticates by X-Api-Key when no credential is configured', async () => {
      const { port, runs } = await start({})
      expect(statusOf(await exchange(port, post('/charges', randomUUID(), ['X-Api-Key: key-of-alice'])))).toBe(500)
      expect(runs()).toBe(0)
    })

    it('keeps two cookie users apart: bob never gets alice’s answer', async () => {
      const { port } = await start({ scopeCredentials: ['cookie:session'] })
      const { a, b, bodyOf } = await twoCallers(port, ['Cookie: theme=dark; session=alice'], ['Cookie: session=bob; theme=dark'])
      expect(bodyOf(a).caller).toMatch(/session=alice/)
      expect(b).not.toMatch(/idempotent-replayed/i)
      expect(bodyOf(b).caller).toMatch(/session=bob/)
    })

    it('keeps two API-key users apart', async () => {
      const { port } = await start({ scopeCredentials: ['header:x-api-key'] })
      const { b, bodyOf } = await twoCallers(port, ['X-Api-Key: key-of-alice'], ['X-Api-Key: key-of-bob'])
      expect(b).not.toMatch(/idempotent-replayed/i)
      expect(bodyOf(b).caller).toContain('key-of-bob')
    })

    it("cannot be pre-empted: mallory sending the victim's key first does not hand the victim mallory's answer", async () => {
      const { port } = await start({ scopeCredentials: ['cookie:session', 'header:x-api-key'] })
      const key = randomUUID()
      await exchange(port, post('/charges', key, ['Cookie: session=mallory']))
      const victim = await exchange(port, post('/charges', key, ['Cookie: session=victim']))
      expect(statusOf(victim)).toBe(201)
      expect(victim).not.toMatch(/idempotent-replayed/i)
      expect(victim).toContain('session=victim')
      // And the victim's own retry is a replay of the victim's run.
      expect(await exchange(port, post('/charges', key, ['Cookie: session=victim']))).toMatch(/idempotent-replayed: true/i)
    })

    it('replays to the same caller when only another cookie changed', async () => {
      const { port } = await start({ scopeCredentials: ['cookie:session'] })
      const { b } = await twoCallers(port, ['Cookie: session=alice; _ga=1'], ['Cookie: _ga=2; session=alice'])
      expect(b).toMatch(/idempotent-replayed: true/i)
    })
  })
}

describe('idemkey proxy --scope-credentials', () => {
  const children: ChildProcess[] = []
  afterAll(() => {
    for (const child of children) child.kill('SIGKILL')
  })
  const start = (args: string[]) =>
    startProxy(['--upstream', `http://127.0.0.1:${upstream.port}`, '--store', 'memory:', ...args], children, {
      env: { IDEMKEY_SCOPE_SECRET: 'test-secret' },
    })

  it('keeps cookie users apart with the flag, and without it refuses them and logs what to set', async () => {
    const named = await start(['--scope-credentials', 'cookie:session'])
    const { b } = await twoCallers(named.port, ['Cookie: session=alice'], ['Cookie: session=bob'])
    expect(b).not.toMatch(/idempotent-replayed/i)
    const plain = await start([])
    expect(statusOf(await exchange(plain.port, post('/charges', randomUUID(), ['Cookie: session=alice'])))).toBe(500)
    for (let i = 0; i < 50 && !/--scope-credentials/.test(plain.stderr()); i++) await sleep(50)
    expect(plain.stderr()).toMatch(/carries a Cookie header but no Authorization.*--scope-credentials cookie:session/)
  })

  it('refuses to start with a credential it cannot read', async () => {
    await expect(start(['--scope-credentials', 'session'])).rejects.toThrow(/expected 'authorization', 'cookie:<name>'/)
  })
})

describe('the operator page', () => {
  async function page(options: { allowedHosts?: string[]; token?: string } = {}): Promise<number> {
    const served = operatorPage({ store: new MemoryStore(), ...options })
    const server = createServer((req, res) => served.handler(req, res))
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    closers.push(async () => {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    })
    return (server.address() as AddressInfo).port
  }
  const get = (port: number, host: string, path = '/api/record?key=k&scope=s&bodies=1', extra = '') =>
    exchange(port, `GET ${path} HTTP/1.1\r\nHost: ${host}\r\n${extra}Connection: close\r\n\r\n`)

  it('refuses a DNS-rebinding request (Host: attacker.test:9090 from loopback) with 421', async () => {
    const port = await page()
    for (const path of ['/', '/api/summary', '/api/record?key=k&scope=s&bodies=1']) {
      const answer = await get(port, 'attacker.test:9090', path)
      expect(statusOf(answer)).toBe(421)
    }
  })

  it('answers loopback names and addresses, and the hosts it is told to', async () => {
    const port = await page({ allowedHosts: ['ops.internal'] })
    for (const host of [
      `127.0.0.1:${port}`,
      `localhost:${port}`,
      'admin.localhost',
      `[::1]:${port}`,
      'ops.internal:9090',
      'OPS.internal',
    ]) {
      expect(statusOf(await get(port, host))).toBe(404)
    }
    expect(statusOf(await get(port, 'ops.internal.attacker.test'))).toBe(421)
  })

  it('asks for its token when one is set, whatever the Host', async () => {
    const port = await page({ token: 'a-token-of-sixteen-chars' })
    expect(statusOf(await get(port, `127.0.0.1:${port}`))).toBe(401)
    expect(statusOf(await get(port, `127.0.0.1:${port}`, undefined, 'Authorization: Bearer a-token-of-sixteen-chars\r\n'))).toBe(404)
  })
})
