/**
 * The proxy's Prometheus metrics (prom-client), the same measures as idemkey/opentelemetry's under
 * Prometheus names (docs/observability.md). Loaded only by `idemkey proxy --admin-port`.
 */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client'
import { holdersPastLease } from '../core/lease-end.js'
import type { LedgerTelemetry } from '../core/ledger.js'
import type { IdempotencyStore } from '../core/store.js'
import { isIdempotencyError } from '../errors.js'
import type { AnswerOutcome } from '../http/types.js'
import { DURATION_BUCKETS_S, recorder } from './recorder.js'

/** The proxy's metrics and the telemetry that feeds them. */
export interface PrometheusMetrics {
  registry: Registry
  /** For `new Ledger({ telemetry })`. */
  telemetry: LedgerTelemetry
  /** One answered request (the HTTP layer's `answered` event, or the proxy's pass-through). */
  answered(outcome: AnswerOutcome | 'passthrough' | 'proxy_error', status: number, seconds: number): void
  /** Each outcome the store did not take before the lease ended. */
  unrecorded(): void
  /** Whether the store answers, as last seen. */
  storeUp(up: boolean): void
}

/** Options of {@link prometheusMetrics}. */
export interface PrometheusMetricsOptions {
  /**
   * The store whose holders past their lease `idemkey_holders_past_lease` counts, read at each scrape
   * (in-progress records, at most 1,000: `HOLDERS_COUNT_LIMIT`). Without it the gauge is not registered.
   */
  store?: IdempotencyStore
}

/**
 * Creates a registry with idemkey's metrics (and Node's default process metrics, `process_*`/`nodejs_*`).
 *
 * @example const metrics = prometheusMetrics({ store }); new Ledger({ store, telemetry: metrics.telemetry })
 */
export function prometheusMetrics(options: PrometheusMetricsOptions = {}): PrometheusMetrics {
  const registry = new Registry()
  const { store } = options
  if (store) {
    new Gauge({
      name: 'idemkey_holders_past_lease',
      help: 'In-progress records past their lease, by state: stuck (the holder crashed or hung: the next retry takes over and runs the work again) or in_transaction (alive: its open transaction holds the row, docs/steps.md)',
      labelNames: ['state'],
      registers: [registry],
      async collect() {
        this.reset()
        try {
          const holders = await holdersPastLease(store, Date.now())
          this.set({ state: 'stuck' }, holders.stuck)
          this.set({ state: 'in_transaction' }, holders.inTransaction)
        } catch {
          // The store did not answer: no sample (idemkey_store_up and the store errors say so), not a failed scrape.
        }
      },
    })
  }
  const intents = new Counter({
    name: 'idemkey_intents_total',
    help: 'Ledger runs that ended, by result (executed, replayed, mismatch, in_progress, error) and outcome (completed, failed, released, fenced_out, unrecorded)',
    labelNames: ['store', 'result', 'outcome'],
    registers: [registry],
  })
  const running = new Gauge({
    name: 'idemkey_intents_running',
    help: 'Ledger runs under way now',
    labelNames: ['store'],
    registers: [registry],
  })
  const waiting = new Histogram({
    name: 'idemkey_wait_duration_seconds',
    help: 'Time a run spent waiting for another holder of its key',
    labelNames: ['store'],
    buckets: DURATION_BUCKETS_S,
    registers: [registry],
  })
  const storeDuration = new Histogram({
    name: 'idemkey_store_operation_duration_seconds',
    help: 'Duration of store operations (acquire, renew, complete, release)',
    labelNames: ['store', 'operation'],
    buckets: DURATION_BUCKETS_S,
    registers: [registry],
  })
  const storeErrors = new Counter({
    name: 'idemkey_store_errors_total',
    help: 'Store operations that failed (the store was unreachable, slow or refused)',
    labelNames: ['store', 'operation', 'error'],
    registers: [registry],
  })
  const unrecorded = new Counter({
    name: 'idemkey_unrecorded_total',
    help: 'Outcomes the store did not take before the lease ended: a retry after the lease runs the request again',
    registers: [registry],
  })
  const responses = new Counter({
    name: 'idemkey_http_responses_total',
    help: 'Requests the proxy answered, by how (executed, replayed, mismatch, in_progress, store_unavailable, rejected, passthrough, proxy_error) and HTTP status',
    labelNames: ['outcome', 'status'],
    registers: [registry],
  })
  const responseDuration = new Histogram({
    name: 'idemkey_http_response_duration_seconds',
    help: 'Time from a request reaching the proxy to its answer, by outcome',
    labelNames: ['outcome'],
    buckets: DURATION_BUCKETS_S,
    registers: [registry],
  })
  const up = new Gauge({
    name: 'idemkey_store_up',
    help: '1 while the store answers, 0 while it does not (as last seen by a request or /readyz)',
    registers: [registry],
  })
  collectDefaultMetrics({ register: registry })
  // Label children made once per label set: prom-client hashes the labels on every call otherwise.
  const children = new Map<string, unknown>()
  const child = <C>(id: string, make: () => C): C => {
    let found = children.get(id) as C | undefined
    if (found === undefined) {
      found = make()
      children.set(id, found)
    }
    return found
  }
  const telemetry = recorder([
    {
      runStarted: (system) => child(`r|${system}`, () => running.labels(system)).inc(),
      runEnded: (run) => {
        child(`r|${run.system}`, () => running.labels(run.system)).dec()
        const outcome = run.outcome ?? ''
        child(`i|${run.system}|${run.result}|${outcome}`, () => intents.labels(run.system, run.result, outcome)).inc()
        if (run.waitedSeconds > 0) waiting.observe({ store: run.system }, run.waitedSeconds)
      },
      storeCall: (system, operation, seconds, error) => {
        child(`s|${system}|${operation}`, () => storeDuration.labels(system, operation)).observe(seconds)
        if (error !== undefined) {
          storeErrors.inc({ store: system, operation, error: isIdempotencyError(error) ? error.code : ((error as Error)?.name ?? 'Error') })
        }
      },
    },
  ])
  return {
    registry,
    telemetry,
    answered(outcome, status, seconds) {
      child(`a|${outcome}|${status}`, () => responses.labels(outcome, String(status))).inc()
      child(`d|${outcome}`, () => responseDuration.labels(outcome)).observe(seconds)
    },
    unrecorded: () => unrecorded.inc(),
    storeUp: (value) => up.set(value ? 1 : 0),
  }
}
