/**
 * The engine's parts through createEngine: how its options are checked and applied (engine-config.ts),
 * how it answers what does not run the handler and what it reports (engine-answers.ts), and the
 * `transactional: true` path (engine-transaction.ts), on the memory store and a transactional one.
 */

import { TxMemoryStore } from '../../test/helpers/tx-memory-store.js'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { ManualClock } from '../core/clock.js'
import { Ledger } from '../core/ledger.js'
import type { Outcome } from '../core/store.js'
import { IdempotencyError, isIdempotencyError } from '../errors.js'
import { createEngine } from './engine.js'
import type { Decision, EngineEvent, EngineOptions, HttpRequestLike, HttpResponseLike, IdempotencyContext } from './types.js'

const bytes = (text: string) => new TextEncoder().encode(text)
const text = (response: HttpResponseLike) => new TextDecoder().decode(response.body)
/** The JSON of a response's body: a problem's fields. */
const jsonOf = (response: HttpResponseLike) => JSON.parse(text(response))
const SECRET = 'a-long-random-scope-secret-for-tests'

/** A covered POST with the key `key` (in `header`, Idempotency-Key by default). */
const post = (key: string, over: Partial<HttpRequestLike> = {}, header = 'idempotency-key'): HttpRequestLike => ({
  method: 'POST',
  url: '/orders',
  headers: { 'content-type': 'application/json', [header]: key },
  body: async () => bytes('{"amount":100}'),
  ...over,
})
const created = (body = 'ran'): HttpResponseLike => ({ status: 201, headers: { 'content-type': 'text/plain' }, body: bytes(body) })
const run = async () => created()

function expectExecute(decision: Decision): Extract<Decision, { kind: 'execute' }> {
  if (decision.kind !== 'execute') throw new Error(`expected execute, got ${decision.kind}`)
  return decision
}
function expectRespond(decision: Decision): Extract<Decision, { kind: 'respond' }> {
  if (decision.kind !== 'respond') throw new Error(`expected respond, got ${decision.kind}`)
  return decision
}

/** The transaction a handler writes on (TxStore's). */
function txOf(ctx: IdempotencyContext | undefined): string[] {
  if (!Array.isArray(ctx?.tx)) throw new Error('the handler got no transaction')
  return ctx.tx as string[]
}

/** Fails, instead of hanging the suite, when `promise` does not settle within `ms`. */
function within<T>(promise: Promise<T>, ms = 2_000): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`did not settle within ${ms}ms`)), ms)
  })
  return Promise.race([promise, late]).finally(() => clearTimeout(timer))
}

/** What thrown, for asserting an error's code and message together. */
function thrownBy(fn: () => unknown): unknown {
  try {
    fn()
  } catch (error) {
    return error
  }
  throw new Error('expected it to throw')
}

/** An engine on a memory store, with every event it reports. */
function watched(options: Partial<EngineOptions> = {}, store: MemoryStore = new MemoryStore(), clock?: ManualClock) {
  const events: EngineEvent[] = []
  const engine = createEngine({
    ledger: new Ledger({ store, clock }),
    scopeSecret: SECRET,
    onEvent: (event) => events.push(event),
    ...options,
  })
  const answered = () => events.flatMap((e) => (e.type === 'answered' ? [`${e.key} ${e.outcome} ${e.status}`] : []))
  return { engine, events, answered, store }
}

/**
 * The transactional memory store of test/helpers: the handler's writes (pushed onto `tx`) are kept only when
 * the transaction commits. `fenceNext` makes the next completion lose its token check; `failCommit`
 * makes COMMIT itself fail, as a dropped connection would.
 */
class TxStore extends TxMemoryStore {
  fenceNext = false
  failCommit = false
  override transaction<R>(fn: (tx: string[]) => Promise<R>): Promise<R> {
    return super.transaction(async (tx) => {
      const result = await fn(tx)
      if (this.failCommit) throw new Error('COMMIT failed: server closed the connection unexpectedly (10.1.2.3:5432)')
      return result
    })
  }
  override completeInTransaction(
    tx: string[],
    scope: string,
    key: string,
    token: number,
    outcome: Outcome,
    ttlMs: number,
  ): Promise<boolean> {
    if (this.fenceNext) return Promise.resolve(false)
    return super.completeInTransaction(tx, scope, key, token, outcome, ttlMs)
  }
}

