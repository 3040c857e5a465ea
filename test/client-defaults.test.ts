/**
 * The server's defaults and the client's agree: a handler that takes 12 s and a double click. The
 * duplicate waits on the server (`wait`, 10 s), gets `409` with a short `Retry-After`, comes back and is
 * answered with the first request's response, replayed, all within the client's default budget.
 *
 * The rule (docs/client.md, "Defaults that agree"):
 * - the server holds a duplicate for `wait`, then answers `409` with `Retry-After` of 1–2 s (never past
 *   the lease's end), since the retry waits on the server again and is woken when the first finishes;
 * - the client's `attemptTimeout` is longer than the server's `wait`, so an attempt hears the server's
 *   answer (a `409` or the replay) instead of giving up on it;
 * - the client's `maxElapsed` lets a duplicate held for the whole `wait` at every attempt, with the longest
 *   pause between them, outlast a first request that runs a whole lease and more;
 * - against a stopped server, the jittered waits of the `maxAttempts` attempts outlast a restart of
 *   several seconds, and leave attempts for the lease a crashed holder left behind.
 */
import { randomUUID } from 'node:crypto'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import express from 'express'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { createIdempotentFetch, IDEMPOTENT_FETCH_DEFAULTS, idempotencyInfo, idempotentFetch, type RetryEvent } from '../src/client/index.js'
import { ManualClock } from '../src/core/clock.js'
import { parseDuration } from '../src/core/duration.js'
import { Ledger, RETRY_AFTER_MAX_MS, retryAfter } from '../src/core/ledger.js'
import { idempotency } from '../src/http/express/index.js'
import { withIdempotency } from '../src/http/fetch/index.js'
import { PaymentsServer } from './client-server.js'

const HANDLER_MS = 12_000

/** A payments API whose charge takes 12 s, behind one of idemkey's adapters with a default ledger. */
interface SlowApi {
  url: string
  runs: number
  /** Resolves when the next charge has started. */
  started(): Promise<void>
  close(): Promise<void>
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`
}

function slowCharge() {
  let onStart = () => {}
  const state = {
    runs: 0,
    started: () => new Promise<void>((resolve) => (onStart = resolve)),
    async charge(body: unknown) {
      state.runs++
      onStart()
      await sleep(HANDLER_MS)
      return { charged: body, n: state.runs }
    },
  }
  return state
}

async function fetchAdapterApi(): Promise<SlowApi> {
  const charges = slowCharge()
  const ledger = new Ledger({ store: new MemoryStore() }) // the defaults: wait 10 s, lease 30 s
  const handler = withIdempotency(ledger, async (request) => Response.json(await charges.charge(await request.json()), { status: 201 }))
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const headers = Object.entries(req.headers).flatMap(([name, value]): [string, string][] =>
      value === undefined ? [] : (Array.isArray(value) ? value : [value]).map((v): [string, string] => [name, v]),
    )
    const response = await handler(new Request(`http://127.0.0.1${req.url}`, { method: req.method, headers, body: Buffer.concat(chunks) }))
    res.writeHead(response.status, Object.fromEntries(response.headers))
    res.end(Buffer.from(await response.arrayBuffer()))
  })
  const url = await listen(server)
  return {
    url,
    get runs() {
      return charges.runs
    },
    started: charges.started,
    close: () => closeServer(server),
  }
}

async function expressApi(): Promise<SlowApi> {
  const charges = slowCharge()
  const ledger = new Ledger({ store: new MemoryStore() })
  const app = express()
  app.post('/charges', express.json(), idempotency({ ledger }), async (req, res) => {
    res.status(201).json(await charges.charge(req.body))
  })
  const server = createServer(app)
  const url = await listen(server)
  return {
    url,
    get runs() {
      return charges.runs
    },
    started: charges.started,
    close: () => closeServer(server),
  }
}

