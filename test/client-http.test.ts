import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import {
  createIdempotentFetch,
  type IdempotentFetchOptions,
  IdempotentRequestError,
  idempotencyInfo,
  type RetryEvent,
  uuidv7,
} from '../src/client/index.js'
import { type Fault, PaymentsServer, type ServerMode } from './client-server.js'

/** A client that does not really wait: it records the delays it was asked to sleep. */
function fastClient(extra: IdempotentFetchOptions = {}) {
  const delays: number[] = []
  const client = createIdempotentFetch({
    sleep: async (ms) => {
      delays.push(ms)
    },
    random: () => 0.5,
    ...extra,
  })
  return { client, delays }
}

const charge = (body: unknown = { amount: 100 }) => ({
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify(body),
})

async function failure(promise: Promise<unknown>): Promise<IdempotentRequestError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(error).toBeInstanceOf(IdempotentRequestError)
  return error as IdempotentRequestError
}

describe.each<ServerMode>(['ledger', 'fetch-adapter'])('idempotentFetch against a real server (%s)', (mode) => {
  const server = new PaymentsServer(mode)
  beforeAll(() => server.start())
  afterAll(() => server.close())
  const url = () => `${server.url}/charges`
  const withFaults = (...faults: Fault[]) => {
    const key = `test-${randomUUID()}`
    server.faults.set(key, faults)
    return key
  }

  it('sends one UUIDv7 key per call and tells the caller the key, attempts and replay flag', async () => {
    const { client } = fastClient()
    const first = await client(url(), charge())
    const second = await client(url(), charge())
    expect(first.status).toBe(201)
    const info = idempotencyInfo(first)
    expect(info).toMatchObject({ attempts: 1, replayed: false })
    expect(info?.key).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
    expect(idempotencyInfo(second)?.key).not.toBe(info?.key)
    expect(server.charges.get(info?.key as string)).toBe(1)
  })

  it('retries a lost response (committed, then the connection reset) with the same key and gets the charge replayed once', async () => {
    const key = withFaults('reset-after-commit')
    const { client } = fastClient()
    const response = await client(url(), { ...charge(), idempotencyKey: key })
    expect(response.status).toBe(201)
    expect(idempotencyInfo(response)).toEqual({ key, attempts: 2, replayed: true })
    expect(await response.json()).toMatchObject({ n: 1 })
    expect(server.charges.get(key)).toBe(1)
    expect(server.count(key)).toBe(2)
  })

  it('retries a connection reset before anything ran, and runs the charge once', async () => {
    const key = withFaults('reset-before', 'reset-before')
    const { client } = fastClient()
    const response = await client(url(), { ...charge(), idempotencyKey: key })
    expect(idempotencyInfo(response)).toEqual({ key, attempts: 3, replayed: false })
    expect(server.charges.get(key)).toBe(1)
  })

  it('retries 503 with exponential backoff and full jitter, then succeeds', async () => {
    const key = withFaults('503', '503')
    const { client, delays } = fastClient()
    const response = await client(url(), { ...charge(), idempotencyKey: key })
    expect(response.status).toBe(201)
    expect(idempotencyInfo(response)?.attempts).toBe(3)
    expect(delays).toEqual([250, 500]) // random() = 0.5 of the default caps 500 ms and 1 s
  })

  it('retries 409 while the first attempt is in flight, waits the Retry-After, then gets the replay', async () => {
    const key = `test-${randomUUID()}`
    let release!: () => void
    server.gates.set(key, new Promise<void>((resolve) => (release = resolve)))
    const started = new Promise<void>((resolve) => server.started.set(key, resolve))
    const first = fastClient().client(url(), { ...charge(), idempotencyKey: key })
    await started
    const delays: number[] = []
    const second = await createIdempotentFetch({
      sleep: async (ms) => {
        delays.push(ms)
        release() // the first request finishes while the second one waits
        await first
      },
    })(url(), { ...charge(), idempotencyKey: key })
    expect(idempotencyInfo(await first)).toEqual({ key, attempts: 1, replayed: false })
    expect(idempotencyInfo(second)).toEqual({ key, attempts: 2, replayed: true })
    expect(delays[0]).toBeGreaterThanOrEqual(1_000) // the 409's Retry-After, at least 1 s
    expect(server.charges.get(key)).toBe(1)
  })

  it('honours Retry-After in seconds', async () => {
    const key = withFaults('429-retry-after-2')
    const { client, delays } = fastClient()
    expect((await client(url(), { ...charge(), idempotencyKey: key })).status).toBe(201)
    expect(delays).toEqual([2_000])
  })

  it('honours Retry-After as an HTTP date, by the injected clock', async () => {
    server.retryAtMs = Date.parse('Wed, 21 Oct 2026 07:28:10 GMT')
    const key = withFaults('503-retry-after-date')
    const { client, delays } = fastClient({ now: () => Date.parse('Wed, 21 Oct 2026 07:28:07 GMT') })
    expect((await client(url(), { ...charge(), idempotencyKey: key })).status).toBe(201)
    expect(delays).toEqual([3_000])
  })

  it('gives up at once when the Retry-After would pass the total-time bound', async () => {
    const key = withFaults('429-retry-after-2')
    const { client, delays } = fastClient({ maxElapsed: '1s' })
    const error = await failure(client(url(), { ...charge(), idempotencyKey: key }))
    expect(error).toMatchObject({ code: 'RETRIES_EXHAUSTED', status: 429, attempts: 1, key })
    expect(error.message).toMatch(/Retry-After 2s/)
    expect(delays).toEqual([])
  })

  it('does not retry a key reused with another body: 422 FINGERPRINT_MISMATCH with the problem details', async () => {
    const key = `test-${randomUUID()}`
    const { client } = fastClient()
    await client(url(), { ...charge({ amount: 100 }), idempotencyKey: key })
    const error = await failure(client(url(), { ...charge({ amount: 999 }), idempotencyKey: key }))
    expect(error).toMatchObject({ code: 'FINGERPRINT_MISMATCH', status: 422, attempts: 1, key, problem: { status: 422 } })
    expect(error.message).toMatch(/new key/)
    expect(server.count(key)).toBe(2)
    expect(server.charges.get(key)).toBe(1)
  })

  it('does not retry a validation 422 and throws REQUEST_REJECTED with the problem+json', async () => {
    const key = withFaults('422-validation')
    const { client } = fastClient()
    const error = await failure(client(url(), { ...charge(), idempotencyKey: key }))
    expect(error).toMatchObject({ code: 'REQUEST_REJECTED', status: 422, attempts: 1, problem: { detail: 'amount must be positive' } })
    expect(error.response?.status).toBe(422)
    expect(server.count(key)).toBe(1)
  })

  it('returns the refused response instead of throwing when throwOnError is false', async () => {
    const key = withFaults('422-validation')
    const { client } = fastClient({ throwOnError: false })
    const response = await client(url(), { ...charge(), idempotencyKey: key })
    expect(response.status).toBe(422)
    expect(idempotencyInfo(response)).toEqual({ key, attempts: 1, replayed: false })
  })

  it('stops at the total-time bound and throws RETRIES_EXHAUSTED with the key and last status', async () => {
    const key = withFaults(...Array<Fault>(20).fill('503'))
    let clock = 0
    const client = createIdempotentFetch({
      now: () => clock,
      sleep: async (ms) => {
        clock += ms
      },
      random: () => 0.99,
      maxAttempts: 100,
      maxElapsed: '1s',
      baseDelay: '200ms',
    })
    const error = await failure(client(url(), { ...charge(), idempotencyKey: key }))
    expect(error).toMatchObject({ code: 'RETRIES_EXHAUSTED', key, status: 503, attempts: 3 }) // waits 198 + 396; 792 more passes 1 s
    expect(clock).toBeLessThan(1_000)
    expect(server.count(key)).toBe(3)
  })

  it('stops after maxAttempts, and with throwOnError false returns the last 503', async () => {
    const key = withFaults(...Array<Fault>(5).fill('503'))
    await expect(fastClient({ maxAttempts: 2 }).client(url(), { ...charge(), idempotencyKey: key })).rejects.toMatchObject({
      code: 'RETRIES_EXHAUSTED',
      attempts: 2,
    })
    const response = await fastClient({ maxAttempts: 2, throwOnError: false }).client(url(), { ...charge(), idempotencyKey: key })
    expect(response.status).toBe(503)
    expect(server.count(key)).toBe(4)
  })

  it('is abortable while it waits to retry, and sends nothing more', async () => {
    const key = withFaults(...Array<Fault>(5).fill('503'))
    const controller = new AbortController()
    const client = createIdempotentFetch({
      baseDelay: '1h',
      maxDelay: '1h',
      maxElapsed: '2h',
      onRetry: () => controller.abort(new Error('user gave up')),
    })
    await expect(client(url(), { ...charge(), idempotencyKey: key, signal: controller.signal })).rejects.toThrow('user gave up')
    expect(server.count(key)).toBe(1)
  })

  it('is abortable during an attempt', async () => {
    const key = `test-${randomUUID()}`
    let release!: () => void
    server.gates.set(key, new Promise<void>((resolve) => (release = resolve)))
    const started = new Promise<void>((resolve) => server.started.set(key, resolve))
    const controller = new AbortController()
    const pending = fastClient().client(url(), { ...charge(), idempotencyKey: key, signal: controller.signal })
    await started
    controller.abort(new Error('closed the tab'))
    await expect(pending).rejects.toThrow('closed the tab')
    release()
    expect(server.count(key)).toBe(1)
  })

  it('aborts an attempt with no answer at the attempt timeout and retries it with the same key', async () => {
    const key = withFaults('stall-after-commit')
    const recorded = new Promise<void>((resolve) => server.answered.set(key, resolve))
    const events: RetryEvent[] = []
    const client = createIdempotentFetch({
      attemptTimeout: '100ms',
      onRetry: (event) => events.push(event),
      sleep: () => recorded, // retry once the first attempt is on record, however slow the machine
    })
    const response = await client(url(), { ...charge(), idempotencyKey: key })
    expect(idempotencyInfo(response)).toEqual({ key, attempts: 2, replayed: true })
    expect(events.map((event) => (event.error as Error | undefined)?.name)).toEqual(['TimeoutError'])
    expect(server.charges.get(key)).toBe(1)
  })

  it('does not cut off a body that arrives after the attempt timeout once the headers came', async () => {
    const key = withFaults(...Array<Fault>(5).fill('slow-body')) // each attempt, should a loaded machine need more than one
    const { client } = fastClient({ attemptTimeout: '150ms' })
    const response = await client(url(), { ...charge({ amount: 7 }), idempotencyKey: key })
    expect(await response.json()).toMatchObject({ charged: { amount: 7 } }) // the rest came 400 ms after the headers
  })

  it('buffers a stream body once, so the retry of a lost response sends the same bytes and is replayed', async () => {
    const key = withFaults('reset-after-commit')
    const { client } = fastClient()
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new TextEncoder().encode('{"amount":'))
        controller.enqueue(new TextEncoder().encode('42}'))
        controller.close()
      },
    })
    const init = { method: 'POST', headers: { 'content-type': 'application/json' }, body: stream, duplex: 'half' }
    const response = await client(url(), { ...(init as RequestInit), idempotencyKey: key })
    expect(idempotencyInfo(response)).toEqual({ key, attempts: 2, replayed: true })
    expect(await response.json()).toMatchObject({ charged: { amount: 42 } })
  })

  it('sends a FormData body with the same multipart boundary on every attempt', async () => {
    const key = withFaults('reset-after-commit')
    const form = new FormData()
    form.set('amount', '5')
    const response = await fastClient().client(url(), { method: 'POST', body: form, idempotencyKey: key })
    expect(idempotencyInfo(response)).toEqual({ key, attempts: 2, replayed: true }) // another boundary would be a 422
  })

  it('takes a Request as input, with its body and its own Idempotency-Key header', async () => {
    const key = withFaults('503')
    const request = new Request(url(), {
      ...charge({ amount: 3 }),
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
    })
    const response = await fastClient().client(request)
    expect(idempotencyInfo(response)).toEqual({ key, attempts: 2, replayed: false })
    expect(await response.json()).toMatchObject({ charged: { amount: 3 } })
  })

  it('refuses an invalid caller key before sending anything', async () => {
    const before = server.keysSeen.length
    await expect(fastClient().client(url(), { ...charge(), idempotencyKey: 'bad\nkey' })).rejects.toMatchObject({ code: 'KEY_INVALID' })
    expect(server.keysSeen.length).toBe(before)
  })

  it('keeps one key across the retries of one call and never repeats it across calls (property)', async () => {
    const seen = new Set<string>()
    const faults = fc.array(fc.constantFrom<Fault>('reset-after-commit', 'reset-before', '503'), { maxLength: 4 })
    await fc.assert(
      fc.asyncProperty(faults, async (plan) => {
        const from = server.keysSeen.length
        const { client } = fastClient({
          generateKey: () => {
            const key = uuidv7()
            server.faults.set(key, [...plan])
            return key
          },
        })
        const response = await client(url(), charge())
        const info = idempotencyInfo(response)
        const sent = server.keysSeen.slice(from)
        expect(sent).toEqual(Array(plan.length + 1).fill(info?.key))
        expect(info?.attempts).toBe(plan.length + 1)
        expect(seen.has(info?.key as string)).toBe(false)
        seen.add(info?.key as string)
        expect(server.charges.get(info?.key as string)).toBe(1)
      }),
      { numRuns: 30 },
    )
  })
})
