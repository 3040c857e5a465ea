/**
 * What the engine answers when the handler did not run, or its answer cannot stand (src/http/engine.ts):
 * replays, the problems of docs/errors.md, and the reports to `onEvent`.
 */
import type { RunResult } from '../core/ledger.js'
import { isIdempotencyError } from '../errors.js'
import type { EngineConfig } from './engine-config.js'
import type { AnswerOutcome, Decision, HttpResponseLike } from './types.js'

/** A ledger answer that did not run the handler. */
export type Settled = Exclude<RunResult<HttpResponseLike>, { kind: 'executed' }>

export const MISCONFIGURED_DETAIL =
  'The server could not tell which account this request belongs to (its idempotency scope is misconfigured), so it was not run. This is not something a retry fixes; contact the API operator.'

/** The response to a ledger answer that did not run the handler: the replay, or a problem. */
export function settledResponse(config: EngineConfig, result: Settled, key: string): HttpResponseLike {
  const { header, render } = config
  switch (result.kind) {
    case 'replayed':
      return result.value
    case 'mismatch':
      return render(
        'FINGERPRINT_MISMATCH',
        `The ${header} "${key}" was already used with a different request (method, path or body). Use a new key for a new request.`,
      )
    case 'in_progress':
      return render(
        'IN_PROGRESS',
        `A request with the ${header} "${key}" is still being processed. Retry after the Retry-After delay with the same key.`,
        { 'retry-after': String(Math.max(1, Math.ceil(result.retryAfterMs / 1_000))) },
      )
  }
}

/** The decision for an error the layer knows (bad input, store down); `undefined` for any other. */
export function decisionFromError(config: EngineConfig, error: unknown): Decision | undefined {
  if (!isIdempotencyError(error)) return undefined
  const { header, render } = config
  switch (error.code) {
    case 'STORE_UNAVAILABLE':
    case 'STORE_SCHEMA':
      if (config.failOpen) return { kind: 'passthrough' }
      // The store's own message (addresses, roles, driver hints) is for the operator: it went to
      // onEvent as a store_error. The client learns only what to do.
      return {
        kind: 'respond',
        response: render(
          error.code,
          `The idempotency store is unavailable right now, so this request was not run. Retry with the same ${header} after the Retry-After delay.`,
          { 'retry-after': '1' },
        ),
        outcome: 'store_unavailable',
      }
    case 'KEY_INVALID':
    case 'KEY_MISSING':
    case 'SCOPE_INVALID':
    case 'BODY_TOO_LARGE':
    case 'BODY_INVALID':
      return { kind: 'respond', response: render(error.code, error.message), outcome: 'rejected' }
    default:
      return undefined
  }
}

/**
 * Another attempt took over while this one ran (this one stalled past its lease): its outcome is the one
 * stored and replayed, so this one's response is not sent, or the same key would get two different
 * answers. The retry gets the outcome that counts.
 */
export function fencedOut(config: EngineConfig, key: string, what: 'answer was not kept' | 'writes were rolled back'): HttpResponseLike {
  return config.render(
    'FENCED_OUT',
    `Another attempt with the ${config.header} "${key}" took over while this one ran, so this one's ${what}. Retry with the same key to get the outcome that counts.`,
    { 'retry-after': '1' },
  )
}

/** Reports to `onEvent`, or, for a misconfiguration without one, once to the console. */
export class Reporter {
  #configErrorLogged = false

  constructor(readonly onEvent: EngineConfig['onEvent']) {}

  configError(key: string, error: Error): void {
    if (this.onEvent) {
      try {
        this.onEvent({ type: 'config_error', key, error })
      } catch {
        // A broken hook must not break the answer.
      }
    } else if (!this.#configErrorLogged) {
      // Every covered request fails the same way until it is fixed: say it once, where someone looks.
      this.#configErrorLogged = true
      console.error(`idemkey: ${error.message}`)
    }
  }

  /** How a covered request was answered; call only when there is an `onEvent`. */
  answered(key: string, outcome: AnswerOutcome, status: number, startedAtMs: number): void {
    try {
      this.onEvent?.({
        type: 'answered',
        key,
        outcome,
        status,
        durationMs: Math.round((performance.now() - startedAtMs) * 100) / 100,
      })
    } catch {
      // A broken hook must not break the answer.
    }
  }
}
