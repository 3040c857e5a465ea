/**
 * Next.js server actions that run once per form render (docs/rpc.md): the page renders a key into a
 * hidden field once (`actionKey()`), and `idempotentAction` runs the action once per key, so a double
 * submit or a retried action gets the first result. Route handlers use `idemkey/fetch` as they are.
 */
import { uuidv7 } from '../../client/uuid.js'
import { type Duration, runDurations } from '../../core/duration.js'
import type { IntentContext, Ledger } from '../../core/ledger.js'
import type { StoredResponse } from '../../core/store.js'
import { assertFunctions } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { warnSharedScope } from '../../http/scope.js'
import { formPayload } from '../form-payload.js'

/** The hidden field's default name. */
export const ACTION_KEY_FIELD = 'idempotencyKey'

/** A fresh key for one form render: put it in a hidden field (`<input type="hidden" name="idempotencyKey" value={actionKey()} />`). */
export function actionKey(): string {
  return uuidv7()
}

/** Options of {@link idempotentAction}. */
export interface IdempotentActionOptions<A extends unknown[]> {
  ledger: Ledger
  /** The form field that carries the key. @default 'idempotencyKey' */
  field?: string
  /** Namespace of the records, e.g. the signed-in user (read from your session). @default 'next-action' (one scope for every action: a key is one intent, so the same key posted to another action is refused) */
  scope?: (...args: A) => string | Promise<string>
  /**
   * The action's name: in the default scope, and in what the key stands for, so one key posted to two
   * actions is refused. Give it to an anonymous action (`idempotentAction(async (form) => …)`).
   * @default the function's name, else `'action'`
   */
  name?: string
  /** Run submissions without a key as plain calls instead of refusing them. @default false */
  optional?: boolean
  lease?: Duration
  ttl?: Duration
  wait?: Duration
}

/**
 * An action that ended with Next.js's `redirect()`: it throws an error whose `digest` names the
 * redirect (`NEXT_REDIRECT;push;/orders/1;307;`), which Next.js reads to send the browser on. That is
 * the action's answer, not a failure: it is recorded (status 303, the digest as body) and a replay
 * throws the same redirect again. `error` is the thrown one, when this run threw it.
 */
class Redirected {
  constructor(
    readonly digest: string,
    readonly error: unknown,
  ) {}
}

function redirectDigest(error: unknown): string | undefined {
  const digest = typeof error === 'object' && error !== null ? (error as { digest?: unknown }).digest : undefined
  return typeof digest === 'string' && digest.startsWith('NEXT_REDIRECT') ? digest : undefined
}

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/**
 * A value as JSON (status 200), nothing (an action that returns `undefined`, most form actions) as no
 * bytes, so its replay is `undefined` too rather than `null`; a redirect as a 303 with its digest.
 */
function encodeAnswer(answer: unknown): StoredResponse {
  if (answer instanceof Redirected) return { status: 303, headers: { 'content-type': 'text/plain' }, body: encoder.encode(answer.digest) }
  const body = answer === undefined ? new Uint8Array(0) : encoder.encode(JSON.stringify(answer))
  return { status: 200, headers: { 'content-type': 'application/json' }, body }
}

function decodeAnswer(response: StoredResponse): unknown {
  const text = decoder.decode(response.body)
  if (response.status === 303) return new Redirected(text, undefined)
  return text === '' ? undefined : (JSON.parse(text) as unknown)
}

function formDataOf(args: unknown[]): FormData | undefined {
  for (const arg of args) if (arg instanceof FormData) return arg
  return undefined
}

/**
 * Wraps a server action (`(formData)` or `(previousState, formData)`, as `useActionState` calls it) so it
 * runs once per key of its form's hidden field: a double submit or a retry of the same render gets the
 * first result, whatever previous state it is handed; the same key with other form values, or posted to
 * another action, is refused (`FINGERPRINT_MISMATCH`); a submit while the first still runs waits for it;
 * an action that ends with `redirect()` is recorded so, and replayed as that redirect. The action's value
 * must be JSON (it is what replays return).
 * A `function` (not an arrow) gets the ledger's context as `this` (`this.step(...)` for durable steps).
 *
 * @example
 * 'use server'
 * export const placeOrder = idempotentAction(async (form: FormData) => orders.place(String(form.get('sku'))), { ledger })
 */
