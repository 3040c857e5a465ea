/**
 * `idemkey proxy` under resource attacks (issue 12, item 5): timeouts, the connection cap, the global
 * byte budget, streaming of large responses, and what clients and the log see. The attacks run the
 * built CLI as a child process and read its peak memory from /proc; the rest runs the proxy in-process.
 */
import type { ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, readFileSync } from 'node:fs'
import { createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from 'node:http'
import { type AddressInfo, connect, type Socket } from 'node:net'
import { join } from 'node:path'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { createProxyServer, type ProxyServer, type ProxyServerOptions } from '../src/cli/proxy/server.js'
import { Ledger } from '../src/core/ledger.js'
import { eventually } from './helpers/eventually.js'
import { type ProxyProcess, startProxy as startHelper } from './helpers/proxy-process.js'

const MiB = 1024 * 1024
const CHUNK = Buffer.alloc(64 * 1024, 'x')

/** The API behind the proxy: counts runs per key; `/big?mb=N` streams N MiB without holding them. */
class Upstream {
  readonly runs = new Map<string, number>()
  server: Server
  port = 0

  constructor() {
    this.server = createServer((req, res) => {
      let received = 0
      req.on('data', (c: Buffer) => {
        received += c.byteLength
      })
      req.on('end', () => {
        const url = new URL(req.url ?? '/', 'http://x')
        const key = String(req.headers['idempotency-key'] ?? '')
        this.runs.set(key, (this.runs.get(key) ?? 0) + 1)
        if (url.pathname === '/big') {
          const total = Number(url.searchParams.get('mb') ?? 1) * MiB
          const headers: Record<string, string> = { 'content-type': 'application/octet-stream' }
          if (url.searchParams.get('length') === '1') headers['content-length'] = String(total)
          res.writeHead(200, headers)
          streamBytes(res, total)
          return
        }
        if (url.pathname === '/sized') {
          const size = Number(url.searchParams.get('bytes') ?? 0)
          const body = Buffer.alloc(size)
          for (let i = 0; i < size; i++) body[i] = (i * 31 + 7) & 0xff
          res.writeHead(201, { 'content-type': 'application/octet-stream', 'content-length': String(size) })
          res.end(body)
          return
        }
        res.writeHead(201, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ run: this.runs.get(key), received }))
      })
    })
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', () => resolve()))
    this.port = (this.server.address() as AddressInfo).port
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections()
    await new Promise((resolve) => this.server.close(resolve))
  }
}

/** Writes `total` bytes with backpressure, reusing one chunk: the test never holds the body. */
function streamBytes(res: NodeJS.WritableStream & { destroyed?: boolean }, total: number): void {
  let left = total
  const pump = () => {
    while (left > 0) {
      const n = Math.min(left, CHUNK.byteLength)
      left -= n
      const ok = res.write(n === CHUNK.byteLength ? CHUNK : CHUNK.subarray(0, n))
      if (left === 0) return void res.end()
      if (!ok) return void res.once('drain', pump)
    }
  }
  res.once('close', () => {
    left = 0
  })
  pump()
}

type ChildProxy = ProxyProcess

const ROOT = join(import.meta.dirname, '..')
const children: ChildProcess[] = []

/** Starts the built `idemkey proxy` on a memory store (optionally under an open-file limit). */
function startProxy(args: string[], openFiles?: number): Promise<ChildProxy> {
  return startHelper(['--store', 'memory:', ...args], children, { openFiles })
}

async function stopProxy(proxy: ChildProxy): Promise<void> {
  if (proxy.child.exitCode !== null || proxy.child.signalCode !== null) return
  const exited = new Promise((resolve) => proxy.child.once('exit', resolve))
  proxy.child.kill('SIGKILL')
  await exited
}

/**
 * The peak-RSS growth allowed under the stalled uploads below: 100 MiB (the 64 MiB buffer budget and
 * the runtime's own slack) plus what the Node.js line itself adds for the same work. Measured on the
 * 2-core CI machine (baseline -> peak): Node 22.23 +75, Node 24.21 +98..+106, Node 26.10 +115 MiB; on
 * 24 and 26 the growth rises with the number of concurrent connections (200 stalled: +91, 800: +130)
 * but not with the bytes offered (400 MiB): the proxy still holds no body whole. The allowance is the
 * line's measured excess, not a blanket loosening; a new line gets its own row after being measured.
 * (The streamed responses are bounded differently, by what holding a body would cost: see that test.)
 */