describe('createEngine: its options', () => {
  it('refuses no options, a missing ledger, a store given as the ledger, or an object without begin and run, with INVALID_OPTION', () => {
    const store = new MemoryStore()
    const notLedgers: unknown[] = [
      undefined,
      {},
      { ledger: store },
      { ledger: { run: async () => undefined } },
      { ledger: { begin: async () => undefined } },
    ]
    for (const options of notLedgers) {
      const error = thrownBy(() => createEngine(options as never))
      expect(isIdempotencyError(error) && error.code).toBe('INVALID_OPTION')
      expect((error as Error).message).toBe('idempotency({ ledger }) needs a Ledger: new Ledger({ store }).')
    }
  })

  it('refuses transactional: true on a store without transactions with INVALID_OPTION, at start-up', () => {
    const error = thrownBy(() => createEngine({ ledger: new Ledger({ store: new MemoryStore() }), transactional: true }))
    expect(isIdempotencyError(error) && error.code).toBe('INVALID_OPTION')
    expect((error as Error).message).toMatch(/^transactional: true needs a store that runs transactions/)
    expect(() => createEngine({ ledger: new Ledger({ store: new TxStore() }), scopeSecret: SECRET, transactional: true })).not.toThrow()
  })

  it('names the option in the error for a wait, lease or ttl that is no duration', () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    for (const name of ['wait', 'lease', 'ttl'] as const) {
      const error = thrownBy(() => createEngine({ ledger, scopeSecret: SECRET, [name]: 'soon' }))
      expect(isIdempotencyError(error) && error.code).toBe('INVALID_OPTION')
      expect((error as Error).message).toMatch(new RegExp(`^${name} "soon" is not a duration`))
    }
  })

  it('refuses a maxRequestBody or maxStoredBody that is not a whole number of bytes, 0 or more, with INVALID_OPTION', () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    for (const name of ['maxRequestBody', 'maxStoredBody'] as const) {
      for (const bad of [-1, Number.NaN, 1.5, Number.POSITIVE_INFINITY, '1mb']) {
        const error = thrownBy(() => createEngine({ ledger, scopeSecret: SECRET, [name]: bad as number }))
        expect(isIdempotencyError(error) && error.code).toBe('INVALID_OPTION')
        expect((error as Error).message).toMatch(new RegExp(`^${name} must be a whole number of bytes, 0 or more`))
      }
      expect(() => createEngine({ ledger, scopeSecret: SECRET, [name]: 0 })).not.toThrow()
    }
  })

  it('puts problem types under problemBaseUrl when given, and under the docs otherwise', async () => {
    const custom = watched({ problemBaseUrl: 'https://api.example.test/problems/', required: true })
    const missing = await custom.engine.handle(post('', { headers: {} }), run)
    expect(jsonOf(missing).type).toBe('https://api.example.test/problems/key-missing')

    const plain = watched({ required: true })
    expect(jsonOf(await plain.engine.handle(post('', { headers: {} }), run)).type).toBe('https://idemkey.dev/docs/errors#key-missing')
  })

  it('warns about a missing scope secret only for the default scope, never with a scope function or a front end scope', async () => {
    // Fresh modules: the warning is said once per process, so none of this file's other engines may have said it.
    vi.resetModules()
    vi.stubEnv('IDEMKEY_SCOPE_SECRET', '')
    const warn = vi.spyOn(process, 'emitWarning').mockImplementation(() => {})
    try {
      const fresh = await import('./engine.js')
      const ledger = new Ledger({ store: new MemoryStore() })
      fresh.createEngine({ ledger, scope: () => 'tenant-1' })
      fresh.createEngine({ ledger }, { scopeOf: () => 'header:tenant-1' })
      expect(warn).not.toHaveBeenCalled()
      fresh.createEngine({ ledger })
      expect(warn).toHaveBeenCalledTimes(1)
      expect(warn.mock.calls[0]?.[1]).toMatchObject({ code: 'IDEMKEY_NO_SCOPE_SECRET' })
    } finally {
      warn.mockRestore()
      vi.unstubAllEnvs()
    }
  })

  it("waits as long as the engine's wait, not the ledger's: a duplicate sent while the first runs gets its replay", async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    // The ledger alone would answer a duplicate 409 at once.
    const engine = createEngine({ ledger: new Ledger({ store, clock, wait: 0 }), scopeSecret: SECRET, wait: '5s' })
    const first = expectExecute(await engine.begin(post('k1')))
    let duplicateSettled = false
    const duplicate = engine.begin(post('k1')).then((decision) => {
      duplicateSettled = true
      return decision
    })
    await new Promise((resolve) => setTimeout(resolve, 20))
    expect(duplicateSettled).toBe(false)
    await first.finish(created('first'))
    const replay = expectRespond(await within(duplicate))
    expect(replay.outcome).toBe('replayed')
    expect(text(replay.response)).toBe('first')
  })

  it("holds a key for the engine's lease, not the ledger's: Retry-After never points past the lease's end", async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const ledger = new Ledger({ store, clock, wait: 0 })
    // The ledger's own lease (30 s) asks a duplicate to come back in 2 s, the longest hint.
    const long = createEngine({ ledger, scopeSecret: SECRET })
    expectExecute(await long.begin(post('long')))
    const longBusy = expectRespond(await long.begin(post('long')))
    expect(longBusy.response.status).toBe(409)
    expect(longBusy.outcome).toBe('in_progress')
    expect(longBusy.response.headers['retry-after']).toBe('2')

    // A 1 s lease ends sooner than that.
    const short = createEngine({ ledger, scopeSecret: SECRET, lease: '1s' })
    expectExecute(await short.begin(post('short')))
    expect(expectRespond(await short.begin(post('short'))).response.headers['retry-after']).toBe('1')
  })

  it("keeps an outcome for the engine's ttl, not the ledger's: past it, the key runs anew", async () => {
    const clock = new ManualClock()
    const store = new MemoryStore({ clock })
    const engine = createEngine({ ledger: new Ledger({ store, clock }), scopeSecret: SECRET, ttl: '1m' })
    expect((await engine.handle(post('k1'), run)).headers['idempotent-replayed']).toBeUndefined()
    clock.advance(59_000)
    expect((await engine.handle(post('k1'), run)).headers['idempotent-replayed']).toBe('true')
    clock.advance(2_000)
    const again = await engine.handle(post('k1'), async () => created('ran again'))
    expect(again.headers['idempotent-replayed']).toBeUndefined()
    expect(text(again)).toBe('ran again')
  })
})

