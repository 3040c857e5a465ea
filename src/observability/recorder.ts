import { sha256Hex } from '../core/fingerprint.js'
import type { LedgerEvent, LedgerTelemetry, RunResult, RunTelemetry } from '../core/ledger.js'

/** How a run ended: its result's kind, or `error` when it threw (the work failed, or the store did). */
export type RunResultKind = RunResult<unknown>['kind'] | 'error'

/** What became of an executed run's outcome (`released` also when the work threw). */
export type RunOutcome = 'completed' | 'failed' | 'released' | 'fenced_out' | 'unrecorded'

/** One finished run, as the metrics see it: no key, no scope. */
export interface RunSummary {
  /** The store's `db.system.name` (`postgresql`, `redis`, `mysql`, `sqlite`, `memory`). */
  system: string
  result: RunResultKind
  outcome: RunOutcome | undefined
  /** From the run's start to its end. */
  seconds: number
  /** Spent waiting for another holder of the key (0 when it did not wait). */
  waitedSeconds: number
  takeover: boolean
}

/** Where runs are counted: OpenTelemetry instruments, prom-client metrics, the operator page's recent activity. */
export interface MetricSink {
  runStarted(system: string): void
  runEnded(run: RunSummary): void
  storeCall(system: string, operation: string, seconds: number, error: unknown): void
}

/** A tracer's view of one run (see opentelemetry.ts). */
export interface RunSpan {
  storeCall<R>(operation: string, call: () => Promise<R>): Promise<R>
  work<R>(fn: () => R): R
  end(summary: RunSummary, token: number | undefined, error: unknown): void
}

/** Starts a {@link RunSpan} per run (it hashes the key and scope itself, only when the span records). */
export type SpanStarter = (system: string, scope: string, key: string) => RunSpan

/** The `db.system.name` of a store, by the semantic conventions' names where there is one. */
export function dbSystem(storeName: string): string {
  switch (storeName) {
    case 'postgres':
      return 'postgresql'
    default:
      return storeName
  }
}

/**
 * The hash under which a key appears in telemetry and logs: the first 16 hex digits of
 * SHA-256(scope, newline, key), as `idemkey proxy` logs it. Keys and scopes can carry customer data;
 * the hash lets an operator match log lines, spans and the operator page's rows to one another (and,
 * knowing a key, to its record) without them.
 *
 * @example keyHash('default', 'order-42') // '3f1c…' (16 hex digits)
 */
export function keyHash(scope: string, key: string): string {
  return sha256Hex(scope, '\n', key).slice(0, 16)
}

/** The hash of a scope alone, for span attributes. */
export function scopeHash(scope: string): string {
  return sha256Hex(scope).slice(0, 16)
}

/** Boundaries of the duration histograms, in seconds: 0.5 ms to 10 s. */
export const DURATION_BUCKETS_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

const now = () => performance.now()

/**
 * A {@link LedgerTelemetry} that feeds metric sinks and, optionally, a tracer: the one implementation
 * behind `openTelemetry()`, the proxy's Prometheus metrics and the operator page's activity.
 */
export function recorder(sinks: MetricSink[], spans?: SpanStarter): LedgerTelemetry {
  const systems = new Map<string, string>()
  return {
    startRun(scope, key, store) {
      let system = systems.get(store)
      if (system === undefined) {
        system = dbSystem(store)
        systems.set(store, system)
      }
      for (const sink of sinks) sink.runStarted(system)
      return new Run(sinks, system, spans?.(system, scope, key))
    },
  }
}

class Run implements RunTelemetry {
  readonly #startedAt = now()
  #outcome: RunOutcome | undefined
  #token: number | undefined
  #waitedMs = 0
  #ended = false

  constructor(
    readonly sinks: MetricSink[],
    readonly system: string,
    readonly span: RunSpan | undefined,
  ) {}

  async storeCall<R>(operation: string, call: () => Promise<R>): Promise<R> {
    const startedAt = now()
    let failure: unknown
    try {
      return await (this.span ? this.span.storeCall(operation, call) : call())
    } catch (error) {
      failure = error ?? new Error('store call failed')
      throw error
    } finally {
      const seconds = (now() - startedAt) / 1_000
      for (const sink of this.sinks) sink.storeCall(this.system, operation, seconds, failure)
    }
  }

  work<R>(fn: () => R): R {
    return this.span ? this.span.work(fn) : fn()
  }

  event(event: LedgerEvent): void {
    switch (event.type) {
      case 'acquired':
        this.#token = event.token
        this.#waitedMs = event.waitedMs
        break
      case 'replayed':
      case 'mismatch':
      case 'in_progress':
        this.#waitedMs = event.waitedMs
        break
      case 'stored':
        this.#outcome = event.status
        break
      case 'released':
      case 'fenced_out':
      case 'unrecorded':
        this.#outcome = event.type
        break
    }
  }

  end(kind: RunResult<unknown>['kind'] | undefined, error?: unknown): void {
    if (this.#ended) return
    this.#ended = true
    const summary: RunSummary = {
      system: this.system,
      result: kind ?? 'error',
      outcome: this.#outcome,
      seconds: (now() - this.#startedAt) / 1_000,
      waitedSeconds: this.#waitedMs / 1_000,
      takeover: (this.#token ?? 0) > 1,
    }
    for (const sink of this.sinks) sink.runEnded(summary)
    this.span?.end(summary, this.#token, error)
  }
}
