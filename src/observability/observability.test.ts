/**
 * idemkey/opentelemetry against the OpenTelemetry SDK's in-memory exporters: each metric and span is
 * pinned against the traffic that produced it. Also the durations on events and the HTTP layer's
 * `answered` event.
 */
import { context, trace } from '@opentelemetry/api'
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks'
import { AggregationTemporality, type DataPoint, MeterProvider, MetricReader, type ResourceMetrics } from '@opentelemetry/sdk-metrics'
import { BasicTracerProvider, InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base'
import { MemoryStore } from '../backends/memory/memory-store.js'
import { ManualClock } from '../core/clock.js'
import { Ledger, type LedgerEvent } from '../core/ledger.js'
import type { IdempotencyStore } from '../core/store.js'
import { createEngine } from '../http/engine.js'
import type { EngineEvent, HttpRequestLike } from '../http/types.js'
import { keyHash, openTelemetry } from './opentelemetry.js'

class TestReader extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE })
  }
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

function setup(store: IdempotencyStore = new MemoryStore()) {
  const spans = new InMemorySpanExporter()
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] })
  const reader = new TestReader()
  const meterProvider = new MeterProvider({ readers: [reader] })
  const ledger = new Ledger({ store, lease: '1s', telemetry: openTelemetry({ tracerProvider, meterProvider }) })
  return { ledger, spans, reader }
}

/** Every data point of one instrument, with its attributes. */
async function points(reader: MetricReader, name: string): Promise<DataPoint<unknown>[]> {
  const { resourceMetrics } = await reader.collect()
  return (resourceMetrics as ResourceMetrics).scopeMetrics.flatMap((s) =>
    s.metrics.filter((m) => m.descriptor.name === name).flatMap((m) => m.dataPoints as DataPoint<unknown>[]),
  )
}

/** The counter's value for data points whose attributes include `match`. */
async function count(reader: MetricReader, name: string, match: Record<string, unknown>): Promise<number> {
  let total = 0
  for (const point of await points(reader, name)) {
    if (Object.entries(match).every(([k, v]) => point.attributes[k] === v)) {
      total += typeof point.value === 'number' ? point.value : (point.value as { count: number }).count
    }
  }
  return total
}

/** A store whose calls fail while `down` is set, as a store does whose server went away. */
function flakyStore(inner: IdempotencyStore, failing: Set<string>): IdempotencyStore {
  const fail = (op: string) => {
    if (failing.has(op)) throw new Error(`${op}: connection refused`)
  }
  return {
    name: inner.name,
    serverClock: inner.serverClock,
    acquire: async (...args) => {
      fail('acquire')
      return inner.acquire(...args)
    },
    renew: async (...args) => {
      fail('renew')
      return inner.renew(...args)
    },
    complete: async (...args) => {
      fail('complete')
      return inner.complete(...args)
    },
    release: async (...args) => {
      fail('release')
      return inner.release(...args)
    },
    get: (...args) => inner.get(...args),
    list: (...args) => inner.list(...args),
    purgeExpired: (limit) => inner.purgeExpired(limit),
    evict: (scope, key) => inner.evict(scope, key),
    close: () => inner.close(),
  }
}