describe('createEngine: answers that do not run the handler', () => {
  it('answers a duplicate still in flight 409 IN_PROGRESS, naming the key header and key, with Retry-After', async () => {
    const { engine, answered } = watched({ keyHeader: 'X-Request-Key', wait: 0 })
    const first = expectExecute(await engine.begin(post('order-7', {}, 'x-request-key')))
    const busy = expectRespond(await engine.begin(post('order-7', {}, 'x-request-key')))
    expect(busy.response.status).toBe(409)
    expect(busy.response.headers['retry-after']).toBe('2')
    expect(jsonOf(busy.response)).toMatchObject({
      code: 'IN_PROGRESS',
      detail: 'A request with the X-Request-Key "order-7" is still being processed. Retry after the Retry-After delay with the same key.',
    })
    await first.finish(created())
    expect(answered()).toEqual(['order-7 in_progress 409', 'order-7 executed 201'])
  })

  it.each(['STORE_UNAVAILABLE', 'STORE_SCHEMA'] as const)(
    'answers a store failure with %s 503 and Retry-After, telling the client what to do and not what the store said',
    async (code) => {
      const store = new MemoryStore()
      store.acquire = async () => {
        throw new IdempotencyError(code, 'relation "idemkey_records" does not exist (role "billing_rw" at 10.1.2.3)')
      }
      const { engine, answered } = watched({ keyHeader: 'X-Request-Key' }, store)
      const decision = expectRespond(await engine.begin(post('k1', {}, 'x-request-key')))
      expect(decision.outcome).toBe('store_unavailable')
      expect(decision.response.status).toBe(503)
      expect(decision.response.headers['retry-after']).toBe('1')
      expect(jsonOf(decision.response)).toMatchObject({
        code,
        detail:
          'The idempotency store is unavailable right now, so this request was not run. Retry with the same X-Request-Key after the Retry-After delay.',
      })
      expect(text(decision.response)).not.toContain('billing_rw')
      expect(answered()).toEqual(['k1 store_unavailable 503'])
    },
  )

  it('rejects a bad key with a 400 whose outcome is rejected', async () => {
    const { engine, answered } = watched()
    const decision = expectRespond(await engine.begin(post('"unterminated')))
    expect(decision.outcome).toBe('rejected')
    expect(decision.response.status).toBe(400)
    expect(jsonOf(decision.response)).toMatchObject({ code: 'KEY_INVALID' })
    expect(answered()).toEqual([' rejected 400'])
  })

  it('answers 400 SCOPE_INVALID when the scope function returns a scope the store cannot hold, and reports it as rejected, not as a store outage', async () => {
    const { engine, answered } = watched({ scope: () => 'tenant\nwith a line break' })
    const decision = expectRespond(await engine.begin(post('k1')))
    expect(decision.outcome).toBe('rejected')
    expect(decision.response.status).toBe(400)
    expect(jsonOf(decision.response)).toMatchObject({
      code: 'SCOPE_INVALID',
      detail: expect.stringMatching(/^Scope must be 1-255 characters/),
    })
    expect(answered()).toEqual(['k1 rejected 400'])
  })

  it("rethrows an application's own error even when its code is one of idemkey's", async () => {
    const lookupFailed = Object.assign(new Error('tenant lookup failed'), { code: 'STORE_UNAVAILABLE' })
    const { engine, answered } = watched({
      scope: async () => {
        throw lookupFailed
      },
    })
    await expect(engine.begin(post('k1'))).rejects.toBe(lookupFailed)
    expect(answered()).toEqual([])
  })

  it('without onEvent, says a misconfigured scope once on the console, however many requests it fails', async () => {
    const logged = vi.spyOn(console, 'error').mockImplementation(() => {})
    try {
      const engine = createEngine({ ledger: new Ledger({ store: new MemoryStore() }), scope: () => '' })
      for (const key of ['k1', 'k2']) {
        const response = await engine.handle(post(key), run)
        expect(response.status).toBe(500)
        expect(jsonOf(response)).toMatchObject({ code: 'INVALID_OPTION' })
      }
      expect(logged.mock.calls).toEqual([
        [expect.stringMatching(/^idemkey: The idempotency scope function returned an empty string for this request\./)],
      ])
    } finally {
      logged.mockRestore()
    }
  })

  it('with onEvent, reports each misconfigured request to it and nothing to the console', async () => {
    const logged = vi.spyOn(console, 'error').mockImplementation(() => {})
    try {
      const { engine, events } = watched({ scope: () => '' })
      await engine.handle(post('k1'), run)
      await engine.handle(post('k2'), run)
      expect(events.flatMap((e) => (e.type === 'config_error' ? [e.key] : []))).toEqual(['k1', 'k2'])
      expect(logged).not.toHaveBeenCalled()
    } finally {
      logged.mockRestore()
    }
  })

  it('reports durationMs from the request reaching the layer to its answer, to the hundredth of a millisecond', async () => {
    let nowMs = 1_000
    const now = vi.spyOn(performance, 'now').mockImplementation(() => nowMs)
    try {
      const { engine, events } = watched()
      const decision = expectExecute(await engine.begin(post('k1')))
      nowMs = 1_012.3456
      await decision.finish(created())
      expect(events.filter((e) => e.type === 'answered')).toEqual([
        { type: 'answered', key: 'k1', outcome: 'executed', status: 201, durationMs: 12.35 },
      ])
    } finally {
      now.mockRestore()
    }
  })

  it('answers 409 FENCED_OUT naming the key when a takeover made this answer not the one kept', async () => {
    const { engine, store } = watched({ keyHeader: 'X-Request-Key' })
    const stale = expectExecute(await engine.begin(post('k2', {}, 'x-request-key')))
    const record = (await store.list({})).find((r) => r.key === 'k2')
    expect(await store.release(record?.scope as string, 'k2', 1)).toBe(true)
    expectExecute(await engine.begin(post('k2', {}, 'x-request-key')))
    const fenced = await stale.finish(created())
    expect(fenced.status).toBe(409)
    expect(fenced.headers['retry-after']).toBe('1')
    expect(jsonOf(fenced)).toMatchObject({
      code: 'FENCED_OUT',
      detail:
        'Another attempt with the X-Request-Key "k2" took over while this one ran, so this one\'s answer was not kept. Retry with the same key to get the outcome that counts.',
    })
  })
})

