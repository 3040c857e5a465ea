/**
 * The layer's own answers (a bad key, a key in progress or reused, the store down, …): RFC 9457
 * problems by default, Stripe's error object with `errorFormat: 'stripe'`, or the API's own format
 * through a function (docs/http.md, "Answers in your API's error format").
 */
import { HTTP_STATUS_BY_CODE, type IdempotencyErrorCode } from '../errors.js'
import { KEY_HEADER_NAME } from './key-header.js'

/** An answer as the layer sends it: assignable to the HTTP layer's `HttpResponseLike`. */
export interface AnswerResponse {
  status: number
  headers: Record<string, string>
  body: Uint8Array
}

/** One answer the layer gives by itself, before it is written in the API's error format. */
export interface LayerAnswer {
  /** What happened (docs/errors.md); `BODY_OMITTED` is the body of a replay whose response was too large to store. */
  code: IdempotencyErrorCode | 'BODY_OMITTED'
  /** The status idemkey answers by default (`422` for a reused key, `409` in progress, `503` store down, …). */
  status: number
  /** A short summary (the problem's `title`). */
  title: string
  /** What happened and what the client does next; safe to show (never the store's internals). */
  detail: string
  /** The problem `type` URI: the code's section of docs/errors.md, under `problemBaseUrl`. */
  type: string
  /** Headers the answer carries (`retry-after` for `409` and `503`); kept unless the rendering sets them. */
  headers: Record<string, string>
}

/**
 * An answer written in the API's format: `body` is sent as JSON (`application/json` unless `headers`
 * names another content type), or as is when it is a string or bytes. `status` defaults to the answer's.
 */
export interface RenderedAnswer {
  status?: number
  headers?: Record<string, string>
  body: unknown
}

/**
 * How the layer writes its own answers: `'problem'` (RFC 9457 `application/problem+json`), `'stripe'`
 * (Stripe's `{ error: { type, message, … } }`, so Stripe's client libraries raise their errors), or a
 * function that writes one in the API's own format.
 */
export type ErrorFormat = 'problem' | 'stripe' | ((answer: LayerAnswer) => RenderedAnswer)

/** The default base of problem `type` URIs: each error has a section in docs/errors.md. */
export const DEFAULT_PROBLEM_BASE = 'https://idemkey.dev/docs/errors#'

const TITLES: Partial<Record<IdempotencyErrorCode, string>> = {
  KEY_INVALID: 'Invalid Idempotency-Key',
  KEY_MISSING: 'Idempotency-Key required',
  FINGERPRINT_MISMATCH: 'Idempotency-Key reused with another request',
  IN_PROGRESS: 'Request with this Idempotency-Key is in progress',
  STORE_UNAVAILABLE: 'Idempotency store unavailable',
  STORE_SCHEMA: 'Idempotency store not set up',
  BODY_TOO_LARGE: 'Request body too large',
  BODY_INVALID: 'Request body cannot be fingerprinted',
  INVALID_OPTION: 'Idempotency layer misconfigured',
  SCOPE_INVALID: 'Invalid idempotency scope',
  FENCED_OUT: 'Request superseded by another attempt',
}

const encoder = new TextEncoder()

/** The title of an answer, naming the key's header as the API spells it. */
function problemTitle(code: IdempotencyErrorCode | 'BODY_OMITTED', keyHeader = KEY_HEADER_NAME): string {
  const title = code === 'BODY_OMITTED' ? 'Response body not stored' : (TITLES[code] ?? code)
  return keyHeader === KEY_HEADER_NAME ? title : title.replace(KEY_HEADER_NAME, keyHeader)
}

/** Writes a {@link LayerAnswer} as a response; built once per engine by {@link answerRenderer}. */
export type AnswerRenderer = (
  code: LayerAnswer['code'],
  detail: string,
  headers?: Record<string, string>,
  status?: number,
) => AnswerResponse

/**
 * Stripe's error type and status for each answer: a reused key is Stripe's `idempotency_error` (a
 * `400`, which Stripe's libraries raise as `StripeIdempotencyError`), a key in use `409` with code
 * `idempotency_key_in_use`, the layer's own failures `api_error`; the rest are `invalid_request_error`.
 */
