import fc from 'fast-check'
import { IdempotentRequestError } from './errors.js'
import { createIdempotentFetch, type FetchLike, idempotencyInfo, type ResponseEvent, type RetryEvent } from './idempotent-fetch.js'

/** A fetch double that answers from a plan (a status, or 'reset' for a network error) and records what it was sent. */
function scripted(plan: Array<number | 'reset'>) {
  const sent: Array<{ url: string; init: RequestInit; key: string | null }> = []
  const fetch: FetchLike = async (input, init = {}) => {
    sent.push({ url: String(input), init, key: new Headers(init.headers).get('idempotency-key') })
    const step = plan[sent.length - 1] ?? 201
    if (step === 'reset') throw new TypeError('fetch failed')
    return new Response(step === 204 ? null : 'x', { status: step })
  }
  return { fetch, sent }
}

const noWait = { sleep: async () => {} }

describe('createIdempotentFetch with a fetch double', () => {
  it('keeps one key across the retries of one call and never repeats it across calls (property)', async () => {
    const seen = new Set<string>()
    const step = fc.constantFrom<number | 'reset'>('reset', 500, 502, 503, 504, 408, 409, 425, 429)
    const plans = fc.tuple(fc.array(step, { maxLength: 7 }), fc.constantFrom(200, 201, 204, 400, 422))
    await fc.assert(
      fc.asyncProperty(plans, async ([retries, last]) => {
        const { fetch, sent } = scripted([...retries, last])
        const client = createIdempotentFetch({ fetch, maxAttempts: 8, throwOnError: false, ...noWait })
        const response = await client('http://127.0.0.1:9/charges', { method: 'POST', body: '{}' })
        const keys = new Set(sent.map((s) => s.key))
        expect(keys.size).toBe(1)
        const key = sent[0]?.key as string
        expect(seen.has(key)).toBe(false)
        seen.add(key)
        expect(sent).toHaveLength(retries.length + 1)
        expect(idempotencyInfo(response)).toEqual({ key, attempts: retries.length + 1, replayed: false })
      }),
      { numRuns: 300 },
    )
  })

  it('passes uncovered methods straight through, without a key and without retries', async () => {
    const { fetch, sent } = scripted([503, 503, 503])
    const client = createIdempotentFetch({ fetch, ...noWait })
    for (const method of ['GET', 'PUT', 'DELETE']) expect((await client('http://127.0.0.1:9/x', { method })).status).toBe(503)
    expect(sent.map((s) => s.key)).toEqual([null, null, null])
  })

  it('covers the configured methods, any case, and a call that brings its own idempotencyKey', async () => {
    const { fetch, sent } = scripted([])
    const client = createIdempotentFetch({ fetch, methods: ['put'], ...noWait })
    await client('http://127.0.0.1:9/x', { method: 'Put' })
    await client('http://127.0.0.1:9/x', { method: 'POST' })
    await client('http://127.0.0.1:9/x', { method: 'DELETE', idempotencyKey: 'delete-1' })
    expect(sent.map((s) => [s.init.method, s.key !== null])).toEqual([
      ['PUT', true],
      ['POST', false],
      ['DELETE', true],
    ])
    expect(sent[2]?.key).toBe('delete-1')
  })

  it("uses the caller's Idempotency-Key header, and a pluggable generator otherwise", async () => {
    const { fetch, sent } = scripted([])
    let n = 0
    const client = createIdempotentFetch({ fetch, generateKey: () => `gen-${++n}`, ...noWait })
    await client('http://127.0.0.1:9/x', { method: 'POST', headers: { 'Idempotency-Key': 'mine' } })
    await client('http://127.0.0.1:9/x', { method: 'POST' })
    expect(sent.map((s) => s.key)).toEqual(['mine', 'gen-1'])
  })

  it('calls onRetry before each wait and onResponse for each response; a throwing hook changes nothing', async () => {
    const { fetch } = scripted([503, 'reset', 201])
    const retries: RetryEvent[] = []
    const responses: ResponseEvent[] = []
    const client = createIdempotentFetch({
      fetch,
      random: () => 0,
      ...noWait,
      onRetry: (event) => {
        retries.push(event)
        throw new Error('broken logger')
      },
      onResponse: (event) => {
        responses.push(event)
        throw new Error('broken metrics')
      },
    })
    const response = await client('http://127.0.0.1:9/charges', { method: 'POST', idempotencyKey: 'k1' })
    expect(response.status).toBe(201)
    expect(retries.map((e) => [e.attempt, e.response?.status, (e.error as Error | undefined)?.message, e.key, e.method])).toEqual([
      [1, 503, undefined, 'k1', 'POST'],
      [2, undefined, 'fetch failed', 'k1', 'POST'],
    ])
    expect(responses.map((e) => [e.attempts, e.response.status, e.url])).toEqual([
      [1, 503, 'http://127.0.0.1:9/charges'],
      [3, 201, 'http://127.0.0.1:9/charges'],
    ])
  })

  it('reports a replay from the Idempotent-Replayed header', async () => {
    const fetch: FetchLike = async () => new Response('{}', { status: 201, headers: { 'idempotent-replayed': 'true' } })
    const response = await createIdempotentFetch({ fetch })('http://127.0.0.1:9/x', { method: 'POST' })
    expect(idempotencyInfo(response)?.replayed).toBe(true)
  })

  it('throws RETRIES_EXHAUSTED with the last network error as cause when no attempt got a response', async () => {
    const { fetch } = scripted(['reset', 'reset', 'reset'])
    const error = await createIdempotentFetch({ fetch, maxAttempts: 3, throwOnError: false, ...noWait })('http://127.0.0.1:9/x', {
      method: 'POST',
      idempotencyKey: 'k2',
    }).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(IdempotentRequestError)
    expect(error).toMatchObject({ code: 'RETRIES_EXHAUSTED', attempts: 3, key: 'k2', status: undefined })
    expect(((error as Error).cause as Error).message).toBe('fetch failed')
  })

  it('carries the fields of a Request input (redirect, credentials) to every attempt', async () => {
    const { fetch, sent } = scripted([503])
    const request = new Request('http://127.0.0.1:9/x', { method: 'POST', body: 'hi', redirect: 'manual', credentials: 'omit' })
    await createIdempotentFetch({ fetch, ...noWait })(request)
    expect(sent.map((s) => [s.url, s.init.redirect, s.init.credentials])).toEqual([
      ['http://127.0.0.1:9/x', 'manual', 'omit'],
      ['http://127.0.0.1:9/x', 'manual', 'omit'],
    ])
    expect(sent.map((s) => new TextDecoder().decode(s.init.body as Uint8Array))).toEqual(['hi', 'hi'])
  })

  it('looks up globalThis.fetch at call time when no fetch is given', async () => {
    const { fetch, sent } = scripted([])
    const original = globalThis.fetch
    const client = createIdempotentFetch()
    globalThis.fetch = fetch as typeof globalThis.fetch
    try {
      await client('http://127.0.0.1:9/x', { method: 'POST' })
    } finally {
      globalThis.fetch = original
    }
    expect(sent).toHaveLength(1)
  })

  it('refuses options it cannot use, saying which', () => {
    expect(() => createIdempotentFetch({ maxAttempts: 0 })).toThrow(/maxAttempts/)
    expect(() => createIdempotentFetch({ maxAttempts: Number.NaN })).toThrow(/maxAttempts/)
    expect(() => createIdempotentFetch({ maxElapsed: 'soon' })).toThrow(/maxElapsed/)
    expect(() => createIdempotentFetch({ attemptTimeout: 0 })).toThrow(/attemptTimeout must be longer than 0/)
    // A hook or list of the wrong shape was taken, and the first request failed with a TypeError.
    expect(() => createIdempotentFetch({ fetch: 'https://api.example' as never })).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: expect.stringContaining('createIdempotentFetch(): fetch must be a function'),
      }),
    )
    expect(() => createIdempotentFetch({ onRetry: true as never })).toThrow('onRetry must be a function')
    expect(() => createIdempotentFetch({ methods: 'POST' as never })).toThrow(
      `methods must be an array of names, e.g. methods: ['POST', 'PATCH'], got "POST".`,
    )
  })
})