function closeServer(server: Server): Promise<void> {
  server.closeAllConnections()
  return new Promise((resolve) => server.close(() => resolve()))
}

describe('a handler that takes 12 s and a double click, with every default', () => {
  it.concurrent.each([
    ['the fetch adapter', fetchAdapterApi],
    ['the Express adapter', expressApi],
  ])(
    'behind %s, the duplicate sent by idempotentFetch ends with the first response, replayed',
    async (_name, start) => {
      const api = await start()
      try {
        const key = randomUUID()
        const init = { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"amount":4200}', idempotencyKey: key }
        const started = api.started()
        const first = idempotentFetch(api.url, init)
        await started
        const retries: RetryEvent[] = []
        // The same defaults as idempotentFetch, plus a hook to see what the duplicate went through.
        const second = await createIdempotentFetch({ onRetry: (event) => retries.push(event) })(api.url, init)

        const firstResponse = await first
        expect(firstResponse.status).toBe(201)
        expect(idempotencyInfo(firstResponse)).toEqual({ key, attempts: 1, replayed: false })
        expect(second.status).toBe(201)
        expect(idempotencyInfo(second)).toMatchObject({ key, replayed: true })
        expect(await second.json()).toEqual(await firstResponse.json())
        expect(api.runs).toBe(1)
        // Every retry followed the server's own answer (409 in-progress with a short Retry-After),
        // never the client's attempt timeout cutting the server's wait short.
        expect(retries.length).toBeGreaterThan(0)
        for (const retry of retries) {
          expect(retry.error).toBeUndefined()
          expect(retry.response?.status).toBe(409)
          expect(Number(retry.response?.headers.get('retry-after'))).toBeLessThanOrEqual(RETRY_AFTER_MAX_MS / 1_000)
        }
      } finally {
        await api.close()
      }
    },
    HANDLER_MS + 20_000,
  )
})

describe('a server restarted while a call retries, with every default', () => {
  const DOWN_MS = 5_000

  it(
    'the call rides out 5 s of a stopped server: the retry after the restart gets the charge made before the stop, replayed, applied once',
    async () => {
      const server = new PaymentsServer('fetch-adapter')
      await server.start()
      const key = randomUUID()
      let restarted: Promise<void> | undefined
      let downAtMs = 0
      // The charge commits, then the server stops before its answer leaves: a deploy that caught the request.
      server.answered.set(key, () => {
        server.answered.delete(key)
        downAtMs = Date.now()
        restarted = server.close().then(async () => {
          await sleep(DOWN_MS)
          await server.start(server.port)
        })
      })
      const retries: RetryEvent[] = []
      try {
        // The defaults of idempotentFetch, plus a hook to see the attempts that met the stopped server.
        const response = await createIdempotentFetch({ onRetry: (event) => retries.push(event) })(`${server.url}/charges`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: '{"amount":4200}',
          idempotencyKey: key,
        })
        expect(Date.now() - downAtMs).toBeGreaterThanOrEqual(DOWN_MS)
        expect(response.status).toBe(201)
        expect(idempotencyInfo(response)).toMatchObject({ key, replayed: true })
        expect(await response.json()).toEqual({ charged: { amount: 4200 }, n: 1 })
        expect(server.charges.get(key)).toBe(1)
        // Every retry met the stopped server (a network error), none a response.
        expect(retries.length).toBeGreaterThan(1)
        for (const retry of retries) expect(retry.error).toBeDefined()
      } finally {
        await restarted
        await server.close()
      }
    },
    DOWN_MS + 30_000,
  )
})

