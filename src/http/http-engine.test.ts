/** The engine's pieces on their own: key parsing, problems, the stored-header rules, fingerprints. */

import { MemoryStore } from '../backends/memory/memory-store.js'
import { canonicalJson } from '../core/fingerprint.js'
import { Ledger } from '../core/ledger.js'
import { IdempotencyError, isIdempotencyError } from '../errors.js'
import { parseKeyHeader } from '../protocol/key-header.js'
import { problem } from '../protocol/problem.js'
import { createEngine } from './engine.js'
import { requestFingerprint, storedHeaderSet, toStored } from './stored.js'
import type { HttpRequestLike } from './types.js'

const bytes = (text: string) => new TextEncoder().encode(text)
/** The JSON of a response's body: a problem's fields. */
const jsonOf = (response: { body: Uint8Array }) => JSON.parse(new TextDecoder().decode(response.body))
const req = (over: Partial<HttpRequestLike> = {}): HttpRequestLike => ({
  method: 'POST',
  url: '/orders',
  headers: { 'content-type': 'application/json' },
  body: async () => bytes('{}'),
  ...over,
})

describe('parseKeyHeader', () => {
  it('reads bare keys, sf-strings with escapes, and a single-element array', () => {
    expect(parseKeyHeader('abc-123')).toBe('abc-123')
    expect(parseKeyHeader('"abc-123"')).toBe('abc-123')
    expect(parseKeyHeader('"a\\"b\\\\c"')).toBe('a"b\\c')
    expect(parseKeyHeader(['k1'])).toBe('k1')
    expect(parseKeyHeader(undefined)).toBeUndefined()
  })

  it.each([
    ['empty', ''],
    ['too long', 'k'.repeat(256)],
    ['control character', 'a\u0001b'],
    ['non-ASCII', 'clé'],
    ['unterminated sf-string', '"abc'],
    ['sf-string list', '"a", "b"'],
    ['bad escape', '"a\\nb"'],
  ])('rejects a %s key with KEY_INVALID', (_name, value) => {
    let caught: unknown
    try {
      parseKeyHeader(value)
    } catch (error) {
      caught = error
    }
    expect(isIdempotencyError(caught) && caught.code).toBe('KEY_INVALID')
  })

  it('rejects the header given twice', () => {
    expect(() => parseKeyHeader(['a', 'b'])).toThrow(/more than once/)
  })

  it('names the header as configured in what it throws', () => {
    expect(() => parseKeyHeader(['a', 'b'], 'X-Idempotency-Key')).toThrow('The X-Idempotency-Key header was given more than once')
    expect(() => parseKeyHeader('"a', 'X-Idempotency-Key')).toThrow(/^The X-Idempotency-Key header is not a valid RFC 8941 string/)
  })
})

describe('problem', () => {
  it('answers RFC 9457 problem+json with a type URI under the configured base', () => {
    const answer = problem('IN_PROGRESS', 'still running', 'https://example.test/errors#', { 'retry-after': '3' })
    expect(answer.status).toBe(409)
    expect(answer.headers['content-type']).toBe('application/problem+json')
    expect(answer.headers['retry-after']).toBe('3')
    expect(jsonOf(answer)).toEqual({
      type: 'https://example.test/errors#in-progress',
      title: expect.any(String),
      status: 409,
      detail: 'still running',
      code: 'IN_PROGRESS',
    })
  })

  it('names the key header as configured in its title', () => {
    const title = (header?: string) => jsonOf(problem('KEY_MISSING', 'x', undefined, {}, header)).title
    expect(title()).toBe('Idempotency-Key required')
    expect(title('X-Idempotency-Key')).toBe('X-Idempotency-Key required')
  })
})

describe('stored headers', () => {
  it('never stores set-cookie, authorization, date or hop-by-hop headers, even when allowlisted', () => {
    const allow = storedHeaderSet(['Set-Cookie', 'Authorization', 'Date', 'Connection', 'X-Request-Cost'])
    const stored = toStored(
      {
        status: 201,
        headers: {
          'set-cookie': ['a=1'],
          authorization: 'x',
          date: 'now',
          connection: 'close',
          'x-request-cost': '3',
          'Content-Type': 'application/json',
        },
        body: bytes('{}'),
      },
      allow,
      1024,
    )
    expect(stored.headers).toEqual({ 'x-request-cost': '3', 'content-type': 'application/json' })
  })

  it('stores a body over the limit as empty with its length in a marker header', () => {
    const stored = toStored({ status: 200, headers: {}, body: bytes('x'.repeat(10)) }, storedHeaderSet(), 5)
    expect(stored.body.byteLength).toBe(0)
    expect(stored.headers['idempotent-body-omitted']).toBe('10')
  })
})

