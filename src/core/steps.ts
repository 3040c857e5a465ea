import { randomUUID } from 'node:crypto'
import { IdempotencyError } from '../errors.js'
import { deriveKey } from './derive-key.js'
import type { StepEntry } from './store.js'

/** A step or capture name: 1–64 characters of letters, digits, `_`, `.`, `:` and `-`. */
const NAME = /^[A-Za-z0-9_.:-]{1,64}$/
/** The largest step result or captured value, as UTF-8 JSON text: 64 KiB. */
export const MAX_STEP_RESULT_BYTES = 64 * 1024
/** The most steps and captured values one record keeps. */
export const MAX_STEPS_PER_RECORD = 256
/** Captured values are stored as steps whose name starts with this; user step names cannot. */
export const CAPTURE_PREFIX = '$'

/** What a step's function receives. */
export interface StepContext {
  /** The step's name. */
  name: string
  /**
   * The key to hand to the downstream API for this step: `deriveKey(intentKey, name)`, the same on
   * every attempt, so a step that ran but was not recorded is deduplicated downstream when it runs again.
   */
  key: string
  /** Aborted when the attempt loses its lease. */
  signal: AbortSignal
}

/** A step that an earlier attempt started but did not record a result for: given to `reconcile`. */
export interface PendingStep {
  name: string
  /** The step's derived key (`deriveKey(intentKey, name)`): look the downstream up by it. */
  key: string
}

/** What `reconcile` receives besides the pending steps. */
export interface ReconcileContext {
  scope: string
  key: string
  token: number
  signal: AbortSignal
  /**
   * Records `value` as the result of step `name` (as the step would have), so the step returns it
   * without running. Throws `FENCED_OUT` if this attempt lost the record meanwhile.
   */
  recordStep(name: string, value: unknown): Promise<void>
}

/** Called on a takeover, before the work, with the steps that started but have no result. */
export type Reconcile = (pending: PendingStep[], ctx: ReconcileContext) => void | Promise<void>

/** The durable-steps half of an attempt's context (docs/steps.md). */
export interface StepMethods {
  /**
   * Runs `fn` once per (scope, key, name): its result is stored, fenced by this attempt's token, before
   * `step` returns; on a later attempt a recorded step returns its stored result without running. The
   * result goes through JSON (64 KiB at most), so every attempt sees the same value: what `JSON.parse`
   * makes of it.
   */
  step<R>(name: string, fn: (step: StepContext) => R | Promise<R>): Promise<R>
  /** Runs `fn` once per intent and returns its (JSON) value on every attempt. */
  capture<R>(name: string, fn: () => R | Promise<R>): Promise<R>
  /** The epoch milliseconds of the first attempt's n-th call of `now()` in this intent. */
  now(): Promise<number>
  /** A random UUID (v4), the same on every attempt for the n-th call. */
  uuid(): Promise<string>
  /** `Math.random()`, the same on every attempt for the n-th call. */
  random(): Promise<number>
}

/** Where an attempt's steps are stored: the store's `recordStep`, on its own or in the run's transaction. */
export type RecordStepFn = (name: string, result: string | null) => Promise<boolean>

/**
 * The steps of one attempt: what earlier attempts recorded, what this one records. `markers`: record a
 * "started" marker before each step runs (only when the run has `reconcile`: it costs a round trip).
 */
export class StepLog implements StepMethods {
  readonly #recorded = new Map<string, string | null>()
  readonly #used = new Set<string>()
  readonly #counters = { now: 0, uuid: 0, random: 0 }
  #record: RecordStepFn | undefined

  constructor(
    readonly scope: string,
    readonly key: string,
    readonly token: number,
    recorded: StepEntry[] | undefined,
    readonly storeName: string,
    record: RecordStepFn | undefined,
    readonly markers: boolean,
    readonly signal: () => AbortSignal,
    readonly clockNow: () => number,
    /** Why this attempt lost its lease, once it has (undefined while it holds it). */
    readonly lost: () => unknown = () => undefined,
  ) {
    this.#record = record
    if (recorded) for (const entry of recorded) this.#recorded.set(entry.name, entry.result)
  }

  /** Records through `record` from now on (the run's transaction). */
  useRecorder(record: RecordStepFn): void {
    this.#record = record
  }

  /** The steps that started but have no result. */
  pending(): PendingStep[] {
    const pending: PendingStep[] = []
    for (const [name, result] of this.#recorded) {
      if (result === null) pending.push({ name, key: deriveKey(this.key, name) })
    }
    return pending
  }