describe('openTelemetry(): metrics', () => {
  it('counts each result and outcome once, as the traffic produced them', async () => {
    const failing = new Set<string>()
    const { ledger, reader } = setup(flakyStore(new MemoryStore(), failing))
    await ledger.run({ key: 'a', payload: 1 }, () => 'ok') // executed, completed
    await ledger.run({ key: 'a', payload: 1 }, () => 'ok') // replayed
    await ledger.run({ key: 'a', payload: 2 }, () => 'ok') // mismatch
    await ledger.run({ key: 'f', payload: 1 }, () => ({ error: true }), {
      encode: () => ({ status: 400, headers: {}, body: new Uint8Array() }),
    }) // executed, failed
    await expect(
      ledger.run({ key: 'b', payload: 1 }, () => {
        throw new Error('work failed')
      }),
    ).rejects.toThrow('work failed') // error, released
    let finish: () => void = () => {}
    const held = ledger.run({ key: 'c', payload: 1 }, () => new Promise<string>((resolve) => (finish = () => resolve('done'))))
    await vi.waitFor(async () => expect(await count(reader, 'idemkey.intents.running', {})).toBe(1))
    expect((await ledger.run({ key: 'c', payload: 1 }, () => 'never', { wait: 0 })).kind).toBe('in_progress')
    finish()
    await held
    failing.add('acquire')
    await expect(ledger.run({ key: 'd', payload: 1 }, () => 'never')).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    failing.delete('acquire')
    failing.add('complete')
    const unrecorded = await ledger.run({ key: 'e', payload: 1 }, () => 'ran')
    expect(unrecorded).toMatchObject({ kind: 'executed', outcome: 'unrecorded' })

    const intents = (match: Record<string, unknown>) => count(reader, 'idemkey.intents', match)
    expect(await intents({ 'idemkey.result': 'executed', 'idemkey.outcome': 'completed' })).toBe(2) // a, c
    expect(await intents({ 'idemkey.result': 'executed', 'idemkey.outcome': 'failed' })).toBe(1)
    expect(await intents({ 'idemkey.result': 'executed', 'idemkey.outcome': 'unrecorded' })).toBe(1)
    expect(await intents({ 'idemkey.result': 'replayed' })).toBe(1)
    expect(await intents({ 'idemkey.result': 'mismatch' })).toBe(1)
    expect(await intents({ 'idemkey.result': 'in_progress' })).toBe(1)
    expect(await intents({ 'idemkey.result': 'error', 'idemkey.outcome': 'released' })).toBe(1)
    expect(await intents({ 'idemkey.result': 'error', 'idemkey.outcome': undefined })).toBe(1) // d: store down
    expect(await intents({})).toBe(9)
    expect(await count(reader, 'idemkey.intents.running', {})).toBe(0)
    expect(await count(reader, 'idemkey.store.errors', { 'db.operation.name': 'acquire', 'db.system.name': 'memory' })).toBe(1)
    // e's outcome was tried until shortly before its 1 s lease ended: several failed completes, all counted.
    const completes = await count(reader, 'idemkey.store.errors', { 'db.operation.name': 'complete' })
    expect(completes).toBeGreaterThan(2)
    const completeDurations = await count(reader, 'db.client.operation.duration', {
      'db.operation.name': 'complete',
      'error.type': 'Error',
    })
    expect(completeDurations).toBe(completes)
    // One wait histogram sample: the in_progress answer above waited 0, so only runs that did wait count.
    expect(await count(reader, 'idemkey.wait.duration', {})).toBe(0)
  })

  it('counts a transient outcome as released and a holder that lost its record as fenced out', async () => {
    const clock = new ManualClock()
    const reader = new TestReader()
    const meterProvider = new MeterProvider({ readers: [reader] })
    const store = new MemoryStore({ clock })
    const ledger = new Ledger({ store, clock, lease: '1s', telemetry: openTelemetry({ meterProvider, traces: false }) })
    const transient = await ledger.run({ key: 't', payload: 1 }, () => 'busy', {
      encode: () => ({ status: 503, headers: {}, body: new Uint8Array() }),
    })
    expect(transient).toMatchObject({ kind: 'executed', outcome: 'released' })
    // The first holder's lease ends mid-work; a second run takes the record over and completes it.
    let resume: () => void = () => {}
    const first = ledger.run({ key: 'z', payload: 1 }, () => new Promise<string>((resolve) => (resume = () => resolve('late'))))
    await vi.waitFor(async () => expect(await count(reader, 'idemkey.intents.running', {})).toBe(1))
    ;(store as unknown as { renew: () => Promise<boolean> }).renew = async () => true // no renewal reaches the store
    clock.advance(1_500)
    expect(await ledger.run({ key: 'z', payload: 1 }, () => 'second')).toMatchObject({ kind: 'executed', outcome: 'completed' })
    resume()
    expect(await first).toMatchObject({ kind: 'executed', outcome: 'fenced_out' })
    expect(await count(reader, 'idemkey.intents', { 'idemkey.outcome': 'released', 'idemkey.result': 'executed' })).toBe(1)
    expect(await count(reader, 'idemkey.intents', { 'idemkey.outcome': 'fenced_out' })).toBe(1)
    expect(await count(reader, 'idemkey.intents', { 'idemkey.outcome': 'completed' })).toBe(1)
    expect(await count(reader, 'idemkey.intents.running', {})).toBe(0)
  })

  it('records how long a run waited for another holder', async () => {
    const { ledger, reader } = setup()
    let finish: () => void = () => {}
    const held = ledger.run({ key: 'w', payload: 1 }, () => new Promise<string>((resolve) => (finish = () => resolve('done'))))
    await vi.waitFor(async () => expect(await count(reader, 'idemkey.intents.running', {})).toBe(1))
    const waiter = ledger.run({ key: 'w', payload: 1 }, () => 'never', { wait: '5s' })
    await new Promise((resolve) => setTimeout(resolve, 120))
    finish()
    expect((await waiter).kind).toBe('replayed')
    await held
    const [sample] = await points(reader, 'idemkey.wait.duration')
    const histogram = sample?.value as { count: number; sum: number }
    expect(histogram.count).toBe(1)
    // The waiter waited about 120 ms, in seconds. Its wait begins when its first acquire answers, which
    // on a loaded machine can be a few tens of ms after the line above started it (0.097 was seen in CI).
    expect(histogram.sum).toBeGreaterThanOrEqual(0.05)
    expect(histogram.sum).toBeLessThan(2)
  })
})