const LINE_ALLOWANCE_MiB: Record<number, number> = { 22: 0, 24: 60, 26: 60 }
const RSS_GROWTH_BOUND_MiB = 100 + (LINE_ALLOWANCE_MiB[Number(process.versions.node.split('.')[0])] ?? 40)

/** A field of /proc/<pid>/status in MiB: VmHWM is the peak resident set since the process started. */
function memoryMiB(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  const match = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  if (!match) throw new Error(`no ${field} in /proc/${pid}/status`)
  return Number(match[1]) / 1024
}

/** Warms the proxy up (one covered and one uncovered request), then reads its peak RSS as the baseline. */
async function baselineMiB(proxy: ChildProxy): Promise<number> {
  for (let i = 0; i < 3; i++) {
    expect((await post(proxy.port, '/sink', randomUUID(), 'warm-up')).status).toBe(201)
    await (await fetch(`http://127.0.0.1:${proxy.port}/sink`)).text()
  }
  return memoryMiB(proxy.child.pid as number, 'VmHWM')
}

async function post(port: number, path: string, key: string | undefined, body = '{"amount":100}') {
  const response = await fetch(`http://127.0.0.1:${port}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }) },
    body,
  })
  return { status: response.status, headers: response.headers, body: Buffer.from(await response.arrayBuffer()) }
}

/** A request on a connection of its own (never a pooled one), as a new client would open. */
function freshRequest(port: number, method: string, path: string, key?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { 'content-type': 'application/json' }
    if (key !== undefined) headers['idempotency-key'] = key
    const req = httpRequest({ host: '127.0.0.1', port, method, path, headers, agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c: string) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on('error', reject)
    req.end(method === 'GET' ? undefined : '{"amount":1}')
  })
}

interface RawAnswer {
  /** 0 when no status line came before the socket closed (or the guard ran out). */
  status: number
  head: string
  body: string
  /** The proxy closed the connection. */
  closed: boolean
  ms: number
}

/**
 * A raw client: sends `head` and `sent` bytes of body, then stalls (never sends the rest), and
 * collects whatever comes back until the proxy closes the connection or `guardMs` passes.
 */
function stalledRequest(port: number, head: string, sent: number, guardMs: number): Promise<RawAnswer> {
  return new Promise((resolve) => {
    const started = Date.now()
    const chunks: Buffer[] = []
    const socket = connect(port, '127.0.0.1')
    let done = false
    const finish = (closed: boolean) => {
      if (done) return
      done = true
      clearTimeout(guard)
      socket.destroy()
      const text = Buffer.concat(chunks).toString('latin1')
      const [rawHead = '', body = ''] = text.split('\r\n\r\n', 2)
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(rawHead)?.[1] ?? 0)
      resolve({ status, head: rawHead.toLowerCase(), body, closed, ms: Date.now() - started })
    }
    const guard = setTimeout(() => finish(false), guardMs)
    socket.on('data', (c: Buffer) => chunks.push(c))
    socket.on('error', () => finish(true))
    socket.on('close', () => finish(true))
    socket.on('end', () => finish(true))
    socket.write(head)
    if (sent > 0) socket.write(Buffer.alloc(sent, 'y'))
  })
}

function uploadHead(key: string, declared: number, path = '/sink'): string {
  return `POST ${path} HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/octet-stream\r\ncontent-length: ${declared}\r\nidempotency-key: ${key}\r\n\r\n`
}

/** POSTs and counts the response bytes as they stream, without keeping them. */
function download(
  port: number,
  path: string,
  key: string,
  abortAfter?: number,
): Promise<{ status: number; bytes: number; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: '127.0.0.1', port, method: 'POST', path, headers: { 'idempotency-key': key, 'content-type': 'application/json' } },
      (res) => {
        let bytes = 0
        res.on('data', (c: Buffer) => {
          bytes += c.byteLength
          if (abortAfter !== undefined && bytes >= abortAfter) {
            req.destroy()
            resolve({ status: res.statusCode ?? 0, bytes, headers: res.headers })
          }
        })
        res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes, headers: res.headers }))
        res.on('error', reject)
      },
    )
    req.on('error', (error) => (abortAfter === undefined ? reject(error) : undefined))
    req.end('{"amount":1}')
  })
}

function openSockets(port: number, count: number, partialHeaders: boolean): Promise<Socket[]> {
  return Promise.all(
    Array.from(
      { length: count },
      () =>
        new Promise<Socket>((resolve) => {
          const socket = connect(port, '127.0.0.1')
          socket.on('error', () => {})
          socket.once('connect', () => {
            if (partialHeaders) socket.write('POST /sink HTTP/1.1\r\nhost: proxy\r\n')
            resolve(socket)
          })
          socket.once('close', () => resolve(socket))
        }),
    ),
  )
}

const until = (check: () => boolean, ms: number) => eventually(check, 'the condition', ms, 20)

const upstream = new Upstream()

beforeAll(async () => {
  if (!existsSync(join(ROOT, 'dist/cli/main.js'))) throw new Error('dist/cli/main.js is missing: run `npm run build` first.')
  await upstream.start()
})
afterAll(async () => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  await upstream.stop()
})

describe('idemkey proxy (built CLI) under resource attacks: peak RSS from /proc/<pid>/status', () => {
  it("400 stalled 1 MiB uploads get 408 or 503 and the connection closed; peak RSS stays under baseline + 100 MiB (+ the line's measured allowance)", async () => {
    const proxy = await startProxy(['--upstream', `http://127.0.0.1:${upstream.port}`, '--body-timeout', '2s'])
    const baseline = await baselineMiB(proxy)
    const keys = Array.from({ length: 400 }, () => `stall-${randomUUID()}`)
    const answers = await Promise.all(keys.map((key) => stalledRequest(proxy.port, uploadHead(key, MiB), MiB / 2, 25_000)))
    const peak = memoryMiB(proxy.child.pid as number, 'VmHWM')
    const slowest = Math.max(...answers.map((a) => a.ms))
    console.info(
      `stalled uploads: baseline ${baseline.toFixed(1)} MiB, peak ${peak.toFixed(1)} MiB (+${(peak - baseline).toFixed(1)}), all answered in ${slowest} ms`,
    )

    const statuses = answers.map((a) => a.status)
    expect(statuses.filter((s) => s !== 408 && s !== 503)).toEqual([])
    expect(statuses).toContain(408) // the first ones fit the default 64 MiB budget and time out
    expect(statuses).toContain(503) // the rest are refused up front
    expect(answers.every((a) => a.closed && a.head.includes('connection: close'))).toBe(true)
    expect(slowest).toBeLessThan(15_000) // a 2 s deadline, not Node's 300 s (slack for a loaded 2-core box)
    const refused = answers.find((a) => a.status === 503) as RawAnswer
    expect(refused.head).toContain('retry-after:')
    expect(refused.head).toContain('application/problem+json')
    expect(keys.some((key) => upstream.runs.has(key))).toBe(false)
    expect(peak - baseline).toBeLessThan(RSS_GROWTH_BOUND_MiB)
    await stopProxy(proxy)
  })

  it('4 covered 256 MiB responses stream through whole with peak RSS under one body held whole, 4 x 512 MiB raise that peak by less than 128 MiB, and a retry replays without running again', async () => {
    const proxy = await startProxy(['--upstream', `http://127.0.0.1:${upstream.port}`])
    const pid = proxy.child.pid as number
    const baseline = await baselineMiB(proxy)
    const streamFour = async (mb: number) => {
      const keys = Array.from({ length: 4 }, () => `big-${randomUUID()}`)
      const results = await Promise.all(keys.map((key, i) => download(proxy.port, `/big?mb=${mb}&length=${i % 2}`, key)))
      expect(results.map((r) => [r.status, r.bytes])).toEqual(keys.map(() => [200, mb * MiB]))
      return { keys, peak: memoryMiB(pid, 'VmHWM') }
    }
    const first = await streamFour(256)
    const second = await streamFour(512)
    console.info(
      `4 x 256 MiB responses: baseline ${baseline.toFixed(1)} MiB, peak ${first.peak.toFixed(1)} MiB (+${(first.peak - baseline).toFixed(1)}); then 4 x 512 MiB: peak ${second.peak.toFixed(1)} MiB (+${(second.peak - first.peak).toFixed(1)} more)`,
    )

    // What the growth is: garbage the collector lets pile up while four streams run, a plateau reached
    // by about 256 MiB each (measured on this 2-core host, Node 24, 4 streams of 16/64/256/512 MiB:
    // +41/+85/+126/+126 and +42/+97/+128/+149; CI once +166 for 256). It does not grow with the bytes:
    // doubling every body adds tens of MiB (+15 here, +44 in a CI run under load) where holding them would
    // add 2 GiB. One body held whole would alone add 256 MiB, four of them 1 GiB.
    expect(first.peak - baseline).toBeLessThan(256)
    expect(second.peak - first.peak).toBeLessThan(128)
    for (const [i, key] of first.keys.entries()) {
      const replay = await download(proxy.port, `/big?mb=256&length=${i % 2}`, key)
      expect(replay.status).toBe(200)
      expect(replay.headers['idempotent-replayed']).toBe('true')
      expect(replay.headers['idempotent-body-omitted']).toBe(String(256 * MiB))
      expect(replay.bytes).toBeLessThan(2_048) // a body-omitted problem, not the 256 MiB
      expect(upstream.runs.get(key)).toBe(1)
    }
    await stopProxy(proxy)
  })

  it('1,100 idle and half-sent connections under a 1024 open-file limit do not starve a legitimate covered request', async () => {
    const proxy = await startProxy(['--upstream', `http://127.0.0.1:${upstream.port}`], 1024)
    const baseline = await baselineMiB(proxy)
    const idle = [...(await openSockets(proxy.port, 550, false)), ...(await openSockets(proxy.port, 550, true))]
    try {
      const started = Date.now()
      const key = randomUUID()
      const served = await Promise.race([
        freshRequest(proxy.port, 'POST', '/sink', key),
        new Promise<{ status: number }>((resolve) => setTimeout(() => resolve({ status: 0 }), 3_000)),
      ]).catch(() => ({ status: -1 }))
      const ms = Date.now() - started
      const peak = memoryMiB(proxy.child.pid as number, 'VmHWM')
      console.info(`1,100 idle sockets: served in ${ms} ms; baseline ${baseline.toFixed(1)} MiB, peak ${peak.toFixed(1)} MiB`)
      expect(served.status).toBe(201)
      expect(upstream.runs.get(key)).toBe(1)
      expect((await freshRequest(proxy.port, 'GET', '/sink')).status).toBe(201) // uncovered traffic too
    } finally {
      for (const socket of idle) socket.destroy()
    }
    await stopProxy(proxy)
  })
})