describe('createEngine with transactional: true', () => {
  function transactional(options: Partial<EngineOptions> = {}, store = new TxStore()) {
    return { ...watched({ transactional: true, ...options }, store), store }
  }

  it("runs the handler inside the record's transaction: its writes commit with the record, and a duplicate replays", async () => {
    const { engine, store, answered } = transactional()
    const decision = expectExecute(await within(engine.begin(post('k1'))))
    expect(decision.context).toMatchObject({ key: 'k1', token: 1, takeover: false })
    expect(Array.isArray(decision.context.tx)).toBe(true)
    txOf(decision.context).push('insert order 1')
    const sent = await within(decision.finish(created('order 1')))
    expect(sent.status).toBe(201)
    expect(text(sent)).toBe('order 1')
    expect(store.committed).toEqual(['insert order 1'])

    const replay = expectRespond(await within(engine.begin(post('k1'))))
    expect(replay.outcome).toBe('replayed')
    expect(text(replay.response)).toBe('order 1')
    expect(answered()).toEqual(['k1 executed 201', 'k1 replayed 201'])
  })

  it('answers 503 STORE_UNAVAILABLE when the store is down before the handler runs', async () => {
    const store = new TxStore()
    store.acquire = async () => {
      throw new IdempotencyError('STORE_UNAVAILABLE', 'connect ECONNREFUSED 10.1.2.3:5432')
    }
    const { engine, answered } = transactional({}, store)
    const decision = expectRespond(await within(engine.begin(post('k1'))))
    expect(decision.outcome).toBe('store_unavailable')
    expect(decision.response.status).toBe(503)
    expect(jsonOf(decision.response)).toMatchObject({ code: 'STORE_UNAVAILABLE' })
    expect(answered()).toEqual(['k1 store_unavailable 503'])
  })

  it('rolls back the writes of a handler that threw, and frees the key for the retry', async () => {
    const { engine, store } = transactional({ wait: 0 })
    const failure = new Error('payment provider timed out')
    await expect(
      within(
        engine.handle(post('k1'), async (ctx) => {
          txOf(ctx).push('insert order (first try)')
          throw failure
        }),
      ),
    ).rejects.toBe(failure)
    const retry = await within(
      engine.handle(post('k1'), async (ctx) => {
        txOf(ctx).push('insert order (retry)')
        return created('retried')
      }),
    )
    expect(retry.status).toBe(201)
    expect(text(retry)).toBe('retried')
    expect(store.committed).toEqual(['insert order (retry)'])
  })

  it("answers 503 STORE_UNAVAILABLE, not the handler's response, when the transaction did not commit", async () => {
    const store = new TxStore()
    store.failCommit = true
    const { engine, answered } = transactional({ keyHeader: 'X-Request-Key' }, store)
    const decision = expectExecute(await within(engine.begin(post('k1', {}, 'x-request-key'))))
    txOf(decision.context).push('insert order 1')
    const sent = await within(decision.finish(created('order 1')))
    expect(sent.status).toBe(503)
    expect(sent.headers['retry-after']).toBe('1')
    expect(jsonOf(sent)).toMatchObject({
      code: 'STORE_UNAVAILABLE',
      detail: "The request's transaction did not commit, so none of its writes were kept. Retry with the same X-Request-Key.",
    })
    expect(text(sent)).not.toContain('10.1.2.3')
    expect(store.committed).toEqual([])
    expect(answered()).toEqual(['k1 executed 503'])
  })

  it('answers 409 FENCED_OUT saying its writes were rolled back when a takeover completed the record first', async () => {
    const store = new TxStore()
    store.fenceNext = true
    const { engine } = transactional({ keyHeader: 'X-Request-Key' }, store)
    const decision = expectExecute(await within(engine.begin(post('k1', {}, 'x-request-key'))))
    txOf(decision.context).push('insert order 1')
    const sent = await within(decision.finish(created('order 1')))
    expect(sent.status).toBe(409)
    expect(jsonOf(sent)).toMatchObject({
      code: 'FENCED_OUT',
      detail:
        'Another attempt with the X-Request-Key "k1" took over while this one ran, so this one\'s writes were rolled back. Retry with the same key to get the outcome that counts.',
    })
    expect(store.committed).toEqual([])
  })
})
