import { createIdempotentFetch, IdempotentRequestError, uuidv7 } from '../../client/index.js'
import { type PlannedIntent, seededRandom } from './plan.js'

/** How the demo's clients behave. */
export interface DriverOptions {
  /** Seed of the clients' retry jitter: each intent draws from its own generator, so the order in which intents run does not matter. */
  seed: number
  /** Intents in flight at once. */
  concurrency: number
  /** One HTTP attempt taking longer than this is abandoned and retried with the same key. */
  attemptTimeoutMs: number
  /** Called after each intent settles. */
  onIntentDone?: () => void
}

/** What the clients saw of one intent. */
export interface IntentResult {
  id: string
  /** The client got a success for the intent (after retries). */
  ok: boolean
  /** Why the client gave up, when it did. */
  error?: string
  /** From the first send to the last answer, retries and double clicks included. */
  latencyMs: number
  /** For `reuse` intents: whether the API refused the key reused with another amount. */
  reuseRejected?: boolean
}

/**
 * Sends every planned intent to `origin` with `idemkey/client`: one key per intent, reused on each
 * retry; double clicks send the intent twice at once with that key; a `reuse` intent is followed by
 * a buggy second request with the same key and another amount.
 */
export async function drive(origin: string, intents: PlannedIntent[], options: DriverOptions): Promise<IntentResult[]> {
  const client = (index: number) =>
    createIdempotentFetch({
      maxAttempts: 15,
      maxElapsed: '30s',
      baseDelay: '50ms',
      maxDelay: '1s',
      attemptTimeout: options.attemptTimeoutMs,
      random: seededRandom((options.seed * 100_003 + index) >>> 0),
    })
  const send = (post: ReturnType<typeof client>, intent: PlannedIntent, key: string, amount: number) =>
    post(`${origin}/charges`, {
      method: 'POST',
      idempotencyKey: key,
      headers: { 'content-type': 'application/json', 'x-demo-intent': intent.id },
      body: JSON.stringify({ intent: intent.id, amount, currency: 'eur' }),
    }).then(async (response) => {
      await response.arrayBuffer()
      return response
    })

  const results: IntentResult[] = new Array(intents.length)
  let next = 0
  const worker = async () => {
    for (let i = next++; i < intents.length; i = next++) {
      const intent = intents[i] as PlannedIntent
      const post = client(i)
      const key = uuidv7()
      const started = performance.now()
      const result: IntentResult = { id: intent.id, ok: false, latencyMs: 0 }
      try {
        if (intent.fault === 'double') await Promise.all([send(post, intent, key, intent.amount), send(post, intent, key, intent.amount)])
        else await send(post, intent, key, intent.amount)
        result.ok = true
      } catch (error) {
        result.error = (error as Error).message
      }
      result.latencyMs = performance.now() - started
      if (intent.fault === 'reuse' && result.ok) {
        try {
          await send(post, intent, key, intent.amount + 500)
          result.reuseRejected = false
        } catch (error) {
          result.reuseRejected = error instanceof IdempotentRequestError && error.status === 422
        }
      }
      results[i] = result
      options.onIntentDone?.()
    }
  }
  await Promise.all(Array.from({ length: Math.max(1, options.concurrency) }, worker))
  return results
}
