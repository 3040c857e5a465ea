/**
 * SPEC §5, written once and run against every adapter over a real listening server.
 */

import type { ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { createServer, request as rawRequest } from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { Ledger } from '../src/core/ledger.js'
import { requestFingerprint } from '../src/http/stored.js'
import type { EngineOptions } from '../src/http/types.js'
import { type AdapterFactory, AppState, adapters, BINARY_KINDS, type RunningApp } from './fixtures/http/apps.js'
import { startProxy } from './helpers/proxy-process.js'

/** A store whose every call fails, as an unreachable server's would, with the driver's revealing message. */
function downStore(): MemoryStore {
  const store = new MemoryStore()
  const fail = async () => {
    throw new Error('connect ECONNREFUSED 10.1.2.3:5432 (role "billing_rw")')
  }
  Object.assign(store, { acquire: fail, renew: fail, complete: fail, release: fail })
  return store
}

/**
 * A MemoryStore that acts as a transactional store (SPEC §6) with a slow COMMIT, to see when the
 * client gets its answer relative to the commit, and that can fence the next completion out.
 */
class SlowCommitStore extends MemoryStore {
  readonly committed = new Set<string>()
  fenceNext = false
  async transaction<R>(fn: (tx: { key?: string }) => Promise<R>): Promise<R> {
    const tx: { key?: string } = {}
    const result = await fn(tx)
    await new Promise((r) => setTimeout(r, 60))
    if (tx.key) this.committed.add(tx.key)
    return result
  }
  async completeInTransaction(tx: { key?: string }, ...args: Parameters<MemoryStore['complete']>): Promise<boolean> {
    if (this.fenceNext) return false
    tx.key = args[1]
    return this.complete(...args)
  }
  /** Its transactions hold no writes, so there is nothing to roll back to. */
  async savepointInTransaction(): Promise<void> {}
}

interface Answer {
  status: number
  headers: Headers
  text: string
  json: () => Record<string, unknown>
}

async function post(
  url: string,
  path: string,
  init: { key?: string; body?: unknown; headers?: Record<string, string>; raw?: string } = {},
): Promise<Answer> {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...init.headers }
  if (init.key !== undefined) headers['idempotency-key'] = init.key
  const response = await fetch(url + path, { method: 'POST', headers, body: init.raw ?? JSON.stringify(init.body ?? { amount: 100 }) })
  const text = await response.text()
  return { status: response.status, headers: response.headers, text, json: () => JSON.parse(text) }
}

/** A POST whose answer is read as bytes, never decoded as text. */
async function postForBytes(url: string, key: string): Promise<{ status: number; headers: Headers; bytes: Buffer }> {
  const response = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{}' })
  return { status: response.status, headers: response.headers, bytes: Buffer.from(await response.arrayBuffer()) }
}

/** Sends the Idempotency-Key header twice on the wire (fetch would join them). */
function postWithKeyTwice(url: string, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const body = '{"amount":1}'
    const req = rawRequest(`${url}${path}`, {
      method: 'POST',
      headers: [
        ['content-type', 'application/json'],
        ['content-length', String(body.length)],
        ['idempotency-key', 'a'],
        ['idempotency-key', 'b'],
      ].flat(),
    })
    req.on('response', (res) => {
      res.resume()
      resolve(res.statusCode ?? 0)
    })
    req.on('error', reject)
    req.end(body)
  })
}

/** Opens a raw connection, sends `head` and `body` in pieces with pauses, and returns the status line's code (or 0 when closed). */
function rawExchange(url: string, parts: string[], pauseMs: number, hangUp = false): Promise<number> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname)
    let answer = ''
    socket.on('data', (chunk) => {
      answer += chunk
    })
    socket.on('close', () => resolve(Number(/^HTTP\/1\.1 (\d+)/.exec(answer)?.[1] ?? 0)))
    socket.on('error', reject)
    socket.once('connect', async () => {
      for (const part of parts) {
        socket.write(part)
        await new Promise((r) => setTimeout(r, pauseMs))
      }
      if (hangUp) socket.destroy()
    })
  })
}

function rawHead(path: string, key: string, length: number): string {
  return `POST ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\nidempotency-key: ${key}\r\nconnection: close\r\n\r\n`
}

function expectProblem(answer: Answer, status: number, slug: string) {
  expect(answer.status).toBe(status)
  expect(answer.headers.get('content-type')).toMatch(/^application\/problem\+json/)
  const problem = answer.json()
  expect(problem).toMatchObject({ status, type: expect.stringContaining(slug), title: expect.any(String), detail: expect.any(String) })
}

