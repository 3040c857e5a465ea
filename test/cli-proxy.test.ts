import type { ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { runNode } from './helpers/cli.js'
import { BIN, type ProxyProcess, startProxy as startHelper } from './helpers/proxy-process.js'

const ROOT = join(import.meta.dirname, '..')

/** The API behind the proxies: counts how often each key ran, and misbehaves on request. */
class Upstream {
  readonly runs = new Map<string, number>()
  readonly seen: IncomingHttpHeaders[] = []
  hang = false
  flaky = new Map<string, number>()
  arrived: ((key: string) => void) | undefined
  server: Server
  port = 0

  constructor() {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = []
      req.on('data', (c: Buffer) => chunks.push(c))
      req.on('end', () => {
        const url = new URL(req.url ?? '/', 'http://x')
        const key = String(req.headers['idempotency-key'] ?? '')
        this.seen.push(req.headers)
        if (url.pathname === '/stream') {
          res.writeHead(200, { 'content-type': 'text/plain', connection: 'close, x-upstream-hop', 'x-upstream-hop': '1' })
          let i = 0
          const tick = setInterval(() => {
            res.write(`chunk-${i}\n`)
            if (++i === 3) {
              clearInterval(tick)
              res.end()
            }
          }, 10)
          return
        }
        if (this.hang && url.pathname !== '/echo') return // never answers: the proxy times out
        this.runs.set(key, (this.runs.get(key) ?? 0) + 1)
        this.arrived?.(key)
        const answer = () => {
          if (url.pathname === '/bad') {
            res.writeHead(400, { 'content-type': 'application/json' })
            return res.end('{"error":"amount must be positive"}')
          }
          if (url.pathname === '/flaky') {
            const left = this.flaky.get(key) ?? 1
            this.flaky.set(key, left - 1)
            if (left > 0) {
              res.writeHead(500, { 'content-type': 'text/plain' })
              return res.end('temporary failure')
            }
          }
          const body = JSON.stringify({
            run: this.runs.get(key),
            path: url.pathname,
            body: Buffer.concat(chunks).toString(),
            headers: req.headers,
          })
          res.writeHead(201, { 'content-type': 'application/json', 'set-cookie': 'session=abc', location: '/charges/1' })
          res.end(body)
        }
        const ms = Number(url.searchParams.get('ms') ?? 0)
        if (ms > 0) setTimeout(answer, ms)
        else answer()
      })
    })
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', () => resolve()))
    this.port = (this.server.address() as AddressInfo).port
  }
}

type Proxy = ProxyProcess

const children: ChildProcess[] = []

/** Starts the built `idemkey proxy` on a free port; resolves once it listens. */
function startProxy(args: string[]): Promise<Proxy> {
  return startHelper(args, children)
}

