/**
 * What the ledger reports, audited against what happened (docs/testing.md, "Deterministic simulation"):
 * each app's ledger has a telemetry (`LedgerTelemetry`, as idemkey/otel plugs in) and an `onEvent`
 * listener, and what they were told is checked against the history the store server and the processes
 * recorded. An operator's dashboards and alerts read these reports; a run that never ends, an event that
 * reaches one listener and not the other, or an event that says what did not happen misleads them.
 */

import type { LedgerEvent, LedgerTelemetry, RunResult, RunTelemetry } from '../src/core/ledger-types.js'
import { type History, holderId } from './store-side.js'
import type { Proc } from './world.js'

/** The store operations a run's telemetry wraps (src/core/store-calls.ts). */
const OPERATIONS = new Set(['acquire', 'renew', 'complete', 'release', 'recordStep', 'get'])

/** One run as its telemetry saw it. */
export class SimRun implements RunTelemetry {
  ends = 0
  kind: RunResult<unknown>['kind'] | undefined
  error: unknown
  readonly events: LedgerEvent[] = []

  constructor(
    readonly audit: ReportAudit,
    readonly proc: Proc,
    readonly scope: string,
    readonly key: string,
  ) {}

  storeCall<R>(operation: string, call: () => Promise<R>): Promise<R> {
    if (!OPERATIONS.has(operation)) this.audit.history.violation(`telemetry was told of a store call named ${operation}`)
    return call()
  }

  work<R>(fn: () => R): R {
    return fn()
  }

  event(event: LedgerEvent): void {
    const { history } = this.audit
    if (event.scope !== this.scope || event.key !== this.key)
      history.violation(`the run of ${this.scope}/${this.key} was told of an event of ${event.scope}/${event.key}: ${event.type}`)
    // The ledger's own listener hears each event first (StoreCalls.emit), so it has this one already.
    if (!this.audit.heard.has(event))
      history.violation(`a ${event.type} event of ${this.scope}/${this.key} reached its run's telemetry, not the ledger's listener`)
    if (this.audit.told.has(event))
      history.violation(`a ${event.type} event of ${this.scope}/${this.key} reached the runs' telemetry twice`)
    this.audit.told.add(event)
    if (this.ends > 0) history.violation(`the run of ${this.scope}/${this.key} was told of ${event.type} after it ended`)
    this.events.push(event)
  }

  end(kind: RunResult<unknown>['kind'] | undefined, error?: unknown): void {
    this.ends++
    if (this.ends > 1) this.audit.history.violation(`the run of ${this.scope}/${this.key} ended ${this.ends} times`)
    this.kind = kind
    this.error = error
  }

  /** The token this run acquired, when it did. */
  token(): number | undefined {
    for (const event of this.events) if (event.type === 'acquired') return event.token
    return undefined
  }
}

/** Every app's telemetry and listener, and the checks made when the run of the seed is over. */
export class ReportAudit {
  readonly runs: SimRun[] = []
  /** Events the ledgers' own listeners heard. */
  readonly heard = new Set<LedgerEvent>()
  /** Events the runs' telemetry was told of. */
  readonly told = new Set<LedgerEvent>()
  /** `lease_lost` events, by holder. */
  readonly leaseLost = new Set<string>()
  /**
   * Holders whose process learnt that the store refused their renewal while their handler still ran:
   * each must be told `lease_lost` (the renewal was not stopped).
   */
  readonly refusedWhileWorking = new Set<string>()
  /** Holders whose handler has returned or thrown (the engine then stops the renewals). */
  readonly handlerDone = new Set<string>()
  /** Holders whose process learnt that the store applied their release, and that process. */
  readonly releasedApplied = new Map<string, Proc>()
  /** Those that learnt it inside the ledger's store timeout, their process undisturbed meanwhile. */
  readonly releasedInTime = new Set<string>()
  /**
   * Holders whose process learnt, inside the ledger's store timeout and undisturbed, what the store did with
   * their outcome: stored (a `complete`, or the commit of the transaction that completed the record), or refused
   * (a stale token). The ledger reports each: `stored` or `fenced_out`.
   */
  readonly outcomeLearnt = new Map<string, { proc: Proc; type: 'stored' | 'fenced_out' }>()
  /** Holders whose process heard the store refuse their outcome (a stale token), in time or not: only they may be reported `fenced_out`. */
  readonly refusedComplete = new Set<string>()
  /** Store calls that failed, as the ledger saw them (inside its store timeout), each with its process and call. */
  readonly #storeFailures = new Map<unknown, { proc: Proc; label: string }>()

  constructor(readonly history: History) {}

  /** The telemetry of one app's ledger. */
  telemetry(proc: Proc): LedgerTelemetry {
    return {
      startRun: (scope, key) => {
        const run = new SimRun(this, proc, scope, key)
        this.runs.push(run)
        return run
      },
    }
  }

  /** The ledger's own listener, as an app hands it to `new Ledger({ onEvent })`. */
  listen(event: LedgerEvent): void {
    this.heard.add(event)
    if (event.type === 'lease_lost') this.leaseLost.add(holderId(event.scope, event.key, event.token))
  }

  /** A store call of `proc` failed with `error` and the ledger saw it: it must report a `store_error` for it. */
  storeFailed(error: unknown, proc: Proc, label: string): void {
    this.#storeFailures.set(error, { proc, label })
  }

