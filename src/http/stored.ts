import { canonicalJson, sha256Hex } from '../core/fingerprint.js'
import type { StoredResponse } from '../stores/store.js'
import type { HttpRequestLike, HttpResponseLike } from './types.js'

/** Response headers stored for replay by default (SPEC §5.12). */
export const DEFAULT_STORED_HEADERS = ['content-type', 'content-location', 'location', 'etag', 'last-modified'] as const

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

/** Marks a replay whose body was too large to store: its value is the original length in bytes. */
export const BODY_OMITTED_HEADER = 'idempotent-body-omitted'
/** Set to `true` on every replayed response. */
export const REPLAYED_HEADER = 'idempotent-replayed'

/** Builds the allowlist once: defaults plus the user's, lower-cased, minus the never-stored ones. */
export function storedHeaderSet(extra: string[] = []): Set<string> {
  return new Set([...DEFAULT_STORED_HEADERS, ...extra.map((h) => h.toLowerCase())].filter((h) => !NEVER_STORED.has(h)))
}

/** What is kept of a response: allowlisted headers, and the body unless it is over the limit. */
export function toStored(response: HttpResponseLike, allow: Set<string>, maxBody: number): StoredResponse {
  const headers: Record<string, string> = {}
  for (const [name, value] of Object.entries(response.headers)) {
    const lower = name.toLowerCase()
    if (allow.has(lower)) headers[lower] = Array.isArray(value) ? value.join(', ') : String(value)
  }
  const length = response.bodyLength ?? response.body.byteLength
  if (length > maxBody) {
    // Never a reason to run the operation twice: the status and headers replay, the body does not.
    headers[BODY_OMITTED_HEADER] = String(length)
    return { status: response.status, headers, body: new Uint8Array(0) }
  }
  return { status: response.status, headers, body: response.body }
}

/** A replay: the stored status, headers and body, plus `Idempotent-Replayed: true`. */
export function fromStored(stored: StoredResponse): HttpResponseLike {
  return { status: stored.status, headers: { ...stored.headers, [REPLAYED_HEADER]: 'true' }, body: stored.body }
}

function isJson(contentType: string | string[] | undefined): boolean {
  const value = (Array.isArray(contentType) ? contentType[0] : contentType)?.split(';')[0]?.trim().toLowerCase() ?? ''
  return value === 'application/json' || value.endsWith('+json')
}

const decoder = new TextDecoder('utf-8', { fatal: true })

/**
 * The default fingerprint (SPEC §5.6): method, path with query, and the body; JSON bodies are
 * canonicalized (RFC 8785) first, so the same JSON with keys in another order is the same request.
 * A body that is not valid JSON is hashed as bytes, never a crash.
 *
 * @example
 * createEngine({ ledger, fingerprint: (req, body) => requestFingerprint({ ...req, url: req.url.split('?')[0] }, body) })
 */
export function requestFingerprint(req: HttpRequestLike, body: Uint8Array): string {
  const head = `${req.method.toUpperCase()} ${req.url}\n`
  if (req.parsedBody !== undefined && body.byteLength === 0) {
    // The framework parsed the body and the bytes are gone: hash what it parsed (JSON, or a form
    // body from a urlencoded parser), so two different bodies never share a fingerprint.
    try {
      return sha256Hex(head, 'json\n', canonicalJson(req.parsedBody))
    } catch {
      return sha256Hex(head, 'parsed\n', String(req.parsedBody))
    }
  }
  if (isJson(req.headers['content-type'])) {
    try {
      return sha256Hex(head, 'json\n', canonicalJson(JSON.parse(decoder.decode(body))))
    } catch {
      // Invalid JSON: fall through to bytes.
    }
  }
  return sha256Hex(head, 'bytes\n', body)
}

/**
 * The default scope (SPEC §5.5): a hash of the Authorization header, or `public` where there is none.
 *
 * @example
 * createEngine({ ledger, scope: (req) => String(req.headers['x-tenant-id'] ?? defaultScope(req)) })
 */
export function defaultScope(req: HttpRequestLike): string {
  const auth = req.headers.authorization
  const value = Array.isArray(auth) ? auth.join(', ') : auth
  return value ? `auth:${sha256Hex(value).slice(0, 32)}` : 'public'
}