const STRIPE: Partial<Record<LayerAnswer['code'], { type: string; status?: number; code?: string }>> = {
  FINGERPRINT_MISMATCH: { type: 'idempotency_error', status: 400 },
  IN_PROGRESS: { type: 'idempotency_error', code: 'idempotency_key_in_use' },
  FENCED_OUT: { type: 'api_error' },
  STORE_UNAVAILABLE: { type: 'api_error' },
  STORE_SCHEMA: { type: 'api_error' },
  INVALID_OPTION: { type: 'api_error' },
}

/**
 * Stripe's error object (docs.stripe.com/api/errors): `type`, `message`, `code` (idemkey's code in
 * lower case, or Stripe's own where it has one) and `doc_url`. A replay whose body was too large to
 * store keeps its problem body: the request ran, and an error would tell a Stripe client it did not.
 *
 * @example
 * idempotency({ ledger, errorFormat: 'stripe' }) // or errorFormat: (answer) => ({ ...stripeError(answer), headers: { 'x-idemkey': answer.code } })
 */
export function stripeError(answer: LayerAnswer): RenderedAnswer {
  if (answer.code === 'BODY_OMITTED') return problemBody(answer)
  const mapped = STRIPE[answer.code] ?? { type: 'invalid_request_error' }
  return {
    status: mapped.status ?? answer.status,
    body: { error: { type: mapped.type, code: mapped.code ?? answer.code.toLowerCase(), message: answer.detail, doc_url: answer.type } },
  }
}

function problemBody(answer: LayerAnswer): RenderedAnswer {
  const { type, title, status, detail, code } = answer
  return { headers: { 'content-type': 'application/problem+json' }, body: { type, title, status, detail, code } }
}

/**
 * The renderer of an engine: each answer's status, title and type are worked out here once, then
 * written in `format`. What a format function throws fails the request as an error in a handler would.
 */
export function answerRenderer(format: ErrorFormat | undefined, base = DEFAULT_PROBLEM_BASE, keyHeader?: string): AnswerRenderer {
  const render = format === 'stripe' ? stripeError : typeof format === 'function' ? format : problemBody
  return (code, detail, headers = {}, status) => {
    const answer: LayerAnswer = {
      code,
      status: status ?? HTTP_STATUS_BY_CODE[code as IdempotencyErrorCode] ?? 500,
      title: problemTitle(code, keyHeader),
      detail,
      type: `${base}${code.toLowerCase().replaceAll('_', '-')}`,
      headers,
    }
    return toResponse(answer, render(answer))
  }
}

function toResponse(answer: LayerAnswer, rendered: RenderedAnswer): AnswerResponse {
  const { body } = rendered
  const bytes = body instanceof Uint8Array || typeof body === 'string'
  const headers: Record<string, string> = {
    'content-type': bytes ? 'text/plain; charset=utf-8' : 'application/json',
    'cache-control': 'no-store',
    ...answer.headers,
  }
  for (const [name, value] of Object.entries(rendered.headers ?? {})) headers[name.toLowerCase()] = value
  return {
    status: rendered.status ?? answer.status,
    headers,
    body: body instanceof Uint8Array ? body : encoder.encode(typeof body === 'string' ? body : JSON.stringify(body)),
  }
}

/**
 * An RFC 9457 problem+json response for an error the layer itself answers. It never carries a stored
 * body of another request. `keyHeader` is how the title names the key's header, when it is not
 * `Idempotency-Key`.
 *
 * @example
 * problem('IN_PROGRESS', 'Still running; retry in 2 s.', DEFAULT_PROBLEM_BASE, { 'retry-after': '2' })
 */
export function problem(
  code: IdempotencyErrorCode,
  detail: string,
  base = DEFAULT_PROBLEM_BASE,
  extraHeaders: Record<string, string> = {},
  keyHeader = KEY_HEADER_NAME,
): AnswerResponse {
  return answerRenderer('problem', base, keyHeader)(code, detail, extraHeaders)
}
