/**
 * The engine's `transactional: true` path (src/http/engine.ts): the handler runs inside the ledger's
 * transaction callback, so its writes and the record commit together.
 */
import type { RunOptions, RunResult, TransactionContext } from '../core/ledger.js'
import { fencedOut, type Reporter, type Settled } from './engine-answers.js'
import type { EngineConfig } from './engine-config.js'
import type { Decision, HttpRequestLike, HttpResponseLike, IdempotencyContext } from './types.js'

/** The first thing that happens to a request in the ledger. */
type Step = { ctx: IdempotencyContext } | { result: RunResult<HttpResponseLike> } | { error: unknown }

/** How the engine answers a request the ledger settled without running it, or failed. */
export interface SettledAnswers {
  answer(req: HttpRequestLike, key: string, scope: string, result: Settled, startedAtMs: number): Promise<Decision>
  failed(key: string, error: unknown, startedAtMs: number): Decision
}

/**
 * Whichever comes first: the ledger hands the record over (the decision is to run the handler, whose
 * response `finish` then commits with the record) or settles without running it (replay, mismatch, still
 * in flight) or fails (store down).
 */
export async function executeInTransaction(
  config: EngineConfig,
  reporter: Reporter,
  answers: SettledAnswers,
  request: { req: HttpRequestLike; key: string; scope: string; fingerprint: string; startedAtMs: number },
  runFor: RunOptions<HttpResponseLike>,
): Promise<Decision> {
  const { req, key, scope, fingerprint, startedAtMs } = request
  let finishHandler: (response: HttpResponseLike) => void = () => {}
  let failHandler: (error: unknown) => void = () => {}
  const handlerDone = new Promise<HttpResponseLike>((resolve, reject) => {
    finishHandler = resolve
    failHandler = reject
  })
  let first: (step: Step) => void = () => {}
  const firstStep = new Promise<Step>((resolve) => {
    first = resolve
  })
  const work = (ctx: TransactionContext<unknown>): Promise<HttpResponseLike> => {
    first({ ctx })
    return handlerDone
  }
  const running = config.ledger.runInTransaction({ key, scope, fingerprint }, work as never, runFor)
  // Also keeps a rejection from being unhandled: finish() and fail() read `running` again later.
  void running.then(
    (result) => first({ result }),
    (error: unknown) => first({ error }),
  )
  const step = await firstStep
  if ('error' in step) return answers.failed(key, step.error, startedAtMs)
  // A run that settled before handing the record over did not execute.
  if ('result' in step) return answers.answer(req, key, scope, step.result as Settled, startedAtMs)
  return {
    kind: 'execute',
    context: step.ctx,
    finish: async (response) => {
      const sent = await settle(response)
      if (config.onEvent) reporter.answered(key, 'executed', sent.status, startedAtMs)
      return sent
    },
    fail: async (error) => {
      failHandler(error)
      await running.catch(() => {})
    },
  }

  async function settle(response: HttpResponseLike): Promise<HttpResponseLike> {
    finishHandler(response)
    const result = await running.catch((error: unknown) => ({ kind: 'error' as const, error }))
    if (result.kind === 'error') {
      // Why it did not commit is for the operator (onEvent); the client learns what to do.
      return config.render(
        'STORE_UNAVAILABLE',
        `The request's transaction did not commit, so none of its writes were kept. Retry with the same ${config.header}.`,
        { 'retry-after': '1' },
      )
    }
    if (result.kind === 'executed' && result.outcome === 'fenced_out') return fencedOut(config, key, 'writes were rolled back')
    return response
  }
}
