import { canonicalForm } from '../core/canonical-form.js'
import { canonicalJsonText, MAX_JSON_DEPTH } from '../core/canonical-json-text.js'
import { canonicalJson, sha256Hex } from '../core/fingerprint.js'
import type { StoredResponse } from '../core/store.js'
import { IdempotencyError } from '../errors.js'
import { type AnswerRenderer, answerRenderer } from '../protocol/problem.js'
import { BODY_OMITTED_HEADER, REPLAYED_HEADER } from '../protocol/response-headers.js'
import { isFormType, isJsonType } from './node-body.js'
import { credentialScope, resolveScopeSecret } from './scope.js'
import type { HttpRequestLike, HttpResponseLike } from './types.js'

/**
 * Response headers stored for replay by default (docs/http.md). `content-encoding` says how the stored
 * bytes are encoded (a `compression()` mounted after the layer gzips them before they are copied): a
 * replay without it hands a client gzip as if it were the body.
 */
export const DEFAULT_STORED_HEADERS = ['content-type', 'content-encoding', 'content-location', 'location', 'etag', 'last-modified'] as const

/** Never stored, whatever the allowlist says: credentials, per-response and hop-by-hop headers. */
const NEVER_STORED = new Set([
  'set-cookie',
  'authorization',
  'proxy-authorization',
  'date',
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'content-length',
])

/** Builds the allowlist once: defaults plus the user's, lower-cased, minus the never-stored ones. */
export function storedHeaderSet(extra: string[] = []): Set<string> {
  return new Set([...DEFAULT_STORED_HEADERS, ...extra.map((h) => h.toLowerCase())].filter((h) => !NEVER_STORED.has(h)))
}

/** What is kept of a response: allowlisted headers, and the body unless it is over the limit. */
export function toStored(response: HttpResponseLike, allow: Set<string>, maxBody: number): StoredResponse {
  const headers: Record<string, string> = {}
  for (const name in response.headers) {
    if (!Object.hasOwn(response.headers, name)) continue
    const lower = name.toLowerCase()
    if (!allow.has(lower)) continue
    const value = response.headers[name] as string | string[]
    headers[lower] = Array.isArray(value) ? value.join(', ') : String(value)
  }
  const length = response.bodyLength ?? response.body.byteLength
  if (length > maxBody) {
    // Never a reason to run the operation twice: the status and headers replay, the body does not.
    headers[BODY_OMITTED_HEADER] = String(length)
    return { status: response.status, headers, body: new Uint8Array(0) }
  }
  return { status: response.status, headers, body: response.body }
}

/**
 * A replay: the stored status, headers and body, plus `Idempotent-Replayed: true`. A response whose
 * body was too large to store replays its status and stored headers (`Location` above all) with a
 * `body-omitted` problem as its body, so a client that parses the body learns why it is not the
 * original, and that the operation ran once.
 */
export function fromStored(stored: StoredResponse, render: AnswerRenderer = answerRenderer('problem')): HttpResponseLike {
  const omitted = stored.headers[BODY_OMITTED_HEADER]
  if (omitted === undefined) return { status: stored.status, headers: { ...stored.headers, [REPLAYED_HEADER]: 'true' }, body: stored.body }
  // The answer below replaces the body: the original's encoding and language do not describe it.
  const { 'content-encoding': _encoding, 'content-language': _language, ...headers } = stored.headers
  const answer = render(
    'BODY_OMITTED',
    `This request already ran once and answered ${stored.status} with a body of ${omitted} bytes, more than the idempotency layer stores for replays, so only its status and headers are replayed. Fetch the result (see Location, if given) instead of retrying.`,
    {},
    stored.status,
  )
  // A replay keeps the stored status; only the body and its type are the layer's.
  return {
    status: stored.status,
    headers: { ...headers, 'content-type': answer.headers['content-type'] as string, [REPLAYED_HEADER]: 'true' },
    body: answer.body,
  }
}

/**
 * The default fingerprint (docs/http.md, "Fingerprints"): method, path with query, and the body. A JSON body is
 * canonicalised losslessly from its bytes: keys sorted, whitespace and escapes normalised, numbers
 * compared by their exact decimal value (never through a double). Duplicate member names and nesting
 * past {@link MAX_JSON_DEPTH} are a `400` (`BODY_INVALID`). A body that is not valid JSON is hashed as
 * bytes, never a crash. A body the framework already parsed (the bytes are gone) is canonicalised
 * from the parsed value, BigInt included; a value JSON cannot carry exactly is a `400`, never a
 * fallback to a value two different requests could share. An `application/x-www-form-urlencoded` body
 * is canonicalised from its bytes too: its fields in any order and percent-encoding are one request,
 * the order of fields that share a name (`a[]=1&a[]=2`) counts (src/core/canonical-form.ts).
 *
 * @example
 * createEngine({ ledger, fingerprint: (req, body) => requestFingerprint({ ...req, url: req.url.split('?')[0] }, body) })
 */
export function requestFingerprint(req: HttpRequestLike, body: Uint8Array): string {
  const head = `${req.method.toUpperCase()} ${req.url}\n`
  if (req.parsedBody !== undefined && body.byteLength === 0) {
    let canonical: string
    try {
      canonical = canonicalJson(req.parsedBody)
    } catch (error) {
      throw new IdempotencyError(
        'BODY_INVALID',
        `The request body, as the server's body parser read it, cannot be fingerprinted exactly (${(error as Error).message}) Send the body as plain JSON; if it is, the API operator should give the idempotency layer the raw body.`,
        { cause: error },
      )
    }
    return sha256Hex(`${head}json\n${canonical}`)
  }
  if (isJsonType(req.headers['content-type'])) {
    const canonical = canonicalJsonText(body)
    if (canonical !== undefined) return sha256Hex(`${head}json\n${canonical}`)
  }
  if (isFormType(req.headers['content-type'])) return sha256Hex(`${head}form\n${canonicalForm(body)}`)
  return sha256Hex(head, 'bytes\n', body)
}

/**
 * The default scope (docs/http.md, "Scopes"): `cred:` and a keyed hash (HMAC-SHA-256 under `IDEMKEY_SCOPE_SECRET`)
 * of the Authorization credential with its scheme normalised, or `public` where there is none.
 *
 * @example
 * createEngine({ ledger, scope: (req) => req.user.tenantId })
 */
export function defaultScope(req: Pick<HttpRequestLike, 'headers'>): string {
  return credentialScope(req.headers, resolveScopeSecret(undefined))
}