function post(port: number, path: string, key: string | undefined, body: unknown = { amount: 100 }, headers: Record<string, string> = {}) {
  return fetch(`http://127.0.0.1:${port}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }), ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  })
}

/** A request with headers fetch will not send (Connection, TE, a duplicated Idempotency-Key). */
function raw(
  port: number,
  method: string,
  path: string,
  headers: Array<[string, string]>,
  body = '',
): Promise<{ status: number; headers: IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const grouped: Record<string, string | string[]> = {}
    for (const [name, value] of headers) {
      const prior = grouped[name]
      grouped[name] = prior === undefined ? value : [...(Array.isArray(prior) ? prior : [prior]), value]
    }
    const req = httpRequest({ host: '127.0.0.1', port, method, path, headers: grouped }, (res) => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (text += c))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }))
    })
    req.once('error', reject)
    req.end(body)
  })
}

async function inspect(
  store: string,
  key: string,
): Promise<{ status: string; token: number; attempts: number; leaseState: string; leaseEnded: string | null } | null> {
  const out = await runNode([BIN, 'inspect', key, '--scope', 'public', '--store', store, '--json'])
  return out.code === 0 ? (JSON.parse(out.stdout) as { record: never }).record : null
}

describe('idemkey proxy (built CLI) in front of a test upstream', () => {
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-cli-proxy-'))
  const store = `sqlite:${join(dir, 'proxy.db')}`
  const upstream = new Upstream()
  let proxy: Proxy

  beforeAll(async () => {
    if (!existsSync(join(ROOT, 'dist/cli/main.js'))) throw new Error('dist/cli/main.js is missing: run `npm run build` first.')
    await upstream.start()
    proxy = await startProxy([
      '--upstream',
      `http://127.0.0.1:${upstream.port}`,
      '--store',
      store,
      '--max-body',
      '1kb',
      '--upstream-timeout',
      '500ms',
    ])
  })
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    upstream.server.closeAllConnections()
    await new Promise((resolve) => upstream.server.close(resolve))
    rmSync(dir, { recursive: true, force: true })
  })

  it('runs the first request once and replays it byte for byte with Idempotent-Replayed, without Set-Cookie', async () => {
    const key = randomUUID()
    const first = await post(proxy.port, '/charges', key)
    const firstBody = await first.text()
    expect(first.status).toBe(201)
    expect(first.headers.get('set-cookie')).toBe('session=abc')
    const again = await post(proxy.port, '/charges', key, { amount: 100 })
    expect(again.status).toBe(201)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(again.headers.get('location')).toBe('/charges/1')
    expect(again.headers.get('set-cookie')).toBeNull()
    expect(await again.text()).toBe(firstBody)
    expect(upstream.runs.get(key)).toBe(1)
  })

  it('answers 422 problem+json to a key reused with another body, and does not call the upstream', async () => {
    const key = randomUUID()
    await (await post(proxy.port, '/charges', key, { amount: 100 })).text()
    const reused = await post(proxy.port, '/charges', key, { amount: 999 })
    expect(reused.status).toBe(422)
    expect(reused.headers.get('content-type')).toBe('application/problem+json')
    expect(await reused.json()).toMatchObject({
      status: 422,
      title: expect.any(String),
      detail: expect.any(String),
      type: expect.any(String),
    })
    expect(upstream.runs.get(key)).toBe(1)
  })

  it('runs concurrent duplicates once: the others wait and get the replay', async () => {
    const key = randomUUID()
    const responses = await Promise.all(Array.from({ length: 5 }, () => post(proxy.port, '/charges?ms=300', key)))
    const bodies = await Promise.all(responses.map((r) => r.text()))
    expect(responses.map((r) => r.status)).toEqual([201, 201, 201, 201, 201])
    expect(new Set(bodies).size).toBe(1)
    expect(responses.filter((r) => r.headers.get('idempotent-replayed') === 'true')).toHaveLength(4)
    expect(upstream.runs.get(key)).toBe(1)
  })

  it('passes requests without a key through every time, and rejects malformed keys with 400', async () => {
    const before = upstream.runs.get('') ?? 0
    await (await post(proxy.port, '/charges', undefined)).text()
    await (await post(proxy.port, '/charges', undefined)).text()
    expect(upstream.runs.get('')).toBe(before + 2)
    expect((await post(proxy.port, '/charges', 'x'.repeat(256))).status).toBe(400)
    const twice = await raw(proxy.port, 'POST', '/charges', [
      ['content-type', 'application/json'],
      ['idempotency-key', 'a'],
      ['idempotency-key', 'b'],
    ])
    expect(twice.status).toBe(400)
    expect(twice.headers['content-type']).toBe('application/problem+json')
  })

  it('accepts a structured-field key and treats it like the bare one', async () => {
    const key = `sf-${randomUUID()}`
    await (await post(proxy.port, '/charges', key)).text()
    const quoted = await post(proxy.port, '/charges', `"${key}"`)
    expect(quoted.headers.get('idempotent-replayed')).toBe('true')
  })

  it('stores final 4xx failures and replays them; releases 5xx so the retry runs afresh', async () => {
    const bad = randomUUID()
    expect((await post(proxy.port, '/bad', bad)).status).toBe(400)
    const badAgain = await post(proxy.port, '/bad', bad)
    expect(badAgain.status).toBe(400)
    expect(badAgain.headers.get('idempotent-replayed')).toBe('true')
    expect(upstream.runs.get(bad)).toBe(1)

    const flaky = randomUUID()
    expect((await post(proxy.port, '/flaky', flaky)).status).toBe(500)
    expect((await post(proxy.port, '/flaky', flaky)).status).toBe(201)
    const replay = await post(proxy.port, '/flaky', flaky)
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(upstream.runs.get(flaky)).toBe(2)
  })

  it('answers 413 to a covered body over --max-body without calling the upstream', async () => {
    const key = randomUUID()
    const response = await post(proxy.port, '/charges', key, { pad: 'x'.repeat(2048) })
    expect(response.status).toBe(413)
    expect(upstream.runs.get(key)).toBeUndefined()
  })

  it('streams uncovered requests, strips hop-by-hop headers both ways and adds X-Forwarded-For/-Proto and Via', async () => {
    const streamed = await raw(proxy.port, 'GET', '/stream', [['x-trace', 't1']])
    expect(streamed.body).toBe('chunk-0\nchunk-1\nchunk-2\n')
    expect(streamed.headers['x-upstream-hop']).toBeUndefined()
    expect(streamed.headers.via).toContain('idemkey')
    const sent = upstream.seen.at(-1) as IncomingHttpHeaders
    expect(sent['x-trace']).toBe('t1')

    const echoed = await raw(
      proxy.port,
      'POST',
      '/echo',
      [
        ['content-type', 'application/json'],
        ['connection', 'keep-alive, x-private'],
        ['x-private', 'secret'],
        ['te', 'trailers'],
        ['x-forwarded-for', '203.0.113.7'],
      ],
      '{}',
    )
    const headers = (JSON.parse(echoed.body) as { headers: IncomingHttpHeaders }).headers
    expect(headers['x-private']).toBeUndefined()
    expect(headers.te).toBeUndefined()
    expect(headers['x-forwarded-for']).toBe('203.0.113.7, 127.0.0.1')
    expect(headers['x-forwarded-proto']).toBe('http')
    expect(headers.via).toContain('idemkey')
  })

  it('answers 504 when the upstream times out and releases the record, so a retry runs', async () => {
    const key = randomUUID()
    upstream.hang = true
    try {
      const timedOut = await post(proxy.port, '/charges', key)
      expect(timedOut.status).toBe(504)
      expect(timedOut.headers.get('content-type')).toBe('application/problem+json')
    } finally {
      upstream.hang = false
    }
    // Released, not abandoned: `idemkey list` does not call it stuck.
    expect(await inspect(store, key)).toMatchObject({ leaseState: expect.stringMatching(/^released /), leaseEnded: 'released' })
    const retried = await post(proxy.port, '/charges', key)
    expect(retried.status).toBe(201)
    expect(retried.headers.get('idempotent-replayed')).toBeNull()
  })

  it('answers 502 when the upstream refuses connections', async () => {
    const closed = createServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', () => resolve()))
    const port = (closed.address() as AddressInfo).port
    await new Promise((resolve) => closed.close(resolve))
    const lonely = await startProxy(['--upstream', `http://127.0.0.1:${port}`, '--store', 'memory:'])
    const response = await post(lonely.port, '/charges', randomUUID())
    expect(response.status).toBe(502)
    lonely.child.kill('SIGTERM')
    await lonely.exited
  })

  it('answers 400 to a covered request without a key under --require-key', async () => {
    const strict = await startProxy(['--upstream', `http://127.0.0.1:${upstream.port}`, '--store', 'memory:', '--require-key'])
    const response = await post(strict.port, '/charges', undefined)
    expect(response.status).toBe(400)
    expect(((await response.json()) as { detail: string }).detail).toContain('requires an Idempotency-Key')
    expect((await fetch(`http://127.0.0.1:${strict.port}/echo`)).status).toBe(201)
    strict.child.kill('SIGTERM')
    await strict.exited
  })

  it('starts while its store is down, fails closed with 503, and serves once the store is back', async () => {
    const later = join(dir, 'later')
    const down = await startProxy(['--upstream', `http://127.0.0.1:${upstream.port}`, '--store', `sqlite:${join(later, 'x.db')}`])
    const refused = await post(down.port, '/charges', randomUUID())
    expect(refused.status).toBe(503)
    expect(refused.headers.get('retry-after')).toBeTruthy()
    expect((await fetch(`http://127.0.0.1:${down.port}/echo`)).status).toBe(201) // uncovered: untouched
    mkdirSync(later)
    let status = 0
    for (let i = 0; i < 40 && status !== 201; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100))
      status = (await post(down.port, '/charges', randomUUID())).status
    }
    expect(status).toBe(201)
    down.child.kill('SIGTERM')
    await down.exited
  })

  it('drains in-flight requests on SIGTERM and keeps their outcome', async () => {
    const drainStore = `sqlite:${join(dir, 'drain.db')}`
    const draining = await startProxy(['--upstream', `http://127.0.0.1:${upstream.port}`, '--store', drainStore])
    const key = randomUUID()
    const arrived = new Promise<void>((resolve) => {
      upstream.arrived = (k) => k === key && resolve()
    })
    const pending = post(draining.port, '/charges?ms=500', key)
    await arrived
    draining.child.kill('SIGTERM')
    const response = await pending
    expect(response.status).toBe(201)
    expect((await draining.exited).code).toBe(0)
    expect(await inspect(drainStore, key)).toMatchObject({ status: 'completed', token: 1 })
  })

  it('shares one store between proxies: a proxy killed mid-request is taken over by another after the lease', async () => {
    const shared = `sqlite:${join(dir, 'shared.db')}`
    const target = `http://127.0.0.1:${upstream.port}`
    const a = await startProxy(['--upstream', target, '--store', shared, '--lease', '1s'])
    const b = await startProxy(['--upstream', target, '--store', shared, '--lease', '1s', '--wait', '200ms'])

    const done = randomUUID()
    await (await post(a.port, '/charges', done)).text()
    expect((await post(b.port, '/charges', done)).headers.get('idempotent-replayed')).toBe('true')

    const key = randomUUID()
    const arrived = new Promise<void>((resolve) => {
      upstream.arrived = (k) => k === key && resolve()
    })
    const slow = '/charges?ms=1500'
    const doomed = post(a.port, slow, key).catch((error: unknown) => error)
    await arrived
    const busy = await post(b.port, slow, key)
    expect(busy.status).toBe(409)
    expect(Number(busy.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    a.child.kill('SIGKILL')
    expect(await doomed).toBeInstanceOf(Error)

    let response = await post(b.port, slow, key)
    for (let i = 0; i < 20 && response.status === 409; i++) {
      await new Promise((resolve) => setTimeout(resolve, 200))
      response = await post(b.port, slow, key)
    }
    expect(response.status).toBe(201)
    expect(await inspect(shared, key)).toMatchObject({ status: 'completed', token: 2, attempts: 2 })
    // The upstream ran it twice: what a proxy cannot undo when it dies mid-request (docs/proxy.md).
    expect(upstream.runs.get(key)).toBe(2)
    b.child.kill('SIGTERM')
    await b.exited
  })
})
