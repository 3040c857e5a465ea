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
  /** Each event of each run (the operator page keeps recent mismatches from them). */
  event?(event: LedgerEvent, keyHash: string): void
}

/** A tracer's view of one run (see opentelemetry.ts). */
export interface RunSpan {
  storeCall<R>(operation: string, call: () => Promise<R>): Promise<R>
  work<R>(fn: () => R): R
  end(summary: RunSummary, token: number | undefined, error: unknown): void
}

/** Starts a {@link RunSpan} per run. */
export type SpanStarter = (system: string, scopeHash: string, keyHash: string) => RunSpan

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
 * SHA-256(scope, newline, key), as `idemkey proxy` logs unrecorded outcomes. Keys and scopes can carry
 * customer data; this lets an operator match a log line to a record (`idemkey inspect` prints the same
 * hash) without them.
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
  const wantsEvents = sinks.some((sink) => sink.event)
  return {
    startRun(scope, key, store) {
      const system = dbSystem(store)
      for (const sink of sinks) sink.runStarted(system)
      const hash = spans || wantsEvents ? keyHash(scope, key) : ''
      return new Run(sinks, system, hash, spans?.(system, scopeHash(scope), hash))
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
    readonly keyHash: string,
    readonly span: RunSpan | undefined,
  ) {}

  storeCall<R>(operation: string, call: () => Promise<R>): Promise<R> {
    const startedAt = now()
    const settle = (error: unknown) => {
      const seconds = (now() - startedAt) / 1_000
      for (const sink of this.sinks) sink.storeCall(this.system, operation, seconds, error)
    }
    const traced = this.span ? this.span.storeCall(operation, call) : call()
    return traced.then(
      (value) => {
        settle(undefined)
        return value
      },
      (error: unknown) => {
        settle(error ?? new Error('store call failed'))
        throw error
      },
    )
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
    for (const sink of this.sinks) sink.event?.(event, this.keyHash)
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