describe('requestFingerprint', () => {
  it('is the same for the same JSON in another key order and number spelling', () => {
    expect(requestFingerprint(req(), bytes('{"a":1,"b":[1,2]}'))).toBe(requestFingerprint(req(), bytes('{ "b": [1, 2.0], "a": 1e0 }')))
  })

  it('differs by method, path, query and body', () => {
    const base = requestFingerprint(req(), bytes('{"a":1}'))
    expect(requestFingerprint(req({ method: 'PATCH' }), bytes('{"a":1}'))).not.toBe(base)
    expect(requestFingerprint(req({ url: '/orders?x=1' }), bytes('{"a":1}'))).not.toBe(base)
    expect(requestFingerprint(req(), bytes('{"a":2}'))).not.toBe(base)
  })

  it('hashes invalid JSON as bytes instead of throwing', () => {
    expect(requestFingerprint(req(), bytes('{"a":'))).toMatch(/^[0-9a-f]{64}$/)
    expect(requestFingerprint(req(), bytes('{"a":'))).not.toBe(requestFingerprint(req(), bytes('{"a":}')))
  })

  it('hashes a framework-parsed body the same as its JSON bytes', () => {
    const parsed = { b: 2, a: 1 }
    expect(requestFingerprint(req({ parsedBody: parsed }), new Uint8Array(0))).toBe(requestFingerprint(req(), bytes(canonicalJson(parsed))))
  })
})

describe('createEngine', () => {
  it('refuses to start without a ledger', () => {
    expect(() => createEngine({} as never)).toThrow(/needs a Ledger/)
  })

  it('does not read the body of a request it does not cover', async () => {
    const engine = createEngine({ ledger: new Ledger({ store: new MemoryStore() }) })
    let read = false
    const decision = await engine.begin(
      req({
        method: 'GET',
        headers: { 'idempotency-key': 'k' },
        body: async () => {
          read = true
          return bytes('')
        },
      }),
    )
    expect(decision.kind).toBe('passthrough')
    expect(read).toBe(false)
  })

  it('applies only to covered methods that carry a key, or whose route requires one', () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    const engine = createEngine({ ledger })
    expect(engine.applies('POST', true)).toBe(true)
    expect(engine.applies('patch', true)).toBe(true)
    expect(engine.applies('POST', false)).toBe(false)
    expect(engine.applies('GET', true)).toBe(false)
    const required = createEngine({ ledger, required: true, methods: ['PUT'] })
    expect(required.applies('PUT', false)).toBe(true)
    expect(required.applies('POST', true)).toBe(false)
  })

  it('takes keyHeader case-insensitively, exposes it lower-cased, and refuses a name that is no header name', () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    expect(createEngine({ ledger }).keyHeader).toBe('idempotency-key')
    expect(createEngine({ ledger, keyHeader: 'X-Idempotency-Key' }).keyHeader).toBe('x-idempotency-key')
    for (const keyHeader of ['', 'Idempotency Key', 'key:', 'clé']) {
      expect(() => createEngine({ ledger, keyHeader })).toThrow(/keyHeader must be an HTTP header name/)
    }
  })

  it("refuses a scope, fingerprint, classify, onEvent or onReplay that is no function when made (a JavaScript app's scope: 'tenant-a' failed every request)", () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    for (const name of ['scope', 'fingerprint', 'classify', 'onEvent', 'onReplay']) {
      expect(() => createEngine({ ledger, [name]: 'tenant-a' }), name).toThrow(
        expect.objectContaining({
          code: 'INVALID_OPTION',
          message: `idempotency(): ${name} must be a function (e.g. ${name}: (…) => …), got a string of 8 characters.`,
        }),
      )
    }
    expect(() => createEngine({ ledger, scope: (r: { user?: string }) => r.user ?? 'anonymous' })).not.toThrow()
    // A name where a list is expected crashed with a TypeError.
    expect(() => createEngine({ ledger, methods: 'POST' as never })).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: `methods must be an array of names, e.g. methods: ['POST', 'PATCH'], got "POST".`,
      }),
    )
    expect(() => createEngine({ ledger, storedHeaders: ['location', ''] })).toThrow('storedHeaders must be an array of names')
    expect(createEngine({ ledger, methods: ['post', 'PUT'] })).toBeDefined()
  })

  it('calls onReplay only for replays, and sends what it set', async () => {
    const calls: string[] = []
    const engine = createEngine({
      ledger: new Ledger({ store: new MemoryStore() }),
      keyHeader: 'X-Key',
      onReplay: (request, response) => {
        calls.push(`${request.method} ${request.url} ${request.key} ${request.scope} ${response.status}`)
        response.headers['x-hooked'] = 'yes'
      },
    })
    const run = async () => ({ status: 201, headers: { 'content-type': 'text/plain' }, body: bytes('ran') })
    const request = () => req({ url: '/orders?a=1', headers: { 'x-key': 'k1' } })
    const first = await engine.handle(request(), run)
    expect(first.headers['x-hooked']).toBeUndefined()
    expect(calls).toEqual([])
    const replay = await engine.handle(request(), run)
    expect(replay.headers).toEqual({ 'content-type': 'text/plain', 'idempotent-replayed': 'true', 'x-hooked': 'yes' })
    expect(calls).toEqual(['POST /orders?a=1 k1 public 201'])
  })

  it('answers 413 when the body is larger than maxRequestBody, before touching the ledger', async () => {
    const store = new MemoryStore()
    const engine = createEngine({ ledger: new Ledger({ store }), maxRequestBody: 4 })
    const { readWebBody } = await import('./node-body.js')
    const body = new Blob(['0123456789']).stream()
    const response = await engine.handle(
      req({ headers: { 'idempotency-key': 'k', 'content-type': 'text/plain' }, body: (limit) => readWebBody(body, null, limit) }),
      async () => ({ status: 201, headers: {}, body: bytes('ran') }),
    )
    expect(response.status).toBe(413)
    expect((await store.list({})).length).toBe(0)
  })
})