describe('openTelemetry(): options', () => {
  it('refuses a meter or tracer provider of the wrong kind with INVALID_OPTION (it crashed with a TypeError)', () => {
    const exporter = new InMemorySpanExporter()
    expect(() => openTelemetry({ tracerProvider: exporter as never })).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: 'openTelemetry(): tracerProvider must be an object with getTracer(); it has no getTracer().',
      }),
    )
    expect(() => openTelemetry({ meterProvider: 'otel' as never })).toThrow(
      'openTelemetry(): meterProvider must be an object with getMeter(); got a string of 4 characters.',
    )
    expect(() => openTelemetry({ meterProvider: new MeterProvider(), tracerProvider: new BasicTracerProvider() })).not.toThrow()
  })
})

describe('openTelemetry(): spans', () => {
  it('makes one intent span per run with a child span per store operation, and no raw key or scope', async () => {
    const { ledger, spans } = setup()
    const key = 'order-7f3a-secret-customer-key'
    const scope = 'tenant-acme-private'
    await ledger.run({ key, scope, payload: 1 }, () => 'ok')
    await ledger.run({ key, scope, payload: 1 }, () => 'ok')
    const finished = spans.getFinishedSpans()
    const intents = finished.filter((s) => s.name === 'idemkey.intent')
    expect(intents).toHaveLength(2)
    const [first, second] = intents as [ReadableSpan, ReadableSpan]
    expect(first.attributes).toMatchObject({
      'idemkey.result': 'executed',
      'idemkey.outcome': 'completed',
      'idemkey.token': 1,
      'idemkey.takeover': false,
      'idemkey.key_hash': keyHash(scope, key),
      'db.system.name': 'memory',
    })
    expect(second.attributes).toMatchObject({ 'idemkey.result': 'replayed' })
    const children = finished.filter((s) => s.parentSpanContext?.spanId === first.spanContext().spanId)
    expect(children.map((s) => s.name)).toEqual(['acquire memory', 'complete memory'])
    expect(children[0]?.attributes).toEqual({ 'db.system.name': 'memory', 'db.operation.name': 'acquire' })
    expect(children.every((s) => s.spanContext().traceId === first.spanContext().traceId)).toBe(true)
    const everything = JSON.stringify(finished.map((s) => ({ name: s.name, attributes: s.attributes, events: s.events })))
    expect(everything).not.toContain(key)
    expect(everything).not.toContain(scope)
  })

  it('runs the work inside the intent span, so the work’s own spans nest under it', async () => {
    // What an SDK's NodeTracerProvider.register() installs.
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())
    onTestFinished(() => context.disable())
    const { ledger, spans } = setup()
    const tracer = trace.getTracer('app')
    let inner: string | undefined
    await ledger.run({ key: 'nest', payload: 1 }, () => {
      inner = trace.getActiveSpan()?.spanContext().spanId
      return tracer.startActiveSpan('app.work', (span) => span.end())
    })
    const intent = spans.getFinishedSpans().find((s) => s.name === 'idemkey.intent')
    expect(inner).toBe(intent?.spanContext().spanId)
  })

  it('marks a takeover, and a failed store operation as an error span with its error type', async () => {
    const failing = new Set<string>()
    const clock = new ManualClock()
    const spans = new InMemorySpanExporter()
    const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] })
    const store = flakyStore(new MemoryStore({ clock }), failing)
    const ledger = new Ledger({ store, clock, lease: '1s', telemetry: openTelemetry({ tracerProvider, metrics: false }) })
    await store.acquire('default', 'k', (await import('../core/fingerprint.js')).fingerprintOf(1), 1_000)
    clock.advance(1_001)
    await ledger.run({ key: 'k', payload: 1 }, () => 'ok')
    failing.add('acquire')
    await expect(ledger.run({ key: 'z', payload: 1 }, () => 'ok')).rejects.toThrow()
    const intents = spans.getFinishedSpans().filter((s) => s.name === 'idemkey.intent')
    expect(intents[0]?.attributes).toMatchObject({ 'idemkey.token': 2, 'idemkey.takeover': true })
    const failedAcquire = spans.getFinishedSpans().find((s) => s.name === 'acquire memory' && s.status.code === 2)
    expect(failedAcquire?.attributes['error.type']).toBe('Error')
    expect(intents[1]?.status.code).toBe(2)
    expect(intents[1]?.attributes['idemkey.result']).toBe('error')
  })

  it('ends the store operation span when a store method throws before returning a promise', async () => {
    const inner = new MemoryStore()
    // A store written without `async`: its method throws instead of returning a rejected promise.
    const store: IdempotencyStore = {
      ...flakyStore(inner, new Set()),
      acquire: () => {
        throw new Error('acquire: connection refused')
      },
    }
    const { ledger, spans } = setup(store)
    await expect(ledger.run({ key: 'sync-throw', payload: 1 }, () => 'ok')).rejects.toThrow()
    const finished = spans.getFinishedSpans()
    const intent = finished.find((s) => s.name === 'idemkey.intent')
    const acquire = finished.find((s) => s.name === 'acquire memory')
    expect(acquire?.status.code).toBe(2)
    expect(acquire?.attributes['error.type']).toBe('Error')
    expect(acquire?.parentSpanContext?.spanId).toBe(intent?.spanContext().spanId)
  })

  it('records nothing when the ledger has no telemetry, even with a global provider registered', async () => {
    const spans = new InMemorySpanExporter()
    const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] })
    trace.setGlobalTracerProvider(provider)
    try {
      const ledger = new Ledger({ store: new MemoryStore() })
      await ledger.run({ key: 'quiet', payload: 1 }, () => 'ok')
      expect(spans.getFinishedSpans()).toHaveLength(0)
      // The same ledger with telemetry on uses the global provider by default.
      const traced = new Ledger({ store: new MemoryStore(), telemetry: openTelemetry({ metrics: false }) })
      await traced.run({ key: 'loud', payload: 1 }, () => 'ok')
      expect(spans.getFinishedSpans().map((s) => s.name)).toContain('idemkey.intent')
    } finally {
      trace.disable()
    }
  })
})

