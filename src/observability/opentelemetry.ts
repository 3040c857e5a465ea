/**
 * idemkey/opentelemetry: spans and metrics of every ledger run through `@opentelemetry/api` (an
 * optional peer dependency: install it, and an SDK, to use this entry point). docs/observability.md
 * lists every name.
 */
import {
  type Attributes,
  type Context,
  context,
  type Meter,
  type MeterProvider,
  metrics,
  type ObservableResult,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  type TracerProvider,
  trace,
} from '@opentelemetry/api'
import { holdersPastLease } from '../core/lease-end.js'
import type { LedgerTelemetry } from '../core/ledger.js'
import type { IdempotencyStore } from '../core/store.js'
import { assertMethods } from '../core/validate.js'
import { isIdempotencyError } from '../errors.js'
import {
  DURATION_BUCKETS_S,
  dbSystem,
  keyHash,
  type MetricSink,
  type RunSpan,
  type RunSummary,
  recorder,
  type SpanStarter,
  scopeHash,
} from './recorder.js'

export type { LedgerTelemetry, RunTelemetry } from '../core/ledger.js'
export type { MetricSink, RunOutcome, RunResultKind, RunSummary } from './recorder.js'
export { DURATION_BUCKETS_S, keyHash } from './recorder.js'

/** The instrumentation scope's name, on every span and instrument. */
export const INSTRUMENTATION_NAME = 'idemkey'

/** Options of {@link openTelemetry}. */
export interface OpenTelemetryOptions {
  /** Where spans go. @default the global tracer provider (`trace.getTracerProvider()`) */
  tracerProvider?: TracerProvider
  /** Where metrics go. @default the global meter provider (`metrics.getMeterProvider()`) */
  meterProvider?: MeterProvider
  /** Record spans. @default true */
  traces?: boolean
  /** Record metrics. @default true */
  metrics?: boolean
  /**
   * The store whose holders past their lease the gauge `idemkey.holders.past_lease` reports, read at each
   * collection (in-progress records, at most 1,000): `idemkey.holder.state` is `stuck` (crashed or hung:
   * page on it) or `in_transaction` (alive inside its transaction, docs/steps.md). Without it the gauge
   * is not made.
   */
  store?: IdempotencyStore
}

/**
 * Spans and metrics of each ledger run, for `new Ledger({ telemetry })`: a span `idemkey.intent` per
 * run with a child span per store operation, and the instruments listed in docs/observability.md.
 * Keys and scopes appear only hashed.
 *
 * @example
 * import { openTelemetry } from 'idemkey/opentelemetry'
 * const ledger = new Ledger({ store, telemetry: openTelemetry() })
 */
export function openTelemetry(options: OpenTelemetryOptions = {}): LedgerTelemetry {
  // A provider of the wrong kind (an SDK's exporter, a tracer) crashed here with a TypeError.
  assertMethods('openTelemetry()', 'meterProvider', options.meterProvider, ['getMeter'])
  assertMethods('openTelemetry()', 'tracerProvider', options.tracerProvider, ['getTracer'])
  const sinks: MetricSink[] = []
  if (options.metrics !== false) {
    const meter = (options.meterProvider ?? metrics.getMeterProvider()).getMeter(INSTRUMENTATION_NAME)
    sinks.push(otelMetrics(meter))
    if (options.store) holdersGauge(meter, options.store)
  }
  const spans =
    options.traces === false ? undefined : otelSpans((options.tracerProvider ?? trace.getTracerProvider()).getTracer(INSTRUMENTATION_NAME))
  return recorder(sinks, spans)
}

/**
 * The instruments. Counts are kept in plain numbers and reported through observable instruments when
 * the SDK collects (a counter's `add` costs the SDK an attribute hash per call, on every run); only the
 * store-call and wait durations are recorded as they happen, with attribute objects made once.
 */
function otelMetrics(meter: Meter): MetricSink {
  const intents = new Map<string, { attributes: Attributes; value: number }>()
  const errors = new Map<string, { attributes: Attributes; value: number }>()
  const running = new Map<string, { attributes: Attributes; value: number }>()
  // Store-call attributes by store then operation: no string is built per call.
  const durationAttributes = new Map<string, Map<string, Attributes>>()
  type Count = { attributes: Attributes; value: number }
  const bySystem = (map: Map<string, Count>, system: string, by: number) => {
    const entry = map.get(system)
    if (entry) entry.value += by
    else map.set(system, { attributes: { 'db.system.name': system }, value: by })
  }
  const observe = (map: Map<string, { attributes: Attributes; value: number }>) => (result: ObservableResult) => {
    for (const entry of map.values()) result.observe(entry.value, entry.attributes)
  }
  meter
    .createObservableCounter('idemkey.intents', {
      description: 'Ledger runs that ended, by result (executed, replayed, mismatch, in_progress, error) and outcome',
      unit: '{intent}',
    })
    .addCallback(observe(intents))
  meter
    .createObservableUpDownCounter('idemkey.intents.running', { description: 'Ledger runs under way now', unit: '{intent}' })
    .addCallback(observe(running))
  meter
    .createObservableCounter('idemkey.store.errors', {
      description: 'Store operations that failed (the store was unreachable, slow or refused)',
      unit: '{error}',
    })
    .addCallback(observe(errors))
  const waiting = meter.createHistogram('idemkey.wait.duration', {
    description: 'Time a run spent waiting for another holder of its key',
    unit: 's',
    advice: { explicitBucketBoundaries: DURATION_BUCKETS_S },
  })
  const storeDuration = meter.createHistogram('db.client.operation.duration', {
    description: 'Duration of idemkey store operations',
    unit: 's',
    advice: { explicitBucketBoundaries: DURATION_BUCKETS_S },
  })
  return {
    runStarted(system) {
      bySystem(running, system, 1)
    },
    runEnded(run) {
      bySystem(running, run.system, -1)
      const id = `${run.system}|${run.result}|${run.outcome ?? ''}`
      const entry = intents.get(id)
      if (entry) entry.value++
      else {
        const attributes: Attributes = { 'db.system.name': run.system, 'idemkey.result': run.result }
        if (run.outcome) attributes['idemkey.outcome'] = run.outcome
        intents.set(id, { attributes, value: 1 })
      }
      if (run.waitedSeconds > 0) waiting.record(run.waitedSeconds, { 'db.system.name': run.system })
    },
    storeCall(system, operation, seconds, error) {
      if (error === undefined) {
        let operations = durationAttributes.get(system)
        if (!operations) {
          operations = new Map()
          durationAttributes.set(system, operations)
        }
        let attributes = operations.get(operation)
        if (!attributes) {
          attributes = { 'db.system.name': system, 'db.operation.name': operation }
          operations.set(operation, attributes)
        }
        return storeDuration.record(seconds, attributes)
      }
      const type = errorType(error)
      storeDuration.record(seconds, { 'db.system.name': system, 'db.operation.name': operation, 'error.type': type })
      const id = `${system}|${operation}`
      const entry = errors.get(id)
      if (entry) entry.value++
      else errors.set(id, { attributes: { 'db.system.name': system, 'db.operation.name': operation }, value: 1 })
    },
  }
}