describe('createEngine: how each covered request is answered and reported', () => {
  type Event = { type: string; key?: string; outcome?: string; status?: number }
  const run = async () => ({ status: 201, headers: { 'content-type': 'text/plain' }, body: bytes('ran') })
  function watched(options: Partial<Parameters<typeof createEngine>[0]> = {}, store = new MemoryStore()) {
    const events: Event[] = []
    const engine = createEngine({
      ledger: new Ledger({ store }),
      onEvent: (event) => events.push(event as Event),
      ...options,
    })
    const answered = () => events.filter((e) => e.type === 'answered').map((e) => `${e.key} ${e.outcome} ${e.status}`)
    return { engine, events, answered, store }
  }

  it('passes a request without a key through unless the route requires one, which is a 400 naming the method and path', async () => {
    const optional = watched()
    expect((await optional.engine.begin(req({ headers: {} }))).kind).toBe('passthrough')
    expect(optional.answered()).toEqual([])

    const required = watched({ required: true })
    const response = await required.engine.handle(req({ method: 'post', url: '/orders?draft=1', headers: {} }), run)
    expect(response.status).toBe(400)
    expect(jsonOf(response)).toMatchObject({ code: 'KEY_MISSING' })
    expect(jsonOf(response).detail).toMatch(/^POST \/orders requires an Idempotency-Key header/)
    // A request whose key did not parse is reported with the key ''.
    expect(required.answered()).toEqual([' rejected 400'])
  })

  it('answers 500 INVALID_OPTION and reports it when the scope function is misconfigured, and rethrows its other errors', async () => {
    const misconfigured = watched({
      scope: () => {
        throw new IdempotencyError('INVALID_OPTION', 'scope must return a string')
      },
    })
    const response = await misconfigured.engine.handle(req({ headers: { 'idempotency-key': 'k1' } }), run)
    expect(response.status).toBe(500)
    expect(jsonOf(response)).toMatchObject({ code: 'INVALID_OPTION' })
    expect(misconfigured.events.map((e) => e.type)).toEqual(['config_error', 'answered'])
    expect(misconfigured.answered()).toEqual(['k1 rejected 500'])

    const broken = watched({
      scope: async () => {
        throw new TypeError('the session store is down')
      },
    })
    await expect(broken.engine.begin(req({ headers: { 'idempotency-key': 'k1' } }))).rejects.toThrow('the session store is down')
  })

  it('awaits an async scope: two tenants with one key are two requests', async () => {
    const { engine, store } = watched({ scope: async (request) => String((request as HttpRequestLike).headers['x-tenant']) })
    for (const tenant of ['a', 'b']) {
      const response = await engine.handle(req({ headers: { 'idempotency-key': 'k1', 'x-tenant': tenant } }), run)
      expect(response.status).toBe(201)
      expect(response.headers['idempotent-replayed']).toBeUndefined()
    }
    expect((await store.list({})).map((record) => record.scope).sort()).toEqual(['fn:a', 'fn:b'])
  })

  it('refuses a framework-parsed body by its Content-Length above maxRequestBody, never at it, and never reads the raw body', async () => {
    const { engine, answered, store } = watched({ maxRequestBody: 10 })
    let read = 0
    const parsed = (length: string) =>
      req({
        headers: { 'idempotency-key': `k${length}`, 'content-type': 'application/json', 'content-length': length },
        parsedBody: { amount: 1 },
        body: async () => {
          read++
          return bytes('{"amount":1}')
        },
      })
    const over = await engine.handle(parsed('11'), run)
    expect(over.status).toBe(413)
    expect(jsonOf(over)).toMatchObject({ code: 'BODY_TOO_LARGE' })
    expect(jsonOf(over).detail).toMatch(/larger than 10 bytes/)
    expect((await engine.handle(parsed('10'), run)).status).toBe(201)
    expect(read).toBe(0)
    expect(answered()).toEqual(['k11 rejected 413', 'k10 executed 201'])
    expect((await store.list({})).length).toBe(1)
  })

  it('reports a store that is down as store_unavailable with the 503 it answers', async () => {
    const down = new MemoryStore()
    down.acquire = async () => {
      throw new IdempotencyError('STORE_UNAVAILABLE', 'connect ECONNREFUSED 127.0.0.1:5432')
    }
    const { engine, answered } = watched({}, down)
    const response = await engine.handle(req({ headers: { 'idempotency-key': 'k1' } }), run)
    expect(response.status).toBe(503)
    expect(answered()).toEqual(['k1 store_unavailable 503'])
  })

  it("finish returns the handler's response when it was kept, and 409 FENCED_OUT when a takeover's answer counts instead", async () => {
    const { engine, answered, store } = watched()
    const first = await engine.begin(req({ headers: { 'idempotency-key': 'k1' } }))
    if (first.kind !== 'execute') throw new Error(`expected execute, got ${first.kind}`)
    const kept = await first.finish(await run())
    expect(kept.status).toBe(201)
    expect(new TextDecoder().decode(kept.body)).toBe('ran')

    // A holder whose record was taken over: its complete is fenced out, so its own answer is not sent.
    const stale = await engine.begin(req({ headers: { 'idempotency-key': 'k2' } }))
    if (stale.kind !== 'execute') throw new Error(`expected execute, got ${stale.kind}`)
    const record = (await store.list({})).find((r) => r.key === 'k2')
    // The first attempt of a fresh record holds token 1; releasing it lets the next request take over.
    expect(await store.release(record?.scope as string, 'k2', 1)).toBe(true)
    const takeover = await engine.begin(req({ headers: { 'idempotency-key': 'k2' } }))
    if (takeover.kind !== 'execute') throw new Error(`expected execute, got ${takeover.kind}`)
    const fenced = await stale.finish(await run())
    expect(fenced.status).toBe(409)
    expect(jsonOf(fenced)).toMatchObject({ code: 'FENCED_OUT' })
    expect(answered()).toEqual(['k1 executed 201', 'k2 executed 409'])
  })
})

describe('docs/errors.md', () => {
  it('has a section for every problem type the layer answers', async () => {
    const { readFileSync } = await import('node:fs')
    const page = readFileSync(new URL('../../docs/errors.md', import.meta.url), 'utf8')
    const headings = new Set([...page.matchAll(/^## ([a-z-]+)$/gm)].map((m) => m[1]))
    const codes = [
      'KEY_INVALID',
      'KEY_MISSING',
      'FINGERPRINT_MISMATCH',
      'IN_PROGRESS',
      'FENCED_OUT',
      'BODY_TOO_LARGE',
      'STORE_UNAVAILABLE',
      'STORE_SCHEMA',
      'SCOPE_INVALID',
    ] as const
    for (const code of codes) {
      const type = jsonOf(problem(code, 'x')).type as string
      expect(headings.has(type.split('#')[1])).toBe(true)
    }
  })
})
