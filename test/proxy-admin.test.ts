/**
 * `idemkey proxy --admin-port`: /metrics, /healthz, /readyz and the JSON access log, each pinned against
 * the traffic that produced it, through a store outage: a throwaway redis-server stopped and started
 * again on the same port.
 */
import { type ChildProcess, spawnSync } from 'node:child_process'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { keyHash } from '../src/observability/recorder.js'
import { freePort, RedisServer, tempDir } from './fixtures/redis/servers.js'
import { type ProxyProcess, startProxy } from './helpers/proxy-process.js'
import { isCI } from './helpers/services.js'

const hasRedis = spawnSync('redis-server', ['--version']).status === 0
if (!hasRedis) {
  if (isCI()) throw new Error('CI is set and redis-server is not installed: the proxy admin test needs it.')
  console.warn('\n!!! SKIPPED (redis-server missing): install redis-server to run the proxy admin test\n')
}

/** One sample of a Prometheus text exposition: the value of `name{labels}`, 0 when absent. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number {
  let total = 0
  for (const line of text.split('\n')) {
    const match = /^([a-z_]+)(\{[^}]*\})? (\S+)$/.exec(line)
    if (!match || match[1] !== name) continue
    const have = Object.fromEntries([...(match[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]))
    if (Object.entries(labels).every(([k, v]) => have[k] === v)) total += Number(match[3])
  }
  return total
}

interface LogLine {
  level: string
  msg: string
  [field: string]: unknown
}

function logLines(stderr: string): LogLine[] {
  return stderr
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as LogLine)
}

describe.skipIf(!hasRedis)('idemkey proxy --admin-port', () => {
  let redis: RedisServer
  let dir: { path: string; remove(): void }
  let upstream: Server
  let proxy: ProxyProcess
  let admin: string
  let base: string
  const children: ChildProcess[] = []

  beforeAll(async () => {
    dir = tempDir('proxy-admin')
    redis = new RedisServer(await freePort(), dir.path, ['--appendonly', 'no'])
    await redis.start()
    upstream = createServer((req, res) => {
      req.resume()
      req.on('end', () => {
        const slow = req.url?.includes('slow')
        setTimeout(
          () => {
            res.writeHead(req.method === 'GET' ? 200 : 201, { 'content-type': 'application/json' })
            res.end('{"ok":true}')
          },
          slow ? 600 : 0,
        )
      })
    })
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', () => resolve()))
    const adminPort = await freePort()
    admin = `http://127.0.0.1:${adminPort}`
    proxy = await startProxy(
      [
        '--upstream',
        `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
        '--store',
        redis.url,
        '--wait',
        '0s',
        '--admin-port',
        String(adminPort),
        '--log-format',
        'json',
      ],
      children,
      { env: { IDEMKEY_SCOPE_SECRET: 'test-secret-for-the-admin-port' } },
    )
    base = `http://127.0.0.1:${proxy.port}`
    await vi.waitFor(async () => expect((await fetch(`${admin}/healthz`)).status).toBe(200), { timeout: 5_000 })
  })

  afterAll(async () => {
    for (const child of children) child.kill('SIGKILL')
    await redis?.stop('SIGKILL')
    upstream?.closeAllConnections()
    await new Promise((resolve) => upstream?.close(resolve))
    dir?.remove()
  })

  const post = (key: string | undefined, body: string, headers: Record<string, string> = {}, path = '/charges') =>
    fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(key === undefined ? {} : { 'idempotency-key': key }), ...headers },
      body,
    })
  const metrics = async () => (await fetch(`${admin}/metrics`)).text()

  it('counts every answer by outcome and status, and logs one access line per request with hashed keys', async () => {
    const statuses = [
      (await post('key-one', '{"a":1}', { 'x-request-id': 'req-from-client' })).status, // executed
      (await post('key-two', '{"a":2}', { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' })).status,
      (await post('key-one', '{"a":1}')).status, // replayed
      (await post('key-two', '{"a":2}')).status, // replayed
      (await post('key-one', '{"a":"other"}')).status, // mismatch
      (await post('bad key \u00e9', '{}')).status, // rejected before the ledger
      (await fetch(`${base}/health`)).status, // passthrough
    ]
    expect(statuses).toEqual([201, 201, 201, 201, 422, 400, 200])
    const slow = post('key-slow', '{}', {}, '/slow')
    await sleep(150)
    expect((await post('key-slow', '{}', {}, '/slow')).status).toBe(409) // in_progress, --wait 0s
    expect((await slow).status).toBe(201)

    const text = await metrics()
    expect(sample(text, 'idemkey_intents_total', { store: 'redis', result: 'executed', outcome: 'completed' })).toBe(3)
    expect(sample(text, 'idemkey_intents_total', { result: 'replayed' })).toBe(2)
    expect(sample(text, 'idemkey_intents_total', { result: 'mismatch' })).toBe(1)
    expect(sample(text, 'idemkey_intents_total', { result: 'in_progress' })).toBe(1)
    expect(sample(text, 'idemkey_intents_total')).toBe(7)
    expect(sample(text, 'idemkey_intents_running')).toBe(0)
    expect(sample(text, 'idemkey_http_responses_total', { outcome: 'executed', status: '201' })).toBe(3)
    expect(sample(text, 'idemkey_http_responses_total', { outcome: 'replayed', status: '201' })).toBe(2)
    expect(sample(text, 'idemkey_http_responses_total', { outcome: 'mismatch', status: '422' })).toBe(1)
    expect(sample(text, 'idemkey_http_responses_total', { outcome: 'in_progress', status: '409' })).toBe(1)
    expect(sample(text, 'idemkey_http_responses_total', { outcome: 'rejected', status: '400' })).toBe(1)
    expect(sample(text, 'idemkey_http_responses_total', { outcome: 'passthrough', status: '200' })).toBe(1)
    // acquire for each of the 7 ledger runs, complete for the 3 executed.
    expect(sample(text, 'idemkey_store_operation_duration_seconds_count', { operation: 'acquire' })).toBe(7)
    expect(sample(text, 'idemkey_store_operation_duration_seconds_count', { operation: 'complete' })).toBe(3)
    expect(sample(text, 'idemkey_store_errors_total')).toBe(0)
    expect(sample(text, 'idemkey_store_up')).toBe(1)

    await vi.waitFor(() => expect(logLines(proxy.stderr()).filter((l) => l.msg === 'request')).toHaveLength(9))
    const access = logLines(proxy.stderr()).filter((l) => l.msg === 'request')
    expect(access.map((l) => [l.outcome, l.status])).toEqual(
      expect.arrayContaining([
        ['executed', 201],
        ['replayed', 201],
        ['mismatch', 422],
        ['rejected', 400],
        ['passthrough', 200],
        ['in_progress', 409],
      ]),
    )
    const first = access.find((l) => l.requestId === 'req-from-client')
    expect(first).toMatchObject({ method: 'POST', path: '/charges', upstreamStatus: 201, outcome: 'executed' })
    expect(first?.keyHash).toMatch(/^[0-9a-f]{16}$/)
    expect(typeof first?.durationMs).toBe('number')
    expect(access.find((l) => l.requestId === '4bf92f3577b34da6a3ce929d0e0e4736')?.outcome).toBe('executed')
    const replays = access.filter((l) => l.outcome === 'replayed')
    expect(replays.every((l) => l.upstreamStatus === undefined)).toBe(true)
    // Each key hashes the same way in every line, and no key appears raw.
    expect(new Set(access.filter((l) => l.path === '/charges' && l.status !== 400).map((l) => l.keyHash)).size).toBe(2)
    expect(proxy.stderr()).not.toContain('key-one')
    expect(proxy.stderr()).not.toContain('key-slow')
    expect(keyHash('x', 'y')).toMatch(/^[0-9a-f]{16}$/)
  })

  it('reports a store outage in /readyz, one log line each way, and the counters', async () => {
    expect((await fetch(`${admin}/readyz`)).status).toBe(200)
    const before = await metrics()
    const errorsBefore = sample(before, 'idemkey_store_errors_total')
    await redis.stop('SIGKILL')

    const ready = await fetch(`${admin}/readyz`)
    expect(ready.status).toBe(503)
    expect(await ready.json()).toMatchObject({ status: 'store unavailable' })
    expect((await fetch(`${admin}/healthz`)).status).toBe(200)
    const during = [await post('outage-1', '{}'), await post('outage-2', '{}')]
    expect(during.map((r) => r.status)).toEqual([503, 503])

    const down = await metrics()
    expect(sample(down, 'idemkey_store_up')).toBe(0)
    expect(sample(down, 'idemkey_http_responses_total', { outcome: 'store_unavailable', status: '503' })).toBe(2)
    expect(sample(down, 'idemkey_intents_total', { result: 'error' })).toBe(2)
    expect(sample(down, 'idemkey_store_errors_total', { operation: 'acquire' }) - errorsBefore).toBe(2)
    const downLines = logLines(proxy.stderr()).filter((l) => l.msg.startsWith('store unavailable'))
    expect(downLines).toHaveLength(1)
    expect(downLines[0]?.level).toBe('error')

    await redis.start()
    await vi.waitFor(async () => expect((await fetch(`${admin}/readyz`)).status).toBe(200), { timeout: 15_000, interval: 200 })
    expect((await post('after-outage', '{}')).status).toBe(201)
    const after = await metrics()
    expect(sample(after, 'idemkey_store_up')).toBe(1)
    expect(sample(after, 'idemkey_http_responses_total', { outcome: 'executed', status: '201' })).toBe(4)
    const upLines = logLines(proxy.stderr()).filter((l) => l.msg.startsWith('store answering again'))
    expect(upLines).toHaveLength(1)
    // Still one down line: the outage was said once, not once per request or probe.
    expect(logLines(proxy.stderr()).filter((l) => l.msg.startsWith('store unavailable'))).toHaveLength(1)
  }, 60_000)

  it('answers the operator page to loopback clients and refuses writes', async () => {
    const page = await fetch(`${admin}/`)
    expect(page.status).toBe(200)
    expect(page.headers.get('content-security-policy')).toContain("default-src 'none'")
    const summary = (await (await fetch(`${admin}/api/summary`)).json()) as { counts: Record<string, { count: number }> }
    // The throwaway Redis keeps nothing across its restart: only the request after the outage is there.
    expect(summary.counts.completed?.count).toBe(1)
    expect((await fetch(`${admin}/api/summary`, { method: 'POST' })).status).toBe(405)
  })
})

describe('idemkey proxy logging flags', () => {
  const children: ChildProcess[] = []
  let upstream: Server
  let upstreamUrl: string

  beforeAll(async () => {
    upstream = createServer((req, res) => {
      req.resume()
      req.on('end', () => {
        res.writeHead(201, { 'content-type': 'application/json' })
        res.end('{}')
      })
    })
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', () => resolve()))
    upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`
  })

  afterAll(async () => {
    for (const child of children) child.kill('SIGKILL')
    upstream.closeAllConnections()
    await new Promise((resolve) => upstream.close(resolve))
  })

  const charge = (port: number, key: string) =>
    fetch(`http://127.0.0.1:${port}/charges`, { method: 'POST', headers: { 'idempotency-key': key }, body: '{}' }).then((r) => r.status)

  it('writes no access line at --log-level warn', async () => {
    const proxy = await startProxy(
      ['--upstream', upstreamUrl, '--store', 'memory:', '--log-level', 'warn', '--log-format', 'json'],
      children,
      {
        env: { IDEMKEY_SCOPE_SECRET: 'quiet-proxy-secret' },
      },
    )
    expect(await charge(proxy.port, 'quiet-1')).toBe(201)
    expect(await charge(proxy.port, 'quiet-1')).toBe(201)
    await sleep(200)
    expect(logLines(proxy.stderr())).toEqual([])
  })

  it('writes compact human lines with --log-format pretty', async () => {
    const proxy = await startProxy(['--upstream', upstreamUrl, '--store', 'memory:', '--log-format', 'pretty'], children, {
      env: { IDEMKEY_SCOPE_SECRET: 'pretty-proxy-secret' },
    })
    expect(await charge(proxy.port, 'pretty-1')).toBe(201)
    const ESC = String.fromCharCode(27)
    await vi.waitFor(() => expect(proxy.stderr()).toContain(`${ESC}[32mINFO ${ESC}[0m request `))
    expect(proxy.stderr()).toMatch(/^\d\d:\d\d:\d\d\.\d{3} .*INFO .* request .*outcome=executed/m)
    expect(proxy.stderr()).not.toMatch(/^\{/m)
    expect(proxy.stderr()).not.toContain('pretty-1')
  })
})

describe('idemkey proxy --admin-port while it drains', () => {
  const children: ChildProcess[] = []
  let upstream: Server
  let arrived: (() => void) | undefined

  beforeAll(async () => {
    upstream = createServer((req, res) => {
      req.resume()
      req.on('end', () => {
        arrived?.()
        setTimeout(() => {
          res.writeHead(201, { 'content-type': 'application/json' })
          res.end('{}')
        }, 1_500)
      })
    })
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', () => resolve()))
  })

  afterAll(async () => {
    for (const child of children) child.kill('SIGKILL')
    upstream.closeAllConnections()
    await new Promise((resolve) => upstream.close(resolve))
  })

  it('answers /readyz 503 from SIGTERM on, so a load balancer stops sending while in-flight requests finish', async () => {
    const adminPort = await freePort()
    const admin = `http://127.0.0.1:${adminPort}`
    const proxy = await startProxy(
      [
        '--upstream',
        `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
        '--store',
        'memory:',
        '--admin-port',
        String(adminPort),
        '--log-level',
        'warn',
      ],
      children,
      { env: { IDEMKEY_SCOPE_SECRET: 'draining-proxy-secret' } },
    )
    await vi.waitFor(async () => expect((await fetch(`${admin}/readyz`)).status).toBe(200), { timeout: 5_000 })
    const reached = new Promise<void>((resolve) => {
      arrived = resolve
    })
    const inFlight = fetch(`http://127.0.0.1:${proxy.port}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'draining-1', 'content-type': 'application/json' },
      body: '{}',
    })
    await reached
    proxy.child.kill('SIGTERM')
    await sleep(200)
    const ready = await fetch(`${admin}/readyz`)
    expect(ready.status).toBe(503)
    expect(await ready.json()).toMatchObject({ status: 'draining' })
    expect((await inFlight).status).toBe(201)
    expect(await proxy.exited).toEqual({ code: 0, signal: null })
  })
})