/**
 * Each framework's own way to read a request header: it works only on the framework's request object
 * (Express `req.get`, Fastify `request.raw`, Hono `c.req`, fetch `Headers`), never on a neutral copy.
 */
const nativeTenant: Record<string, (req: never) => string | undefined> = {
  express: (req: { get(name: string): string | undefined }) => req.get('x-tenant'),
  fastify: (request: { raw: { headers: Record<string, string | undefined> } }) => request.raw.headers['x-tenant'],
  hono: (c: { req: { header(name: string): string | undefined } }) => c.req.header('x-tenant'),
  fetch: (request: Request) => request.headers.get('x-tenant') ?? undefined,
  koa: (ctx: { get(name: string): string }) => ctx.get('x-tenant'),
  // NestJS hands the scope function its platform's request: Express's req, Fastify's request.
  'nestjs-express': (req: { get(name: string): string | undefined }) => req.get('x-tenant'),
  'nestjs-fastify': (request: { raw: { headers: Record<string, string | undefined> } }) => request.raw.headers['x-tenant'],
  // Lambda hands it the API Gateway event.
  'lambda-http-api': (event: { headers: Record<string, string | undefined> }) => event.headers['x-tenant'],
  'lambda-rest-api': (event: { headers: Record<string, string | undefined> }) => event.headers['x-tenant'],
}