  async step<R>(name: string, fn: (step: StepContext) => R | Promise<R>): Promise<R> {
    assertStepName(name, 'step')
    if (typeof fn !== 'function') throw new IdempotencyError('INVALID_ARGUMENT', `ctx.step("${name}", fn) needs a function.`)
    if (this.#used.has(name)) {
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        `Step "${name}" ran twice in one attempt. Each step needs its own name (e.g. "charge-1", "charge-2").`,
      )
    }
    this.#used.add(name)
    const stored = this.#recorded.get(name)
    if (typeof stored === 'string') return JSON.parse(stored) as R
    // A holder that knows it lost its lease starts no new step: another holder may be running it now.
    const lost = this.lost()
    if (lost !== undefined) {
      this.#used.delete(name)
      throw lost
    }
    try {
      const record = this.#recorder('step')
      if (this.markers && stored === undefined) {
        this.#checkCount(name)
        await this.#store(record, name, null)
        // The lease may have been lost while the marker was written (the store took it, then refused a renewal).
        const lostMeanwhile = this.lost()
        if (lostMeanwhile !== undefined) throw lostMeanwhile
      }
      const intentKey = this.key
      const signal = this.signal
      let derived: string | undefined
      // The derived key (an HMAC) and the signal are made on first use: most steps of a hot path read neither.
      const value = await fn({
        name,
        get key() {
          derived ??= deriveKey(intentKey, name)
          return derived
        },
        get signal() {
          return signal()
        },
      })
      return await this.#keep(record, name, value)
    } catch (error) {
      // A step that failed may be tried again in the same attempt (a retry loop around it).
      this.#used.delete(name)
      throw error
    }
  }

  async capture<R>(name: string, fn: () => R | Promise<R>): Promise<R> {
    assertStepName(name, 'capture')
    return this.#captured(`${CAPTURE_PREFIX}capture:${name}`, fn)
  }

  now(): Promise<number> {
    return this.#captured(`${CAPTURE_PREFIX}now:${++this.#counters.now}`, this.clockNow)
  }

  uuid(): Promise<string> {
    return this.#captured(`${CAPTURE_PREFIX}uuid:${++this.#counters.uuid}`, randomUUID)
  }

  random(): Promise<number> {
    return this.#captured(`${CAPTURE_PREFIX}random:${++this.#counters.random}`, Math.random)
  }

  /** Stores a reconciled result: the step will return it without running. */
  async reconciled(name: string, value: unknown): Promise<void> {
    assertStepName(name, 'recordStep')
    await this.#keep(this.#recorder('recordStep'), name, value)
  }

  async #captured<R>(name: string, fn: () => R | Promise<R>): Promise<R> {
    const stored = this.#recorded.get(name)
    if (typeof stored === 'string') return JSON.parse(stored) as R
    return this.#keep(this.#recorder('capture'), name, await fn())
  }

  async #keep<R>(record: RecordStepFn, name: string, value: unknown): Promise<R> {
    const text = encodeResult(name, value)
    if (!this.#recorded.has(name)) this.#checkCount(name)
    await this.#store(record, name, text)
    return JSON.parse(text) as R
  }

  async #store(record: RecordStepFn, name: string, result: string | null): Promise<void> {
    if (!(await record(name, result))) {
      throw new IdempotencyError(
        'FENCED_OUT',
        `Step "${name}" of ${this.scope}/${this.key} was not recorded: this attempt (token ${this.token}) lost the record to another holder. Stop the work; the holder finishes it.`,
      )
    }
    this.#recorded.set(name, result)
  }

  #checkCount(name: string): void {
    if (this.#recorded.size >= MAX_STEPS_PER_RECORD) {
      throw new IdempotencyError(
        'INVALID_ARGUMENT',
        `Step "${name}" would be the ${MAX_STEPS_PER_RECORD + 1}th step or captured value of ${this.scope}/${this.key}; a record keeps at most ${MAX_STEPS_PER_RECORD}. Group small steps into one.`,
      )
    }
  }

  #recorder(what: string): RecordStepFn {
    if (this.#record) return this.#record
    throw new IdempotencyError(
      'INVALID_OPTION',
      `ctx.${what} needs a store that records steps; the ${this.storeName} store does not. Use MemoryStore, SqliteStore, PostgresStore, MySqlStore or RedisStore, or drop the steps.`,
    )
  }
}

function assertStepName(name: unknown, what: string): asserts name is string {
  if (typeof name !== 'string' || !NAME.test(name)) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `ctx.${what} name must be 1–64 characters of letters, digits, "_", ".", ":" or "-"; got ${JSON.stringify(name)}.`,
    )
  }
}

/** The result as JSON text, within the size limit; `undefined` is stored as `null`. */
function encodeResult(name: string, value: unknown): string {
  let text: string | undefined
  try {
    text = JSON.stringify(value === undefined ? null : value)
  } catch (error) {
    throw new IdempotencyError('INVALID_ARGUMENT', `Step "${name}" returned a value JSON cannot encode: ${(error as Error).message}.`, {
      cause: error,
    })
  }
  if (text === undefined) {
    throw new IdempotencyError('INVALID_ARGUMENT', `Step "${name}" returned a function or symbol; return a JSON value.`)
  }
  const bytes = Buffer.byteLength(text, 'utf8')
  if (bytes > MAX_STEP_RESULT_BYTES) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      `Step "${name}" returned ${bytes} bytes of JSON; a step keeps at most ${MAX_STEP_RESULT_BYTES}. Store the large value yourself and return its ID.`,
    )
  }
  return text
}

/**
 * Applies one `recordStep` to a step list the way every store must: a result replaces a marker or an
 * earlier result of the same name; a marker never replaces a result. For stores and models.
 */
export function applyStep(steps: Map<string, string | null>, name: string, result: string | null): void {
  if (result === null && typeof steps.get(name) === 'string') return
  steps.set(name, result)
}