describe('events carry durations', () => {
  it('reports the time since the run began, and the time spent waiting', async () => {
    const clock = new ManualClock()
    const events: LedgerEvent[] = []
    const ledger = new Ledger({ store: new MemoryStore({ clock }), clock, onEvent: (e) => events.push(e) })
    await ledger.run({ key: 'd', payload: 1 }, () => {
      clock.advance(40)
      return 'ok'
    })
    expect(events.find((e) => e.type === 'acquired')).toMatchObject({ waitedMs: 0, durationMs: 0 })
    expect(events.find((e) => e.type === 'stored')).toMatchObject({ durationMs: 40 })
    await ledger.run({ key: 'd', payload: 1 }, () => 'ok')
    expect(events.find((e) => e.type === 'replayed')).toMatchObject({ waitedMs: 0, durationMs: 0 })
  })
})

describe('the HTTP layer reports the status it answered', () => {
  const body = (text: string) => async () => new TextEncoder().encode(text)
  const request = (key: string, text = '{}'): HttpRequestLike => ({
    method: 'POST',
    url: '/orders',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, authorization: 'Bearer t' },
    body: body(text),
  })

  it('sends an answered event per covered request, with outcome, status and duration', async () => {
    const events: EngineEvent[] = []
    const engine = createEngine({
      ledger: new Ledger({ store: new MemoryStore() }),
      scopeSecret: 'test-secret-of-sufficient-length',
      onEvent: (e) => events.push(e),
    })
    const created = async () => ({ status: 201, headers: { 'content-type': 'application/json' }, body: new TextEncoder().encode('{}') })
    await engine.handle(request('k1'), created)
    await engine.handle(request('k1'), created)
    await engine.handle(request('k1', '{"other":1}'), created)
    await engine.handle(request('bad\u0001key'), created)
    const answered = events.filter((e) => e.type === 'answered')
    expect(answered.map((e) => e.type === 'answered' && [e.outcome, e.status])).toEqual([
      ['executed', 201],
      ['replayed', 201],
      ['mismatch', 422],
      ['rejected', 400],
    ])
    for (const e of answered) expect(e.type === 'answered' && e.durationMs).toBeGreaterThanOrEqual(0)
  })
})