describe('the default values agree with each other', () => {
  const ledger = new Ledger({ store: new MemoryStore() })
  const waitMs = ledger.waitMs
  const leaseMs = ledger.leaseMs
  const client = {
    maxAttempts: IDEMPOTENT_FETCH_DEFAULTS.maxAttempts,
    maxElapsedMs: parseDuration(IDEMPOTENT_FETCH_DEFAULTS.maxElapsed),
    attemptTimeoutMs: parseDuration(IDEMPOTENT_FETCH_DEFAULTS.attemptTimeout),
    baseDelayMs: parseDuration(IDEMPOTENT_FETCH_DEFAULTS.baseDelay),
    maxDelayMs: parseDuration(IDEMPOTENT_FETCH_DEFAULTS.maxDelay),
  }

  it('Retry-After is a short hint: whole seconds, 1 s to 2 s, never past the end of a lease at least 1 s away', () => {
    const now = Date.UTC(2030, 0, 1)
    for (let leftMs = -5_000; leftMs <= leaseMs; leftMs += 250) {
      const hintMs = retryAfter(now + leftMs, now)
      expect(hintMs % 1_000).toBe(0)
      expect(hintMs).toBeGreaterThanOrEqual(1_000)
      expect(hintMs).toBeLessThanOrEqual(RETRY_AFTER_MAX_MS)
      if (leftMs >= 1_000) expect(hintMs).toBeLessThanOrEqual(leftMs)
    }
    expect(RETRY_AFTER_MAX_MS).toBeLessThan(waitMs)
  })

  it('a default ledger answers a duplicate of a live holder after its wait with the short hint, not the lease end', async () => {
    const clock = new ManualClock()
    const manual = new Ledger({ store: new MemoryStore({ clock }), clock })
    expect([manual.waitMs, manual.leaseMs]).toEqual([waitMs, leaseMs])
    let finish = () => {}
    const first = manual.run({ key: 'k' }, () => new Promise<void>((resolve) => (finish = resolve)))
    while (clock.pendingSleeps < 1) await new Promise((resolve) => setImmediate(resolve))
    const startedAt = clock.now()
    const second = manual.run({ key: 'k' }, () => 'never')
    let answer: Awaited<typeof second> | undefined
    void second.then((result) => (answer = result))
    for (let i = 0; i < 10_000 && answer === undefined; i++) {
      await new Promise((resolve) => setImmediate(resolve))
      if (answer === undefined && clock.pendingSleeps > 0) clock.advance(50)
    }
    expect(answer).toMatchObject({ kind: 'in_progress', retryAfterMs: RETRY_AFTER_MAX_MS })
    expect(clock.now() - startedAt).toBeGreaterThanOrEqual(waitMs)
    expect(clock.now() - startedAt).toBeLessThan(waitMs + 1_000)
    finish()
    await first
  })

  /** The cap of the wait after attempt `n` (1-based): the jittered wait is uniform below it. */
  const capMs = (n: number) => Math.min(client.maxDelayMs, client.baseDelayMs * 2 ** (n - 1))

  it("the client's attempt outlasts the server's wait, and its budget outlasts a first request that runs a whole lease", () => {
    // An attempt must hear the server's answer (409 or the replay) after its wait, with room for the network.
    expect(client.attemptTimeoutMs).toBeGreaterThanOrEqual(waitMs + 1_000)
    // A duplicate held for the whole wait at every attempt, with the longest pause between attempts (the
    // hint, or the backoff's cap): until when it hears the server, before maxAttempts or maxElapsed ends it.
    let heardUntilMs = 0
    for (let attempt = 1; ; attempt++) {
      heardUntilMs = Math.min(client.maxElapsedMs, heardUntilMs + waitMs)
      const pauseMs = Math.max(RETRY_AFTER_MAX_MS, capMs(attempt))
      if (attempt >= client.maxAttempts || heardUntilMs + pauseMs >= client.maxElapsedMs) break
      heardUntilMs += pauseMs
    }
    // So a duplicate outlasts a first request that runs for a whole lease (renewed, it may run longer).
    expect(heardUntilMs).toBeGreaterThanOrEqual(leaseMs + waitMs)
  })

  it('against a stopped server, the jittered waits outlast a restart of 5 s in all but 1 call in 10 million (10 s: 1 in 10,000)', () => {
    // Each wait is uniform below its cap, independently: the chance that some of them sum to less than D
    // is at most the simplex {sum < D} over their box, D^n / (n! × the caps' product); and the chance that
    // all of them do is at most that of any of them, so the smallest bound over the last n waits holds.
    const caps = Array.from({ length: client.maxAttempts - 1 }, (_, i) => capMs(i + 1))
    const chanceUnder = (downMs: number) => {
      let best = 1
      for (let n = 1; n <= caps.length; n++) {
        let bound = 1
        for (const [i, cap] of caps.slice(-n).entries()) bound *= downMs / cap / (i + 1)
        best = Math.min(best, bound)
      }
      return best
    }
    expect(chanceUnder(5_000)).toBeLessThan(1e-7)
    expect(chanceUnder(10_000)).toBeLessThan(1e-4)
    // Today's attempts and caps leave the call, on average, well inside maxElapsed against a stopped server.
    expect(caps.reduce((sum, cap) => sum + cap, 0) / 2).toBeLessThan(client.maxElapsedMs)
  })

  it('simulated: a server that crashed holding the request and restarts after 10 s; the default client gets the run that takes over at the end of the dead lease, in each of 1,000 seeded calls', async () => {
    const DOWN_MS = 10_000
    let seed = 55
    // mulberry32: a seeded generator, so the count below is the same at every run.
    const random = () => {
      seed = (seed + 0x6d2b79f5) | 0
      let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
      return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296
    }
    let succeeded = 0
    for (let call = 0; call < 1_000; call++) {
      let now = 0
      // Down until DOWN_MS; then the dead holder's lease (ends `lease` after the crash) holds each attempt
      // for the wait, or until it ends, when the waiting attempt takes the record over and runs.
      const server = async (): Promise<Response> => {
        if (now < DOWN_MS) throw new TypeError('fetch failed')
        if (now + waitMs < leaseMs) {
          now += waitMs
          return new Response(null, { status: 409, headers: { 'retry-after': String(retryAfter(leaseMs, now) / 1_000) } })
        }
        now = Math.max(now, leaseMs)
        return new Response('{"n":1}', { status: 201 })
      }
      const fetch = createIdempotentFetch({
        fetch: server,
        now: () => now,
        sleep: async (ms) => {
          now += ms
        },
        random,
      })
      const response = await fetch('https://api.example.com/charges', { method: 'POST', body: '{}' }).catch(() => undefined)
      if (response?.status === 201) succeeded++
    }
    expect(succeeded).toBe(1_000)
  })

  it.each([12_000, 30_000, 45_000])(
    'simulated: the default client, against a server with the default wait and hint, gets the replay of a first request that takes %i ms',
    async (firstTakesMs) => {
      let now = 0
      const attempts: number[] = []
      // The server as the defaults make it: a duplicate waits up to `wait`, then 409 with the hint for a live, renewed lease.
      const server = async (): Promise<Response> => {
        attempts.push(now)
        if (now + waitMs < firstTakesMs) {
          now += waitMs
          const lockedUntil = now - (now % (leaseMs / 3)) + leaseMs // renewed every third of the lease
          return new Response(null, { status: 409, headers: { 'retry-after': String(retryAfter(lockedUntil, now) / 1_000) } })
        }
        now = Math.max(now, firstTakesMs)
        return new Response('{"n":1}', { status: 201, headers: { 'idempotent-replayed': 'true' } })
      }
      const call = createIdempotentFetch({
        fetch: server,
        now: () => now,
        sleep: async (ms) => {
          now += ms
        },
        random: () => 0.5,
      })
      const response = await call('https://api.example.com/charges', { method: 'POST', body: '{}' })
      expect(idempotencyInfo(response)).toMatchObject({ replayed: true, attempts: attempts.length })
      expect(now).toBeLessThanOrEqual(client.maxElapsedMs)
    },
  )
})
