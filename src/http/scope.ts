import * as crypto from 'node:crypto'
import { IdempotencyError } from '../errors.js'
import { type CredentialRule, credentialParts, DEFAULT_CREDENTIALS } from './credentials.js'
import type { HttpRequestLike } from './types.js'

/**
 * Where a scope came from. Every scope the HTTP layer makes starts with its source, so no two sources
 * can ever produce the same scope: a tenant called `public`, or a header value copied from
 * `idemkey list` such as `cred:…`, stays in its own namespace (docs/http.md, "Scopes").
 */
export const SCOPE_SOURCES = {
  /** No credential and no scope function: every anonymous caller shares it (a request with an unnamed cookie or API key is refused instead). */
  public: 'public',
  /** A keyed hash of the caller's credentials (Authorization, or the cookie or header named in `credentials`). */
  credential: 'cred:',
  /** A trusted header's value (the proxy's `--scope-header`). */
  header: 'header:',
  /** What the application's scope function returned (a tenant or user id). */
  function: 'fn:',
} as const

/** The environment variable that holds the deployment secret for credential scopes. */
export const SCOPE_SECRET_ENV = 'IDEMKEY_SCOPE_SECRET'

/**
 * Used only when no secret is configured, with a warning at start-up: the hash is then as weak as an
 * unkeyed one (anyone who reads the store can test guesses of a password offline), but stable across
 * processes, so several instances still agree on every caller's scope.
 */
const FALLBACK_SECRET = 'idemkey-scope-secret-not-configured'

let warnedNoSecret = false

/** The secret for credential scopes: the option, else `IDEMKEY_SCOPE_SECRET`, else a warned-about constant. */
export function resolveScopeSecret(secret: string | Uint8Array | undefined, warn = true): string | Uint8Array {
  const configured = secret ?? process.env[SCOPE_SECRET_ENV]
  if (configured !== undefined && configured.length > 0) return configured
  if (warn && !warnedNoSecret) {
    warnedNoSecret = true
    process.emitWarning(
      `No scope secret is set, so the default scope (a hash of the Authorization header) can be reversed by a dictionary guess by anyone who reads the store. Set ${SCOPE_SECRET_ENV} (or the scopeSecret option, or the proxy's --scope-secret) to a long random value shared by every instance, or give a scope function that returns the caller's user or tenant id.`,
      { code: 'IDEMKEY_NO_SCOPE_SECRET' },
    )
  }
  return FALLBACK_SECRET
}

const warnedSharedScope = new Set<string>()

/**
 * Warns once per front end (`idempotent` of tRPC, `idempotentAction` of Next.js) made without `scope`:
 * such a front end cannot see the caller, so every caller's keys share one scope, and a caller who
 * learns another's key (keys end up in logs) can replay that caller's result. `scope: () => 'global'`
 * says it is meant, and silences it.
 */
export function warnSharedScope(front: string, example: string): void {
  if (warnedSharedScope.has(front)) return
  warnedSharedScope.add(front)
  process.emitWarning(
    `${front} was given no scope, so every caller's idempotency keys share one scope: a caller who learns another's key can replay that caller's result. Give scope (the signed-in user or tenant), e.g. ${example}; or scope: () => 'global' where keys are made by your server and never shared.`,
    { code: 'IDEMKEY_SHARED_SCOPE' },
  )
}

/**
 * The credential with its scheme normalised: schemes are case-insensitive (RFC 9110 §11.1), so
 * `Bearer x` and `bearer  x` are one credential; the credential itself keeps its case.
 */
export function normalizeCredential(authorization: string): string {
  const trimmed = authorization.trim()
  const space = trimmed.search(/\s/)
  if (space < 0) return trimmed
  return `${trimmed.slice(0, space).toLowerCase()} ${trimmed.slice(space).trim()}`
}

/**
 * The default scope (docs/http.md, "Scopes"): `cred:` and an HMAC-SHA-256 of the caller's credentials
 * under the deployment secret, or `public` when the request has none. `rule` names them (the
 * `credentials` option); by default the normalised Authorization credential, and a request with a
 * cookie or an API-key header but no Authorization is refused (`INVALID_OPTION`).
 *
 * @example
 * const scopeOf = (req) => credentialScope(req.headers, process.env.IDEMKEY_SCOPE_SECRET)
 */
export function credentialScope(
  headers: HttpRequestLike['headers'],
  secret: string | Uint8Array,
  rule: CredentialRule = DEFAULT_CREDENTIALS,
): string {
  const parts = credentialParts(headers, rule, normalizeCredential)
  if (parts.length === 0) return SCOPE_SOURCES.public
  const mac = crypto.createHmac('sha256', secret).update(parts.join('\n')).digest('hex')
  return `${SCOPE_SOURCES.credential}${mac.slice(0, 32)}`
}

/**
 * Checks what a scope function returned and puts it in the function's namespace. Nothing, an empty
 * string or a value of another type is a configuration error: falling back to a shared scope would let
 * one tenant replay another's responses.
 */
export function functionScope(value: unknown): string {
  if (typeof value === 'number' && Number.isFinite(value)) return `${SCOPE_SOURCES.function}${value}`
  if (typeof value === 'string' && value.trim() !== '') return `${SCOPE_SOURCES.function}${value}`
  throw new IdempotencyError(
    'INVALID_OPTION',
    `The idempotency scope function returned ${describe(value)} for this request. It must return a non-empty string (a user or tenant id) for every covered request; answer unauthenticated requests before the idempotency middleware runs.`,
  )
}

/** A trusted header's value as a scope (the proxy's `--scope-header`). */
export function headerScope(value: string): string {
  return `${SCOPE_SOURCES.header}${value}`
}

function describe(value: unknown): string {
  if (value === null) return 'null'
  if (value === undefined) return 'undefined'
  if (typeof value === 'string') return 'an empty string'
  return `a ${typeof value}`
}
