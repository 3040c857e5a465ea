/**
 * The proxy's Prometheus metrics (text exposition written by metrics-text.ts), the same measures as idemkey/opentelemetry's under
 * Prometheus names (docs/observability.md). Loaded only by `idemkey proxy --admin-port`.
 */
import { holdersPastLease } from '../../core/lease-end.js'
import type { LedgerTelemetry } from '../../core/ledger.js'
import type { IdempotencyStore } from '../../core/store.js'
import { isIdempotencyError } from '../../errors.js'
import type { AnswerOutcome } from '../../http/types.js'
import { DURATION_BUCKETS_S, recorder } from '../../observability/recorder.js'
import { counter, gauge, Histogram, Registry, registerProcessMetrics } from './metrics-text.js'

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
    registry.register(
      gauge(
        'idemkey_holders_past_lease',
        'In-progress records past their lease, by state: stuck (the holder crashed or hung: the next retry takes over and runs the work again) or in_transaction (alive: its open transaction holds the row, docs/steps.md)',
        async (metric) => {
          metric.reset()
          try {
            const holders = await holdersPastLease(store, Date.now())
            metric.cell({ state: 'stuck' }).value = holders.stuck
            metric.cell({ state: 'in_transaction' }).value = holders.inTransaction
          } catch {
            // The store did not answer: no sample (idemkey_store_up and the store errors say so), not a failed scrape.
          }
        },
      ),
    )
  }
  const intents = registry.register(
    counter(
      'idemkey_intents_total',
      'Ledger runs that ended, by result (executed, replayed, mismatch, in_progress, error) and outcome (completed, failed, released, fenced_out, unrecorded)',
    ),
  )
  const running = registry.register(gauge('idemkey_intents_running', 'Ledger runs under way now'))
  const waiting = registry.register(
    new Histogram('idemkey_wait_duration_seconds', 'Time a run spent waiting for another holder of its key', DURATION_BUCKETS_S),
  )
  const storeDuration = registry.register(
    new Histogram(
      'idemkey_store_operation_duration_seconds',
      'Duration of store operations (acquire, renew, complete, release)',
      DURATION_BUCKETS_S,
    ),
  )
  const storeErrors = registry.register(
    counter('idemkey_store_errors_total', 'Store operations that failed (the store was unreachable, slow or refused)'),
  )
  const unrecorded = registry
    .register(
      counter(
        'idemkey_unrecorded_total',
        'Outcomes the store did not take before the lease ended: a retry after the lease runs the request again',
      ),
    )
    .cell()
  const responses = registry.register(
    counter(
      'idemkey_http_responses_total',
      'Requests the proxy answered, by how (executed, replayed, mismatch, in_progress, store_unavailable, rejected, passthrough, proxy_error) and HTTP status',
    ),
  )
  const responseDuration = registry.register(
    new Histogram(
      'idemkey_http_response_duration_seconds',
      'Time from a request reaching the proxy to its answer, by outcome',
      DURATION_BUCKETS_S,
    ),
  )
  const up = registry
    .register(gauge('idemkey_store_up', '1 while the store answers, 0 while it does not (as last seen by a request or /readyz)'))
    .cell()
  registerProcessMetrics(registry)
  const telemetry = recorder([
    {
      runStarted: (system) => void running.cell({ store: system }).value++,
      runEnded: (run) => {
        running.cell({ store: run.system }).value--
        intents.cell({ store: run.system, result: run.result, outcome: run.outcome ?? '' }).value++
        if (run.waitedSeconds > 0) waiting.cell({ store: run.system }).observe(run.waitedSeconds)
      },
      storeCall: (system, operation, seconds, error) => {
        storeDuration.cell({ store: system, operation }).observe(seconds)
        if (error !== undefined) {
          const code = isIdempotencyError(error) ? error.code : ((error as Error)?.name ?? 'Error')
          storeErrors.cell({ store: system, operation, error: code }).value++
        }
      },
    },
  ])
  return {
    registry,
    telemetry,
    answered(outcome, status, seconds) {
      responses.cell({ outcome, status: String(status) }).value++
      responseDuration.cell({ outcome }).observe(seconds)
    },
    unrecorded: () => void unrecorded.value++,
    storeUp: (value) => {
      up.value = value ? 1 : 0
    },
  }
}
