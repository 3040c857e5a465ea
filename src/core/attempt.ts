/** One attempt at an intent, as its work sees it (src/core/ledger.ts): signal, steps, transaction. */
import type { IntentContext, TransactionContext } from './ledger-types.js'
import { StepLog, type StepMethods } from './steps.js'
import type { StepEntry } from './store.js'
import type { RunLimits, StoreCalls } from './store-calls.js'

export const STEPS = Symbol('steps')
export const LOSE = Symbol('lose')

/**
 * One attempt at an intent, and the context its work sees ({@link IntentContext}). Its signal and its
 * steps are made on first use: most work looks at neither, and an AbortController per run costs more
 * than the rest of a replay. The step methods are getters so that `const { step } = ctx` works too.
 */
export class Attempt implements IntentContext {
  readonly takeover: boolean
  #controller: AbortController | undefined
  #lostReason: unknown
  #steps: StepLog | undefined
  readonly #calls: StoreCalls
  readonly #plan: RunLimits
  readonly #recorded: StepEntry[] | undefined

  constructor(
    calls: StoreCalls,
    plan: RunLimits,
    readonly scope: string,
    readonly key: string,
    readonly fingerprint: string,
    readonly token: number,
    recorded: StepEntry[] | undefined,
  ) {
    this.#calls = calls
    this.#plan = plan
    this.#recorded = recorded
    this.takeover = token > 1
  }

  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController()
      if (this.#lostReason !== undefined) this.#controller.abort(this.#lostReason)
    }
    return this.#controller.signal
  }

  get step(): StepMethods['step'] {
    return (name, fn) => this[STEPS].step(name, fn)
  }

  get capture(): StepMethods['capture'] {
    return (name, fn) => this[STEPS].capture(name, fn)
  }

  get now(): StepMethods['now'] {
    return () => this[STEPS].now()
  }

  get uuid(): StepMethods['uuid'] {
    return () => this[STEPS].uuid()
  }

  get random(): StepMethods['random'] {
    return () => this[STEPS].random()
  }

  /** The attempt's steps, made on first use: most work records none. */
  get [STEPS](): StepLog {
    this.#steps ??= new StepLog(
      this.scope,
      this.key,
      this.token,
      this.#recorded,
      this.#calls.store.name,
      this.#calls.stepRecorder(this, this.#plan),
      this.#plan.reconcile !== undefined,
      () => this.signal,
      () => this.#calls.clock.now(),
      () => this.#lostReason,
    )
    return this.#steps
  }

  /** The lease is gone: abort the signal now, or as soon as the work looks at it. */
  [LOSE](reason: unknown): void {
    this.#lostReason = reason
    this.#controller?.abort(reason)
  }

  /** This attempt as the work of `runInTransaction` sees it: with the transaction. */
  inTransaction<Tx>(tx: Tx): TransactionContext<Tx> {
    return Object.assign(this, { tx })
  }
}
