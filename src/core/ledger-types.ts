/**
 * The ledger's public types (docs/ledger.md): its options, an intent, what the work sees, what a run
 * answers and the events it reports. `idemkey` and src/core/ledger.ts export them.
 */
import type { Clock } from './clock.js'
import type { Duration } from './duration.js'
import type { Classification } from './outcome.js'
import type { Reconcile, StepMethods } from './steps.js'
import type { IdempotencyStore, StoredRecord, StoredResponse } from './store.js'

/** The default scope when an intent names none. */
export const DEFAULT_SCOPE = 'default'

/** Options of {@link Ledger}. Durations take milliseconds or strings such as `30s`, `24h`. */
export interface LedgerOptions<S extends IdempotencyStore = IdempotencyStore> {
  /** Where records live. */
  store: S
  /** How long a holder owns a record without renewing it; renewed every third of it while work runs. @default '30s' */
  lease?: Duration
  /** How long completed and failed records are replayed. @default '24h' */
  ttl?: Duration
  /** How long to wait for another holder of the same key before answering `in_progress`. @default '10s' */
  wait?: Duration
  /** Where time comes from; inject a `ManualClock` in tests (and give the same one to the store). @default systemClock */
  clock?: Clock
  /** A network store call that takes longer than this fails with `STORE_UNAVAILABLE`. @default '5s' */
  storeTimeout?: Duration
  /**
   * Where `storeTimeout` is timed. Real time by default, even with an injected `clock`, so that a
   * test's stopped ManualClock cannot hang a store call forever; a simulation that owns all time
   * (npm run sim) passes its clock here too. @default systemClock
   */
  storeTimeoutClock?: Clock
  /** Called for each thing the ledger does: hook logs and metrics here. Must not throw. */
  onEvent?: (event: LedgerEvent) => void
  /**
   * Traces and metrics of each run, e.g. `openTelemetry()` from `idemkey/opentelemetry`
   * (docs/observability.md). Unset, nothing is recorded and nothing is spent on it.
   */
  telemetry?: LedgerTelemetry
}

/**
 * What the ledger calls to trace and measure its runs (docs/observability.md). `idemkey/opentelemetry`
 * implements it; implement it to feed another system. Called on the hot path: keep it cheap, never throw.
 */
export interface LedgerTelemetry {
  /** A run begins (before its first store call). The run's store calls, events and end go to what it returns. */
  startRun(scope: string, key: string, store: string): RunTelemetry
}

/** One run, as {@link LedgerTelemetry} sees it. */
export interface RunTelemetry {
  /** Wraps one store operation (`acquire`, `renew`, `complete`, `release`); resolves or rejects as `call` does. */
  storeCall<R>(operation: string, call: () => Promise<R>): Promise<R>
  /** Runs the work function (in the run's trace context, so the work's own spans nest under it). */
  work<R>(fn: () => R): R
  /** Each event of the run, as the ledger's `onEvent` sees it. */
  event(event: LedgerEvent): void
  /** The run is over: with its result's kind, or the error it threw. */
  end(kind: RunResult<unknown>['kind'] | undefined, error?: unknown): void
}

/** One logical operation meant to happen once. */
export interface Intent {
  /** The idempotency key: 1–255 characters, each 0x20–0x7E. */
  key: string
  /** The namespace of the key (tenant, account). @default 'default' */
  scope?: string
  /** Hex SHA-256 of what the intent asks for. Give this or `payload`, not both (`INVALID_ARGUMENT`). */
  fingerprint?: string
  /** What the intent asks for; its canonical JSON is hashed into the fingerprint. */
  payload?: unknown
}

/** What the work function receives; `step`, `capture`, `now`, `uuid` and `random` are durable steps (docs/steps.md). */
export interface IntentContext extends StepMethods {
  scope: string
  key: string
  fingerprint: string
  /** The fencing token this attempt holds. */
  token: number
  /** `true` when an earlier attempt at this key did not finish (it crashed, timed out or released a transient failure). */
  takeover: boolean
  /** Aborted when this attempt loses its lease (another holder took over): stop work that has not committed. */
  signal: AbortSignal
}

/** Context of {@link Ledger.runInTransaction}: the same, plus the store's transaction. */
export interface TransactionContext<Tx> extends IntentContext {
  /** The open transaction that will also complete the record. Do the business writes on it. */
  tx: Tx
}