  /** A renewal the store refused reached the holder's process. */
  refused(holder: string): void {
    const { history } = this
    // A transactional run's handler starts once its transaction has begun: a BEGIN that failed ends the run first.
    const transactional = history.transactionalHolder(holder)
    if (transactional && !history.holderAmounts.has(holder)) return
    if (!this.handlerDone.has(holder) && !history.renewalsStopping.has(holder)) this.refusedWhileWorking.add(holder)
  }

  /**
   * Once every process has woken and every lease has ended: each run on a process that never crashed
   * ended once, with a result its events bear out; every event reached a run's telemetry; each holder
   * told by the store that it lost its record while working was reported `lease_lost`; and each
   * `stored` and `released` event is what the store holds.
   */
  async check(stored: (scope: string, key: string) => Promise<{ status: string; token: number } | null>): Promise<void> {
    const { history } = this
    for (const event of this.heard) {
      if (!this.told.has(event)) history.violation(`a ${event.type} event of ${event.scope}/${event.key} never reached its run's telemetry`)
    }
    for (const run of this.runs) {
      const id = `${run.scope}/${run.key}`
      if (run.proc.state === 'crashed') continue
      if (run.ends === 0) {
        history.violation(`a run of ${id} on ${run.proc.id} never ended (events: ${run.events.map((e) => e.type).join(', ')})`)
        continue
      }
      const types = new Set(run.events.map((e) => e.type))
      // The result's kind is the event the ledger reported for it: executed after acquiring, a replay, a refusal.
      const expected = run.kind === 'executed' ? 'acquired' : run.kind === undefined ? undefined : run.kind
      if (expected !== undefined && !types.has(expected))
        history.violation(`a run of ${id} ended ${run.kind} with no ${expected} event (events: ${[...types].join(', ')})`)
      if (run.kind === undefined && run.error === undefined) history.violation(`a run of ${id} ended with neither a result nor an error`)
      const token = run.token()
      if (token !== undefined && run.kind !== undefined && run.kind !== 'executed')
        history.violation(`a run of ${id} acquired #${token} and ended ${run.kind}`)
    }
    for (const [holder, proc] of history.transientEnd) {
      if (proc.state !== 'crashed' && !history.releaseAsked.has(holder))
        history.violation(
          `${holder} failed transiently and its process never asked the store to release the record (a retry waits for the lease)`,
        )
    }
    for (const holder of this.refusedWhileWorking) {
      if (!this.leaseLost.has(holder)) history.violation(`${holder} was refused its renewal while working and no lease_lost was reported`)
    }
    // A store call that failed is reported as a store_error naming its operation, with the driver's error as
    // its cause; a `released` event is a release the store applied, and every one the process learnt of is one.
    const reported = new Map<unknown, LedgerEvent>()
    const released = new Set<string>()
    for (const event of this.heard) {
      if (event.type === 'store_error') {
        const error = event.error as { code?: unknown; cause?: unknown }
        if (error.code !== 'STORE_UNAVAILABLE') history.violation(`a store_error of ${event.scope}/${event.key} is ${String(event.error)}`)
        reported.set(error.cause, event)
      }
      if (event.type === 'released') {
        const holder = holderId(event.scope, event.key, event.token)
        released.add(holder)
        if (!this.releasedApplied.has(holder)) history.violation(`${holder} was reported released, and the store released nothing of it`)
      }
    }
    for (const [error, { proc, label }] of this.#storeFailures) {
      if (proc.state === 'crashed') continue
      const event = reported.get(error)
      const operation = label.split(' ')[0]
      if (event === undefined) history.violation(`a failed store call (${label} on ${proc.id}) was reported nowhere`)
      else if (event.type === 'store_error' && event.operation !== operation)
        history.violation(`a failed store call (${label} on ${proc.id}) was reported as a store_error of ${event.operation}`)
    }
    for (const [holder, proc] of this.releasedApplied) {
      if (proc.state !== 'crashed' && this.releasedInTime.has(holder) && !released.has(holder))
        history.violation(`${holder}'s release was applied and never reported`)
    }
    const outcomes = new Set<string>()
    for (const event of this.heard) {
      if (event.type !== 'stored' && event.type !== 'fenced_out') continue
      const holder = holderId(event.scope, event.key, event.token)
      outcomes.add(`${holder} ${event.type}`)
      if (event.type === 'fenced_out' && !this.refusedComplete.has(holder))
        history.violation(`${holder} was reported fenced_out, and the store refused none of its outcomes`)
    }
    for (const [holder, { proc, type }] of this.outcomeLearnt) {
      if (proc.state !== 'crashed' && !outcomes.has(`${holder} ${type}`))
        history.violation(
          `${holder}'s process learnt its outcome was ${type === 'stored' ? 'stored' : 'refused'}, and no ${type} was reported`,
        )
    }
    for (const event of this.heard) {
      if (event.type !== 'stored') continue
      const record = await stored(event.scope, event.key)
      if (record?.status !== event.status || record.token !== event.token)
        history.violation(
          `${holderId(event.scope, event.key, event.token)} was reported stored (${event.status}), the store holds ${record?.status ?? 'nothing'} #${record?.token}`,
        )
    }
  }
}