/** `idemkey.holders.past_lease`: read from the store when the SDK collects; no point while the store does not answer. */
function holdersGauge(meter: Meter, store: IdempotencyStore): void {
  const system = dbSystem(store.name)
  const stuck: Attributes = { 'db.system.name': system, 'idemkey.holder.state': 'stuck' }
  const inTransaction: Attributes = { 'db.system.name': system, 'idemkey.holder.state': 'in_transaction' }
  meter
    .createObservableGauge('idemkey.holders.past_lease', {
      description:
        'In-progress records past their lease: stuck (the holder crashed or hung) or in_transaction (alive inside its transaction)',
      unit: '{record}',
    })
    .addCallback(async (result) => {
      try {
        const holders = await holdersPastLease(store, Date.now())
        result.observe(holders.stuck, stuck)
        result.observe(holders.inTransaction, inTransaction)
      } catch {
        // The store did not answer: no point (idemkey.store.errors says so), not a failed collection.
      }
    })
}

function otelSpans(tracer: Tracer): SpanStarter {
  return (system, scope, key) => new OtelRun(tracer, system, scope, key)
}

class OtelRun implements RunSpan {
  readonly span: Span
  readonly context: Context
  readonly recording: boolean

  constructor(
    readonly tracer: Tracer,
    readonly system: string,
    scope: string,
    key: string,
  ) {
    this.span = tracer.startSpan('idemkey.intent', { kind: SpanKind.INTERNAL, attributes: { 'db.system.name': system } })
    this.recording = this.span.isRecording()
    // Hashed only for a span that records (a sampler may drop it).
    if (this.recording) {
      this.span.setAttribute('idemkey.key_hash', keyHash(scope, key))
      this.span.setAttribute('idemkey.scope_hash', scopeHash(scope))
    }
    this.context = trace.setSpan(context.active(), this.span)
  }

  storeCall<R>(operation: string, call: () => Promise<R>): Promise<R> {
    // A run the sampler dropped gets no child spans: they would be dropped too (parent-based sampling).
    if (!this.recording) return call()
    const span = this.tracer.startSpan(
      `${operation} ${this.system}`,
      { kind: SpanKind.CLIENT, attributes: { 'db.system.name': this.system, 'db.operation.name': operation } },
      this.context,
    )
    let pending: Promise<R>
    try {
      pending = context.with(trace.setSpan(this.context, span), call)
    } catch (error) {
      // A store method that throws instead of returning a rejected promise: its span still ends, as an error.
      pending = Promise.reject(error)
    }
    return pending.then(
      (value) => {
        span.end()
        return value
      },
      (error: unknown) => {
        failed(span, error)
        span.end()
        throw error
      },
    )
  }

  work<R>(fn: () => R): R {
    return context.with(this.context, fn)
  }

  end(summary: RunSummary, token: number | undefined, error: unknown): void {
    const span = this.span
    span.setAttribute('idemkey.result', summary.result)
    if (summary.outcome) span.setAttribute('idemkey.outcome', summary.outcome)
    if (token !== undefined) {
      span.setAttribute('idemkey.token', token)
      span.setAttribute('idemkey.takeover', summary.takeover)
    }
    span.setAttribute('idemkey.wait.duration', summary.waitedSeconds)
    if (error !== undefined) failed(span, error)
    else if (summary.outcome === 'unrecorded') {
      span.setStatus({ code: SpanStatusCode.ERROR, message: 'the outcome was not recorded before the lease ended' })
    }
    span.end()
  }
}

function failed(span: Span, error: unknown): void {
  span.setAttribute('error.type', errorType(error))
  // idemkey's own messages can name the key: only their code goes out. The work's own errors are the app's.
  if (isIdempotencyError(error)) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: error.code })
    return
  }
  if (error instanceof Error) span.recordException(error)
  span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) })
}

/** `error.type`: the idemkey error code, else the error's class name. */
function errorType(error: unknown): string {
  if (isIdempotencyError(error)) return error.code
  if (error instanceof Error) return error.name
  return '_OTHER'
}