export function idempotentAction<A extends unknown[], R>(
  action: (this: IntentContext | undefined, ...args: A) => Promise<R>,
  options: IdempotentActionOptions<A>,
): (...args: A) => Promise<R> {
  const ledger = options?.ledger
  if (!ledger || typeof ledger.run !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'idempotentAction(action, { ledger }) needs a Ledger: new Ledger({ store }).')
  }
  assertFunctions('idempotentAction()', { action, scope: options.scope }, { required: ['action'] })
  if (options.scope === undefined) {
    warnSharedScope('idempotentAction() (idemkey/next)', 'scope: async () => (await auth()).user.id')
  }
  for (const [option, value] of [
    ['field', options.field],
    ['name', options.name],
  ] as const) {
    // A field that is no name (a number, '') was looked up in every form, found in none: every submit refused.
    if (value !== undefined && (typeof value !== 'string' || value === '')) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `idempotentAction(): ${option} must be a non-empty string, got ${JSON.stringify(value)}.`,
      )
    }
  }
  const field = options.field ?? ACTION_KEY_FIELD
  const name = options.name ?? (action.name || 'action')
  const runOptions = {
    encode: encodeAnswer,
    decode: decodeAnswer as (response: StoredResponse) => R | Redirected,
    ...runDurations(options),
  }
  return async (...args: A): Promise<R> => {
    const form = formDataOf(args)
    const key = form?.get(field)
    if (typeof key !== 'string' || key.length === 0) {
      if (options.optional) return action.call(undefined, ...args)
      throw new IdempotencyError(
        'KEY_INVALID',
        `Server action "${name}" needs an idempotency key in its form's "${field}" field: render <input type="hidden" name="${field}" value={actionKey()} /> once per form.`,
      )
    }
    const scope = options.scope ? await options.scope(...args) : 'next-action'
    if (typeof scope !== 'string' || scope === '') {
      // A scope that yields nothing (no session) is a configuration error: the ledger would have put the
      // submit in its default scope, shared by every such user.
      throw new IdempotencyError(
        'INVALID_OPTION',
        `Server action "${name}": its idempotency scope came out empty for this submit, so it was not run. scope must return the user's id for every submit; answer signed-out users before the action.`,
      )
    }
    // The form alone: useActionState hands a queued second submit the first one's result as its previous
    // state, so the arguments before the form are no part of what the key stands for (bound arguments
    // are fixed by the render that made the key, and a form posted without JavaScript carries none).
    // The action's name too: under a scope of the user's, a form whose second button posts to another
    // action (`formAction`) with the same key got the first action's result, and the second never ran.
    const payload = { action: name, form: await formPayload(form as FormData, (entry) => entry === field || entry.startsWith('$ACTION_')) }
    const result = await ledger.run<R | Redirected>(
      { key, scope, payload },
      async (ctx) => {
        try {
          return await action.call(ctx, ...args)
        } catch (error) {
          const digest = redirectDigest(error)
          if (digest === undefined) throw error
          return new Redirected(digest, error)
        }
      },
      runOptions,
    )
    switch (result.kind) {
      case 'executed':
      case 'replayed':
        if (result.value instanceof Redirected) {
          throw result.value.error ?? Object.assign(new Error('NEXT_REDIRECT'), { digest: result.value.digest })
        }
        return result.value
      case 'mismatch':
        throw new IdempotencyError(
          'FINGERPRINT_MISMATCH',
          `Server action "${name}": the form's key was used before with other values, so this submit was not run. Render a new key for a changed form.`,
        )
      case 'in_progress':
        throw new IdempotencyError(
          'IN_PROGRESS',
          `Server action "${name}": the same submit is still running; try again in ${Math.ceil(result.retryAfterMs / 1_000)} s to get its result.`,
        )
    }
  }
}