/** How a value becomes a stored response and back. The default stores JSON with status 200. */
export interface RunOptions<T> {
  /** Turns the work's value into what is stored. */
  encode?: (value: T) => StoredResponse
  /** Turns a stored response back into a value for a replay. */
  decode?: (response: StoredResponse, record: StoredRecord) => T
  /** Decides whether the value is stored (`completed`/`failed`) or released (`transient`). @default by the response's status: 2xx/3xx completed, 4xx failed except 401, 408, 409, 425, 429, which and 5xx are transient */
  classify?: (value: T, response: StoredResponse) => Classification
  /** A pointer to what the work created, stored with the record. */
  resourceId?: (value: T) => string | null | undefined
  lease?: Duration
  ttl?: Duration
  wait?: Duration
  /** Also called for this run's events, besides the ledger's `onEvent` (the HTTP layer reports through it). Must not throw. */
  onEvent?: (event: LedgerEvent) => void
  /**
   * Called on a takeover, before the work, with the steps an earlier attempt started but did not record
   * (docs/steps.md, "Reconciliation"). Setting it makes each step record a "started" marker first.
   */
  reconcile?: Reconcile
  /**
   * When this run's hold must end at the latest, in epoch ms by the ledger's clock (a Lambda invocation's
   * end): every lease the run takes or renews ends by then, and a renewal due after it is not made (the
   * lease is lost, and the work's signal aborted). A run that dies with its deadline frees the record
   * then, not a whole lease later.
   */
  deadlineMs?: number
  /**
   * `runInTransaction` only: what becomes of the work's writes when its value is classified `failed` (a
   * final answer such as `422 out of stock`, stored and replayed). `'rollback'`: they are rolled back to
   * a savepoint taken before the work, and the answer is recorded in the same transaction, so a client
   * told "rejected" finds nothing of the request done. `'commit'`: they commit with the answer (work that
   * deliberately keeps, say, an audit row of a decline). A thrown error or a transient answer rolls
   * everything back either way (docs/http.md, "What happens to the handler's writes").
   * @default 'rollback'
   */
  failedWrites?: FailedWrites
}

/** What {@link RunOptions.failedWrites} does with the work's writes on a final failure. */
export type FailedWrites = 'rollback' | 'commit'

/** What happened to the outcome of an executed attempt. */
export type ExecutedOutcome =
  /** Stored as a success; replayed from now on. */
  | 'completed'
  /** Stored as a final failure; replayed from now on. */
  | 'failed'
  /** Transient: released, the next retry runs afresh. */
  | 'released'
  /** Another holder took the record over meanwhile; this outcome was discarded. */
  | 'fenced_out'
  /**
   * The store could not take it for as long as the lease protected the record (it was retried until
   * shortly before the lease's end): a retry after the lease will run the work again. Reported with an
   * `unrecorded` event; see docs/ledger.md, "Store outages", for what an operator does about it.
   */
  | 'unrecorded'

/** The result of {@link Ledger.run}. */
export type RunResult<T> =
  | { kind: 'executed'; value: T; token: number; outcome: ExecutedOutcome; response: StoredResponse }
  | { kind: 'replayed'; value: T; record: StoredRecord }
  | { kind: 'mismatch'; scope: string; key: string }
  | { kind: 'in_progress'; lockedUntilMs: number; retryAfterMs: number }

/**
 * Reported through {@link LedgerOptions.onEvent}. `durationMs` is the time since the run began (by the
 * ledger's clock), but on `store_error`, where it is how long the failed store call took; `waitedMs` is
 * the time spent waiting for another holder of the key before this event.
 */
export type LedgerEvent =
  | { type: 'acquired'; scope: string; key: string; token: number; waitedMs: number; durationMs: number }
  | { type: 'replayed'; scope: string; key: string; waitedMs: number; durationMs: number }
  | { type: 'mismatch'; scope: string; key: string; waitedMs: number; durationMs: number }
  | { type: 'waiting'; scope: string; key: string; lockedUntilMs: number; durationMs: number }
  /** Still held by another after the whole `wait`: answered `in_progress` (`409` over HTTP). */
  | { type: 'in_progress'; scope: string; key: string; lockedUntilMs: number; waitedMs: number; durationMs: number }
  | { type: 'stored'; scope: string; key: string; token: number; status: 'completed' | 'failed'; durationMs: number }
  | { type: 'released'; scope: string; key: string; token: number; durationMs: number }
  | { type: 'fenced_out'; scope: string; key: string; token: number; durationMs: number }
  | { type: 'lease_lost'; scope: string; key: string; token: number; durationMs: number }
  | { type: 'store_error'; scope: string; key: string; operation: string; error: unknown; durationMs: number }
  /** The work ran but its outcome could not be stored before the lease ended: a retry will run it again. */
  | {
      type: 'unrecorded'
      scope: string
      key: string
      token: number
      status: 'completed' | 'failed'
      attempts: number
      error: unknown
      durationMs: number
    }

/** A run that ended without this caller holding the record. */
export type Settled<T> = Exclude<RunResult<T>, { kind: 'executed' }>

/** What {@link Ledger.begin} resolves with. */
export type Begun<T> = Acquired<T> | Settled<T>

/** The record is this caller's: run the work, then call exactly one of `finish` or `fail`. */
export interface Acquired<T> {
  readonly kind: 'acquired'
  /** What the work sees, as `run`'s work function would. */
  readonly context: IntentContext
  /** Stores the work's value (or releases it, when classified transient), as `run` would, and resolves with `run`'s result. */
  finish(value: T): Promise<RunResult<T>>
  /** The work failed: releases the record so a retry runs afresh. */
  fail(error: unknown): Promise<void>
}