describe('proxy limits (in-process)', () => {
  const proxies: ProxyServer[] = []
  const lines: string[] = []

  async function inProcess(options: Partial<ProxyServerOptions> = {}): Promise<{ proxy: ProxyServer; port: number }> {
    const proxy = createProxyServer({
      upstream: `http://127.0.0.1:${upstream.port}`,
      ledger: new Ledger({ store: new MemoryStore() }),
      scopeSecret: 'proxy-limits-test',
      log: (line) => lines.push(line),
      ...options,
    })
    proxies.push(proxy)
    await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', () => resolve()))
    return { proxy, port: (proxy.server.address() as AddressInfo).port }
  }
  afterAll(async () => {
    await Promise.all(proxies.map((p) => p.drain(100)))
  })

  it('a covered body that stalls past --body-timeout gets 408 and locks nothing: the retry with the same key runs normally', async () => {
    const { port } = await inProcess({ bodyTimeoutMs: 300 })
    const key = randomUUID()
    const stalled = await stalledRequest(port, uploadHead(key, 1_000), 10, 5_000)
    expect(stalled.status).toBe(408)
    expect(stalled.closed).toBe(true)
    expect(stalled.head).toContain('connection: close')
    expect(stalled.head).toContain('application/problem+json')
    expect(JSON.parse(stalled.body)).toMatchObject({ status: 408, type: expect.stringContaining('#request-timeout') })
    expect(upstream.runs.has(key)).toBe(false)

    const retried = await post(port, '/sink', key, 'x'.repeat(1_000))
    expect(retried.status).toBe(201)
    expect(retried.headers.get('idempotent-replayed')).toBeNull()
    expect(upstream.runs.get(key)).toBe(1)
  })

  it('past --max-buffered a new covered request gets 503 with Retry-After before the ledger is touched', async () => {
    const { proxy, port } = await inProcess({ maxBufferedBytes: MiB, bodyTimeoutMs: 1_000 })
    const hog = stalledRequest(port, uploadHead(randomUUID(), MiB), 1_000, 5_000)
    await until(() => proxy.buffered() >= MiB, 2_000)
    const key = randomUUID()
    const refused = await post(port, '/sink', key)
    expect(refused.status).toBe(503)
    expect(refused.headers.get('retry-after')).toBe('1')
    expect(JSON.parse(refused.body.toString())).toMatchObject({ status: 503, type: expect.stringContaining('#proxy-overloaded') })
    expect(upstream.runs.has(key)).toBe(false)
    expect((await hog).status).toBe(408)
    // Nothing was recorded for the refused request: once the budget is back, the same key runs.
    const retried = await post(port, '/sink', key)
    expect(retried.status).toBe(201)
    expect(retried.headers.get('idempotent-replayed')).toBeNull()
  })

  it('the byte budget returns to zero after successes, body timeouts, refusals, client aborts and streamed responses', async () => {
    // Room for two of the three stalled 1 MiB uploads whatever else is held at the time (< 0.75 MiB).
    const { proxy, port } = await inProcess({ maxBufferedBytes: 2.75 * MiB, bodyTimeoutMs: 400, maxStoredBodyBytes: 64 * 1024 })
    let peak = 0
    const sampler = setInterval(() => {
      peak = Math.max(peak, proxy.buffered())
    }, 5)
    const aborted = new Promise<void>((resolve) => {
      const socket = connect(port, '127.0.0.1', () => {
        socket.write(uploadHead(randomUUID(), 100_000))
        socket.write(Buffer.alloc(50_000))
        setTimeout(() => {
          socket.destroy()
          resolve()
        }, 100)
      })
    })
    const chunkedAbort = new Promise<void>((resolve) => {
      const req = httpRequest(
        { host: '127.0.0.1', port, method: 'POST', path: '/sink', headers: { 'idempotency-key': randomUUID() } },
        () => {},
      )
      req.on('error', () => resolve())
      req.write(Buffer.alloc(30_000))
      setTimeout(() => {
        req.destroy()
        resolve()
      }, 100)
    })
    const outcomes = await Promise.all([
      post(port, '/sink', randomUUID(), 'x'.repeat(200_000)).then((r) => r.status),
      post(port, '/sized?bytes=50000', randomUUID()).then((r) => r.status),
      download(port, '/big?mb=4', randomUUID()).then((r) => r.status),
      download(port, '/big?mb=4', randomUUID(), 100_000).then((r) => r.status),
      stalledRequest(port, uploadHead(randomUUID(), MiB), 500_000, 5_000).then((r) => r.status),
      stalledRequest(port, uploadHead(randomUUID(), MiB), 500_000, 5_000).then((r) => r.status),
      stalledRequest(port, uploadHead(randomUUID(), MiB), 500_000, 5_000).then((r) => r.status),
      aborted.then(() => 0),
      chunkedAbort.then(() => 0),
    ])
    expect(outcomes.slice(0, 4)).toEqual([201, 201, 200, 200])
    expect(outcomes.slice(4, 7).sort()).toEqual([408, 408, 503])
    await until(() => proxy.inFlight() === 0, 10_000)
    clearInterval(sampler)
    expect(peak).toBeGreaterThan(MiB)
    expect(proxy.buffered()).toBe(0)
  })

  it('a response held when the budget runs out streams through and is still stored whole for replays', async () => {
    const { proxy, port } = await inProcess({ maxBufferedBytes: 100_000 })
    const key = randomUUID()
    const first = await post(port, '/sized?bytes=300000', key)
    expect(first.status).toBe(201)
    expect(first.body.byteLength).toBe(300_000)
    const replay = await post(port, '/sized?bytes=300000', key)
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.headers.get('idempotent-body-omitted')).toBeNull()
    expect(replay.body.equals(first.body)).toBe(true)
    expect(upstream.runs.get(key)).toBe(1)
    await until(() => proxy.inFlight() === 0, 2_000)
    expect(proxy.buffered()).toBe(0)
  })

  it('a client that leaves mid-stream still completes the record: the retry replays without running again', async () => {
    const { proxy, port } = await inProcess({ maxStoredBodyBytes: 64 * 1024 })
    const key = randomUUID()
    const left = await download(port, '/big?mb=16', key, 200_000)
    expect(left.status).toBe(200)
    await until(() => proxy.inFlight() === 0, 10_000)
    const replay = await download(port, '/big?mb=16', key)
    expect(replay.status).toBe(200)
    expect(replay.headers['idempotent-replayed']).toBe('true')
    expect(replay.headers['idempotent-body-omitted']).toBe(String(16 * MiB))
    expect(upstream.runs.get(key)).toBe(1)
  })

  it('a client that stops reading a covered response is disconnected after --body-timeout, and the record still completes', async () => {
    const { proxy, port } = await inProcess({ bodyTimeoutMs: 300 })
    const key = randomUUID()
    const reader = connect(port, '127.0.0.1')
    reader.on('error', () => {})
    const body = '{"amount":1}' // what download() sends, so its retry is the same request
    reader.write(
      `POST /big?mb=32 HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nidempotency-key: ${key}\r\n\r\n${body}`,
    )
    reader.pause() // never reads: the proxy's writes back up
    try {
      await until(() => upstream.runs.get(key) === 1, 2_000)
      await until(() => proxy.inFlight() === 0, 10_000)
      expect(proxy.buffered()).toBe(0)
      const replay = await download(port, '/big?mb=32', key)
      expect(replay.headers['idempotent-replayed']).toBe('true')
      expect(replay.headers['idempotent-body-omitted']).toBe(String(32 * MiB))
      expect(upstream.runs.get(key)).toBe(1)
    } finally {
      reader.destroy()
    }
  })

  it('past --max-connections the oldest idle connection makes room for a new one', async () => {
    const { port } = await inProcess({ maxConnections: 20 })
    const idle = await openSockets(port, 40, false)
    try {
      const served = await freshRequest(port, 'POST', '/sink', randomUUID())
      expect(served.status).toBe(201)
      expect(idle.filter((s) => !s.destroyed).length).toBeLessThanOrEqual(20)
    } finally {
      for (const socket of idle) socket.destroy()
    }
  })

  it('a connection that does not finish its headers within --header-timeout is closed', async () => {
    const { port } = await inProcess({ headerTimeoutMs: 300 })
    const answer = await stalledRequest(port, 'POST /sink HTTP/1.1\r\nhost: proxy\r\n', 0, 5_000)
    expect(answer.closed).toBe(true)
    expect(answer.ms).toBeLessThan(2_500)
  })

  it('clients get a generic detail for proxy and upstream errors; the cause goes to the log as one line', async () => {
    const closed = createServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', () => resolve()))
    const deadPort = (closed.address() as AddressInfo).port
    await new Promise((resolve) => closed.close(resolve))
    const { port } = await inProcess({ upstream: `http://127.0.0.1:${deadPort}` })
    lines.length = 0
    const unreachable = await post(port, '/sink', randomUUID())
    expect(unreachable.status).toBe(502)
    const detail = (JSON.parse(unreachable.body.toString()) as { detail: string; type: string }).detail
    expect(detail).not.toMatch(/127\.0\.0\.1|ECONNREFUSED|connect/)
    expect(lines.some((line) => line.includes('ECONNREFUSED') && !line.includes('\n'))).toBe(true)

    const explode = async () => Promise.reject(new Error('driver exploded at 10.9.8.7:5432'))
    const broken = { run: explode, begin: explode, store: new MemoryStore() }
    const { port: brokenPort } = await inProcess({ ledger: broken as unknown as Ledger })
    lines.length = 0
    const failed = await post(brokenPort, '/sink', randomUUID())
    expect(failed.status).toBe(500)
    const problem = JSON.parse(failed.body.toString()) as { detail: string; type: string }
    expect(problem.type).toContain('#proxy-error')
    expect(problem.detail).not.toContain('10.9.8.7')
    expect(lines.some((line) => line.includes('driver exploded at 10.9.8.7:5432'))).toBe(true)
  })
})