describe.each(Object.entries(adapters))('HTTP conformance: %s', (name, start: AdapterFactory) => {
  const state = new AppState()
  const apps: RunningApp[] = []
  let app: RunningApp
  let ledger: Ledger
  let store: MemoryStore
  const boot = async (options: Partial<EngineOptions<unknown>> = {}, store = new MemoryStore()) => {
    const running = await start({ ledger: new Ledger({ store, lease: '5s', wait: '2s' }), ...options }, state)
    apps.push(running)
    return running
  }
  beforeAll(async () => {
    store = new MemoryStore()
    ledger = new Ledger({ store, lease: '5s', wait: '5s' })
    app = await start({ ledger, maxStoredBody: 1024, maxRequestBody: 64 * 1024 }, state)
    apps.push(app)
  })
  afterAll(async () => {
    for (const running of apps) await running.close()
  })

  it('runs the first request and replays it byte for byte with Idempotent-Replayed: true', async () => {
    const key = randomUUID()
    const first = await post(app.url, '/charges', { key })
    const second = await post(app.url, '/charges', { key })
    expect(first.status).toBe(201)
    expect(first.headers.get('idempotent-replayed')).toBeNull()
    expect(second.status).toBe(201)
    expect(second.text).toBe(first.text)
    expect(second.headers.get('idempotent-replayed')).toBe('true')
    expect(second.headers.get('content-type')).toBe(first.headers.get('content-type'))
    expect(state.executions('/charges', key)).toBe(1)
  })

  it.each(Object.keys(BINARY_KINDS))('replays a %s body byte for byte, as the handler sent it, with its content type', async (kind) => {
    const key = randomUUID()
    const first = await postForBytes(`${app.url}/binary/${kind}`, key)
    const second = await postForBytes(`${app.url}/binary/${kind}`, key)
    const sent = state.sent.get(key) ?? []
    expect(sent).toHaveLength(1)
    expect(first.status).toBe(200)
    expect(first.headers.get('idempotent-replayed')).toBeNull()
    expect(first.bytes.equals(sent[0] as Buffer), 'first answer is the handler bytes').toBe(true)
    expect(second.status).toBe(200)
    expect(second.headers.get('idempotent-replayed')).toBe('true')
    // Byte for byte: a replay that went through a text decoder would change every byte that is not UTF-8.
    expect(second.bytes.toString('hex')).toBe(first.bytes.toString('hex'))
    expect(second.headers.get('content-type')).toBe(first.headers.get('content-type'))
    expect(second.headers.get('content-length') ?? String(second.bytes.length)).toBe(String(first.bytes.length))
  })

  it('runs 50 concurrent duplicates once and gives all 50 the same answer', async () => {
    const key = randomUUID()
    const answers = await Promise.all(Array.from({ length: 50 }, () => post(app.url, '/charges', { key })))
    expect(state.executions('/charges', key)).toBe(1)
    expect(new Set(answers.map((a) => `${a.status} ${a.text}`)).size).toBe(1)
    expect(answers.filter((a) => a.headers.get('idempotent-replayed') === 'true').length).toBe(49)
  })

  it('answers 422 problem+json to the same key with another body, and runs nothing', async () => {
    const key = randomUUID()
    await post(app.url, '/charges', { key, body: { amount: 100 } })
    const reuse = await post(app.url, '/charges', { key, body: { amount: 999 } })
    expectProblem(reuse, 422, 'fingerprint-mismatch')
    expect(reuse.text).not.toContain('ch_') // never echoes the stored body
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('answers 422 to the same key on another path', async () => {
    const key = randomUUID()
    await post(app.url, '/charges', { key })
    expectProblem(await post(app.url, '/status/201', { key }), 422, 'fingerprint-mismatch')
  })

  it('treats the same JSON with keys in another order as the same request', async () => {
    const key = randomUUID()
    await post(app.url, '/charges', { key, raw: '{"amount":100,"currency":"eur","meta":{"a":1,"b":2}}' })
    const again = await post(app.url, '/charges', { key, raw: '{ "meta": {"b":2, "a":1}, "currency": "eur", "amount": 1.0e2 }' })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(state.executions('/charges', key)).toBe(1)
  })

  const postForm = (key: string, raw: string) =>
    post(app.url, '/charges', { key, raw, headers: { 'content-type': 'application/x-www-form-urlencoded' } })

  it('treats the same form fields in another order and percent-encoding as the same request', async () => {
    const key = randomUUID()
    expect((await postForm(key, 'amount=100&currency=usd&description=hello%20world&tags[]=a&tags[]=b')).status).toBe(201)
    const again = await postForm(key, 'tags[]=a&description=hello+world&currency=%75sd&tags[]=%62&amount=100')
    expect(again.status).toBe(201)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('answers 422 to the same key with other form values, or with a repeated field in another order', async () => {
    const key = randomUUID()
    expect((await postForm(key, 'amount=100&tags[]=a&tags[]=b')).status).toBe(201)
    expectProblem(await postForm(key, 'amount=999&tags[]=a&tags[]=b'), 422, 'fingerprint-mismatch')
    expectProblem(await postForm(key, 'amount=100&tags[]=b&tags[]=a'), 422, 'fingerprint-mismatch')
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('tells apart integers beyond 2^53 that a double would merge (422, not a replay)', async () => {
    const key = randomUUID()
    expect((await post(app.url, '/charges', { key, raw: '{"account":9007199254740993}' })).status).toBe(201)
    expectProblem(await post(app.url, '/charges', { key, raw: '{"account":9007199254740992}' }), 422, 'fingerprint-mismatch')
    expect(state.executions('/charges', key)).toBe(1)
  })

  it("tells apart decimals that differ past a double's precision (422, not a replay)", async () => {
    const key = randomUUID()
    expect((await post(app.url, '/charges', { key, raw: '{"amount":0.10000000000000001}' })).status).toBe(201)
    expectProblem(await post(app.url, '/charges', { key, raw: '{"amount":0.1}' }), 422, 'fingerprint-mismatch')
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('answers 400 problem to duplicate member names (I-JSON), and runs nothing', async () => {
    const key = randomUUID()
    const answer = await post(app.url, '/charges', { key, raw: '{"amount":1,"amount":1000}' })
    expectProblem(answer, 400, 'body-invalid')
    expect(answer.json().detail).toMatch(/"amount" twice/)
    expect(state.executions('/charges', key)).toBe(0)
    // Nothing was locked: the same key with a well-formed body runs.
    expect((await post(app.url, '/charges', { key, raw: '{"amount":1000}' })).status).toBe(201)
  })

  it('answers 400 problem, never 500, to JSON nested past the depth limit', async () => {
    for (const depth of [200, 30_000]) {
      const key = randomUUID()
      // Arrays: 30,000 levels in 60 KB, within the layer's body limit here.
      const answer = await post(app.url, '/charges', { key, raw: `${'['.repeat(depth)}${']'.repeat(depth)}` })
      expect(answer.status).toBe(400)
      expect(state.executions('/charges', key)).toBe(0)
    }
  })

  it('treats the same JSON value spelled differently (whitespace, escapes, number forms) as the same request', async () => {
    const key = randomUUID()
    await post(app.url, '/charges', { key, raw: '{"payee":"ann","amount":100}' })
    const again = await post(app.url, '/charges', { key, raw: '{ "amount" : 1e2 ,\n "payee" : "\\u0061nn" }' })
    expect(again.status).toBe(201)
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('reads a key given as an RFC 8941 string the same as a bare key', async () => {
    const key = randomUUID()
    await post(app.url, '/charges', { key })
    const quoted = await post(app.url, '/charges', { key: `"${key}"` })
    expect(quoted.headers.get('idempotent-replayed')).toBe('true')
  })

  it('answers 400 problem+json to empty, too long or non-ASCII keys', async () => {
    for (const key of ['', 'x'.repeat(256), '"unterminated', '"a", "b"']) {
      expectProblem(await post(app.url, '/charges', { key }), 400, 'key-invalid')
    }
    const nonAscii = await fetch(`${app.url}/charges`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': Buffer.from('clé', 'latin1').toString('binary') },
      body: '{}',
    })
    expect(nonAscii.status).toBe(400)
  })

  it('answers 400 when the Idempotency-Key header is given twice (where the runtime keeps them apart)', async () => {
    const status = await postWithKeyTwice(app.url, '/charges')
    // fetch-style runtimes join repeated headers into "a, b", which is one valid key: documented.
    expect(name === 'fetch' ? [400, 201].includes(status) : status === 400).toBe(true)
  })

  it('reads the key from the header keyHeader names, and names that header in its problems', async () => {
    const custom = await boot({ keyHeader: 'X-Idempotency-Key', required: true })
    const key = randomUUID()
    const first = await post(custom.url, '/context', { headers: { 'x-idempotency-key': key } })
    expect(first.status).toBe(200)
    expect(first.json()).toMatchObject({ key, token: 1 })
    const again = await post(custom.url, '/context', { headers: { 'X-Idempotency-Key': `"${key}"` } })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(again.text).toBe(first.text)
    // The default header is no key any more: this route requires one in the configured header.
    const missing = await post(custom.url, '/context', { key })
    expectProblem(missing, 400, 'key-missing')
    expect(missing.json().detail).toContain('X-Idempotency-Key header')
    const reuse = await post(custom.url, '/context', { headers: { 'x-idempotency-key': key }, body: { amount: 5 } })
    expectProblem(reuse, 422, 'fingerprint-mismatch')
    expect(reuse.json().title).toBe('X-Idempotency-Key reused with another request')
    expect(reuse.json().detail).toContain(`X-Idempotency-Key "${key}"`)
    const invalid = await post(custom.url, '/context', { headers: { 'x-idempotency-key': '"unterminated' } })
    expectProblem(invalid, 400, 'key-invalid')
    expect(invalid.json().detail).toContain('X-Idempotency-Key header')
  })

  it('with another keyHeader, lets a request that has only Idempotency-Key pass through', async () => {
    const custom = await boot({ keyHeader: 'X-Idempotency-Key' })
    const key = randomUUID()
    await post(custom.url, '/charges', { key })
    const second = await post(custom.url, '/charges', { key })
    expect(second.headers.get('idempotent-replayed')).toBeNull()
    expect(state.executions('/charges', key)).toBe(2)
  })

  it('calls onReplay before each replay is sent, with the request, and sends the headers it sets', async () => {
    const seen: Array<{ request: unknown; status: number }> = []
    let fail = false
    const hooked = await boot({
      onReplay: async (request, response) => {
        await new Promise((r) => setTimeout(r, 1))
        if (fail) throw new Error('hook broke')
        seen.push({ request, status: response.status })
        response.headers['x-replay-of'] = request.key
      },
    })
    const key = randomUUID()
    const first = await post(hooked.url, '/charges?via=test', { key })
    expect(first.headers.get('x-replay-of')).toBeNull()
    expect(seen).toEqual([])
    const second = await post(hooked.url, '/charges?via=test', { key })
    expect(second.headers.get('idempotent-replayed')).toBe('true')
    expect(second.headers.get('x-replay-of')).toBe(key)
    expect(second.text).toBe(first.text)
    expect(seen).toEqual([{ request: { method: 'POST', url: '/charges?via=test', key, scope: 'public' }, status: 201 }])
    // Never on the layer's own problems.
    expectProblem(await post(hooked.url, '/charges?via=test', { key, body: { amount: 7 } }), 422, 'fingerprint-mismatch')
    expect(seen).toHaveLength(1)
    // A hook that throws fails that request as a handler error would; the record stays as it was.
    fail = true
    expect((await post(hooked.url, '/charges?via=test', { key })).status).toBe(500)
    fail = false
    expect((await post(hooked.url, '/charges?via=test', { key })).text).toBe(first.text)
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('lets a request without a key pass through, every time', async () => {
    const before = state.executions('/status/201', '-')
    await post(app.url, '/status/201')
    await post(app.url, '/status/201')
    expect(state.executions('/status/201', '-')).toBe(before + 2)
  })

  it('answers 400 to a request without a key when the route requires one', async () => {
    const strict = await boot({ required: true })
    expectProblem(await post(strict.url, '/charges'), 400, 'key-missing')
  })

  it('leaves uncovered methods alone', async () => {
    const key = randomUUID()
    const a = await fetch(`${app.url}/charges`, { headers: { 'idempotency-key': key } })
    const b = await fetch(`${app.url}/charges`, { headers: { 'idempotency-key': key } })
    expect(b.headers.get('idempotent-replayed')).toBeNull()
    expect((await b.json()).runs).toBe((await a.json()).runs + 1)
  })

  it('releases transient failures (5xx, 429, 409) so the retry runs again', async () => {
    for (const code of [500, 503, 429, 409]) {
      const key = randomUUID()
      expect((await post(app.url, `/status/${code}`, { key })).status).toBe(code)
      const retry = await post(app.url, `/status/${code}`, { key })
      expect(retry.headers.get('idempotent-replayed')).toBeNull()
      expect(state.executions(`/status/${code}`, key)).toBe(2)
    }
  })

  it('stores final 4xx failures and replays them', async () => {
    for (const code of [400, 404, 422]) {
      const key = randomUUID()
      await post(app.url, `/status/${code}`, { key })
      const retry = await post(app.url, `/status/${code}`, { key })
      expect(retry.status).toBe(code)
      expect(retry.headers.get('idempotent-replayed')).toBe('true')
      expect(state.executions(`/status/${code}`, key)).toBe(1)
    }
  })

  it('releases the record when the handler throws', async () => {
    const key = randomUUID()
    expect((await post(app.url, '/throw', { key })).status).toBe(500)
    expect((await post(app.url, '/throw', { key })).status).toBe(500)
    expect(state.executions('/throw', key)).toBe(2)
  })

  it('keeps tenants apart: the same key under other credentials runs again', async () => {
    const key = randomUUID()
    await post(app.url, '/charges', { key, headers: { authorization: 'Bearer tenant-a' } })
    const b = await post(app.url, '/charges', { key, headers: { authorization: 'Bearer tenant-b' } })
    expect(b.headers.get('idempotent-replayed')).toBeNull()
    expect(state.executions('/charges', key)).toBe(2)
    const a = await post(app.url, '/charges', { key, headers: { authorization: 'Bearer tenant-a' } })
    expect(a.headers.get('idempotent-replayed')).toBe('true')
  })

  it('scopes by the named credentials: two cookie users, and two API-key users, never share a key', async () => {
    const named = await boot({ credentials: ['cookie:session', 'header:x-api-key'] })
    const pairs: Array<[Record<string, string>, Record<string, string>]> = [
      [{ cookie: 'session=alice' }, { cookie: 'session=bob' }],
      [{ 'x-api-key': 'key-of-alice' }, { 'x-api-key': 'key-of-bob' }],
    ]
    for (const [alice, bob] of pairs) {
      const key = randomUUID()
      await post(named.url, '/charges', { key, headers: alice })
      expect((await post(named.url, '/charges', { key, headers: bob })).headers.get('idempotent-replayed')).toBeNull()
      expect(state.executions('/charges', key)).toBe(2)
      expect((await post(named.url, '/charges', { key, headers: alice })).headers.get('idempotent-replayed')).toBe('true')
    }
  })

  it('refuses, without running it, a keyed request with a cookie and no Authorization when no credential is named', async () => {
    const key = randomUUID()
    const answer = await post(app.url, '/charges', { key, headers: { cookie: 'session=alice' } })
    expect(answer.status).toBe(500)
    expect(answer.json().type).toMatch(/invalid-option$/)
    expect(state.executions('/charges', key)).toBe(0)
  })

  it('replays allowlisted headers only: never set-cookie, never unlisted ones', async () => {
    const key = randomUUID()
    const first = await post(app.url, '/charges', { key })
    expect(first.headers.get('set-cookie')).toBe('session=secret')
    const replay = await post(app.url, '/charges', { key })
    expect(replay.headers.get('etag')).toBe(first.headers.get('etag'))
    expect(replay.headers.get('location')).toBe(first.headers.get('location'))
    expect(replay.headers.get('set-cookie')).toBeNull()
    expect(replay.headers.get('x-custom')).toBeNull()
  })

  it('stores a configured extra header', async () => {
    const custom = await boot({ storedHeaders: ['X-Custom'] })
    const key = randomUUID()
    const first = await post(custom.url, '/charges', { key })
    expect((await post(custom.url, '/charges', { key })).headers.get('x-custom')).toBe(first.headers.get('x-custom'))
  })

  it('replays a response over the stored-body limit as its status and headers with a body-omitted problem, and never runs it twice', async () => {
    const key = randomUUID()
    const first = await post(app.url, '/big', { key })
    expect(first.text.length).toBe(4096)
    const replay = await post(app.url, '/big', { key })
    expect(replay.status).toBe(201)
    expect(replay.headers.get('content-type')).toMatch(/^application\/problem\+json/)
    expect(replay.json()).toMatchObject({ type: expect.stringContaining('body-omitted'), status: 201, code: 'BODY_OMITTED' })
    expect(replay.json().detail).toMatch(/4096 bytes/)
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.headers.get('idempotent-body-omitted')).toBe('4096')
    expect(state.executions('/big', key)).toBe(1)
  })

  it('waits for an in-flight duplicate, then replays its outcome', async () => {
    const key = randomUUID()
    const held = state.hold(key)
    const first = post(app.url, '/slow', { key })
    await held.started
    const second = post(app.url, '/slow', { key })
    await new Promise((r) => setTimeout(r, 100))
    held.release()
    const [a, b] = await Promise.all([first, second])
    expect(b.text).toBe(a.text)
    expect(b.headers.get('idempotent-replayed')).toBe('true')
    expect(state.executions('/slow', key)).toBe(1)
  })

  it('answers 409 with Retry-After when the duplicate is still in flight at the deadline', async () => {
    const impatient = await boot({ wait: 0 })
    const key = randomUUID()
    const held = state.hold(key)
    const first = post(impatient.url, '/slow', { key })
    await held.started
    const second = await post(impatient.url, '/slow', { key })
    expectProblem(second, 409, 'in-progress')
    expect(Number(second.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    held.release()
    expect((await first).status).toBe(201)
  })

  it('fails closed with 503 and Retry-After when the store is down', async () => {
    const events: Array<{ type: string; error?: Error }> = []
    const down = await boot({ onEvent: (e) => events.push(e as never) }, downStore())
    const key = randomUUID()
    const answer = await post(down.url, '/charges', { key })
    expectProblem(answer, 503, 'store-unavailable')
    expect(answer.headers.get('retry-after')).toBe('1')
    expect(state.executions('/charges', key)).toBe(0)
    // The store's internals (address, role, driver message) go to the operator's hook, never to the client.
    expect(answer.text).not.toMatch(/ECONNREFUSED|10\.1\.2\.3|billing_rw|memory/i)
    expect(events.find((e) => e.type === 'store_error')?.error?.message).toMatch(/ECONNREFUSED 10\.1\.2\.3:5432/)
  })

  it("writes the layer's own answers in Stripe's format with errorFormat: 'stripe', with Stripe's statuses", async () => {
    const stripe = await boot({ errorFormat: 'stripe' })
    const key = randomUUID()
    expect((await post(stripe.url, '/charges', { key, body: { amount: 1 } })).status).toBe(201)
    const reused = await post(stripe.url, '/charges', { key, body: { amount: 2 } })
    expect(reused.status).toBe(400)
    expect(reused.headers.get('content-type')).toMatch(/^application\/json/)
    expect(reused.json()).toEqual({
      error: {
        type: 'idempotency_error',
        code: 'fingerprint_mismatch',
        message: expect.stringContaining(key),
        doc_url: expect.stringContaining('#fingerprint-mismatch'),
      },
    })
    const bad = await post(stripe.url, '/charges', { key: 'k'.repeat(300) })
    expect([bad.status, bad.json()]).toEqual([
      400,
      { error: expect.objectContaining({ type: 'invalid_request_error', code: 'key_invalid' }) },
    ])
    const down = await post((await boot({ errorFormat: 'stripe' }, downStore())).url, '/charges', { key })
    expect([down.status, down.headers.get('retry-after'), down.json()]).toEqual([
      503,
      '1',
      { error: expect.objectContaining({ type: 'api_error' }) },
    ])
    // Replays are never rewritten.
    expect((await post(stripe.url, '/charges', { key, body: { amount: 1 } })).headers.get('idempotent-replayed')).toBe('true')
  })

  it("writes the layer's own answers with an errorFormat function, keeping Retry-After", async () => {
    const own = await boot(
      {
        errorFormat: (answer) => ({
          headers: { 'x-error-code': answer.code },
          body: { errors: [{ code: answer.code, message: answer.detail }] },
        }),
      },
      downStore(),
    )
    const answer = await post(own.url, '/charges', { key: randomUUID() })
    expect([answer.status, answer.headers.get('retry-after'), answer.headers.get('x-error-code')]).toEqual([503, '1', 'STORE_UNAVAILABLE'])
    expect(answer.json()).toEqual({ errors: [{ code: 'STORE_UNAVAILABLE', message: expect.stringMatching(/Retry with the same/) }] })
  })

  it('fails open when configured: the handler runs unprotected while the store is down', async () => {
    const open = await boot({ failOpen: true }, downStore())
    const key = randomUUID()
    expect((await post(open.url, '/charges', { key })).status).toBe(201)
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('hashes an invalid JSON body as bytes instead of crashing, and keeps serving', async () => {
    const key = randomUUID()
    const bad = await post(app.url, '/status/201', { key, raw: '{"amount": 1,' })
    // Fastify rejects unparsable JSON itself, before the layer runs; the others run the handler.
    expect([201, 400]).toContain(bad.status)
    expect((await post(app.url, '/charges', { key: randomUUID() })).status).toBe(201)
  })

  it('answers 413 to a body larger than the layer reads', async () => {
    const huge = 'x'.repeat(200 * 1024)
    const answer = await post(app.url, '/charges', { key: randomUUID(), raw: JSON.stringify({ huge }) })
    // Express and Fastify's own body limits may answer first (also 413).
    expect(answer.status).toBe(413)
    expect((await post(app.url, '/charges', { key: randomUUID() })).status).toBe(201)
  })

  it('gives the handler its idempotency context', async () => {
    const key = randomUUID()
    const answer = await post(app.url, '/context', { key, headers: { authorization: 'Bearer t' } })
    expect(answer.json()).toMatchObject({ key, token: 1, takeover: false, scope: expect.stringMatching(/^cred:[0-9a-f]{32}$/) })
  })

  it("hands the scope function the framework's own request, and namespaces what it returns", async () => {
    const scoped = await boot({ scope: nativeTenant[name] as (req: unknown) => string | undefined })
    const key = randomUUID()
    const a = await post(scoped.url, '/context', { key, headers: { 'x-tenant': 'acme' } })
    expect(a.status).toBe(200)
    expect(a.json()).toMatchObject({ scope: 'fn:acme' })
    const b = await post(scoped.url, '/context', { key, headers: { 'x-tenant': 'globex' } })
    expect(b.headers.get('idempotent-replayed')).toBeNull()
    expect(b.json()).toMatchObject({ scope: 'fn:globex' })
    const again = await post(scoped.url, '/context', { key, headers: { 'x-tenant': 'acme' } })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
  })

  it('answers 500 problem when the scope function returns nothing, and never falls back to a shared scope', async () => {
    const events: unknown[] = []
    const scoped = await boot({ scope: nativeTenant[name] as (req: unknown) => string | undefined, onEvent: (e) => events.push(e) })
    const key = randomUUID()
    // Tenant A's request is stored under its own scope…
    expect((await post(scoped.url, '/charges', { key, headers: { 'x-tenant': 'a' } })).status).toBe(201)
    // …and a request whose scope function yields nothing must not replay it, nor run.
    for (const headers of [{}, { 'x-tenant': '' }] as Record<string, string>[]) {
      const answer = await post(scoped.url, '/charges', { key, headers })
      expectProblem(answer, 500, 'invalid-option')
      expect(answer.headers.get('idempotent-replayed')).toBeNull()
    }
    expect(state.executions('/charges', key)).toBe(1)
    expect(events).toContainEqual(expect.objectContaining({ type: 'config_error', key }))
  })

  it('gives one credential one scope whatever the case of its scheme (RFC 9110)', async () => {
    const key = randomUUID()
    await post(app.url, '/charges', { key, headers: { authorization: 'Bearer same-token' } })
    const again = await post(app.url, '/charges', { key, headers: { authorization: 'bearer   same-token' } })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('takes over a record whose holder died once its lease ends, and fences the dead holder out', async () => {
    const key = randomUUID()
    const body = '{"amount":100}'
    const fingerprint = requestFingerprint(
      { method: 'POST', url: '/context', headers: { 'content-type': 'application/json' }, body: async () => new Uint8Array(0) },
      new TextEncoder().encode(body),
    )
    // A holder that acquired the record and died: its 1 ms lease ends without renewal.
    const dead = await store.acquire('public', key, fingerprint, 1)
    expect(dead.kind).toBe('acquired')
    await new Promise((r) => setTimeout(r, 5))
    const answer = await post(app.url, '/context', { key, raw: body })
    expect(answer.status).toBe(200)
    expect(answer.json()).toMatchObject({ key, token: 2, takeover: true, scope: 'public' })
    const late = await store.complete(
      'public',
      key,
      1,
      { status: 'completed', response: { status: 200, headers: {}, body: new Uint8Array(0) } },
      60_000,
    )
    expect(late).toBe(false)
    expect((await post(app.url, '/context', { key, raw: body })).json()).toMatchObject({ token: 2 })
  })

  it('serves a slow client that sends its body in pieces', async () => {
    const key = randomUUID()
    const body = '{"amount":100,"slow":true}'
    const status = await rawExchange(app.url, [rawHead('/charges', key, body.length), body.slice(0, 10), body.slice(10)], 60)
    expect(status).toBe(201)
    expect((await post(app.url, '/charges', { key, raw: body })).headers.get('idempotent-replayed')).toBe('true')
  })

  it('survives a client that hangs up mid-request and leaves no record locked', async () => {
    const key = randomUUID()
    const status = await rawExchange(app.url, [rawHead('/charges', key, 100), '{"amount":'], 50, true)
    expect(status).toBe(0)
    const retry = await post(app.url, '/charges', { key })
    expect(retry.status).toBe(201)
    expect(retry.headers.get('idempotent-replayed')).toBeNull()
    expect(state.executions('/charges', key)).toBe(1)
  })

  it('stores the outcome of a request whose client hung up mid-response, and replays it', async () => {
    const key = randomUUID()
    const held = state.hold(key)
    const aborter = new AbortController()
    const first = fetch(`${app.url}/slow`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: '{"amount":100}',
      signal: aborter.signal,
    }).catch((error: unknown) => error)
    await held.started
    aborter.abort()
    await first
    held.release()
    // The retry waits for the first attempt to settle, then replays what it stored.
    const retry = await post(app.url, '/slow', { key })
    expect(retry.status).toBe(201)
    expect(retry.headers.get('idempotent-replayed')).toBe('true')
    expect(state.executions('/slow', key)).toBe(1)
  })

  it('in transactional mode answers only after the transaction committed', async () => {
    const store = new SlowCommitStore()
    const tx = await boot({ transactional: true }, store)
    const key = randomUUID()
    const answer = await post(tx.url, '/charges', { key })
    expect(answer.status).toBe(201)
    expect(store.committed.has(key)).toBe(true)
    expect((await post(tx.url, '/charges', { key })).headers.get('idempotent-replayed')).toBe('true')
  })

  it('in transactional mode answers 409 problem+json, not the rolled-back response, when the holder was fenced out', async () => {
    const store = new SlowCommitStore()
    store.fenceNext = true
    const tx = await boot({ transactional: true }, store)
    const key = randomUUID()
    const answer = await post(tx.url, '/charges', { key })
    expectProblem(answer, 409, 'fenced-out')
    expect(answer.text).not.toContain('ch_')
    expect(answer.headers.get('set-cookie')).toBeNull()
    expect(state.executions('/charges', key)).toBe(1)
  })
})

describe('HTTP conformance: idemkey proxy', () => {
  const children: ChildProcess[] = []
  const sent = new Map<string, Buffer[]>()
  const upstream = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      const kind = BINARY_KINDS[/^\/binary\/([\w-]+)$/.exec(req.url ?? '')?.[1] ?? '']
      if (!kind) return res.writeHead(404).end()
      const key = String(req.headers['idempotency-key'])
      const bytes = kind.bytes()
      sent.set(key, [...(sent.get(key) ?? []), bytes])
      res.writeHead(200, { 'content-type': kind.type })
      // In two writes, as a streaming upstream would.
      res.write(bytes.subarray(0, 7))
      res.end(bytes.subarray(7))
    })
  })
  let proxyUrl = ''
  beforeAll(async () => {
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
    const { port } = upstream.address() as AddressInfo
    const proxy = await startProxy(['--upstream', `http://127.0.0.1:${port}`, '--store', 'memory:'], children)
    proxyUrl = `http://127.0.0.1:${proxy.port}`
  })
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    upstream.closeAllConnections()
    await new Promise((resolve) => upstream.close(resolve))
  })

  it.each(Object.keys(BINARY_KINDS))('replays a %s body byte for byte, as the upstream sent it, with its content type', async (kind) => {
    const key = randomUUID()
    const first = await postForBytes(`${proxyUrl}/binary/${kind}`, key)
    const second = await postForBytes(`${proxyUrl}/binary/${kind}`, key)
    const upstreamSent = sent.get(key) ?? []
    expect(upstreamSent, 'the upstream ran once').toHaveLength(1)
    expect(first.status).toBe(200)
    expect(first.bytes.toString('hex')).toBe((upstreamSent[0] as Buffer).toString('hex'))
    expect(second.status).toBe(200)
    expect(second.headers.get('idempotent-replayed')).toBe('true')
    expect(second.bytes.toString('hex')).toBe(first.bytes.toString('hex'))
    expect(second.headers.get('content-type')).toBe(kind === 'invalid-utf8' ? first.headers.get('content-type') : BINARY_KINDS[kind]?.type)
  })
})
