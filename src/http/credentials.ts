/**
 * What identifies the caller for the default scope (docs/http.md, "Scopes"): the credential the API
 * authenticates with. `Authorization` by default; a session cookie or an API-key header when named.
 * A request that carries a cookie or an API-key header when none was named is refused rather than put
 * in the shared `public` scope, where one caller could replay another's answers.
 */

import { IdempotencyError } from '../errors.js'
import { isHeaderName } from '../protocol/key-header.js'
import type { HttpRequestLike } from './types.js'

/** One credential source: `authorization`, `cookie:<name>` or `header:<name>`. */
export type CredentialSource = { kind: 'authorization' } | { kind: 'cookie'; name: string } | { kind: 'header'; name: string }

/** The default scope's sources, and whether anonymous-looking requests that carry other credentials are refused. */
export interface CredentialRule {
  sources: CredentialSource[]
  /** True when no source was named: a request with a cookie or an API-key header but none of the sources is refused. */
  guarded: boolean
}

/** `Authorization` alone, guarded: the rule when no credentials are named. */
export const DEFAULT_CREDENTIALS: CredentialRule = { sources: [{ kind: 'authorization' }], guarded: true }

/** Headers that carry an API key or a session token by common convention: a request with one is not anonymous. */
const API_KEY_HEADERS = ['x-api-key', 'api-key', 'apikey', 'x-auth-token', 'x-access-token', 'x-session-token', 'x-session-id']

/**
 * Reads a list of credential sources (`['cookie:session', 'header:x-api-key']`); `where` names the
 * option in messages.
 */
export function credentialRule(list: readonly string[] | undefined, where: string): CredentialRule {
  if (list === undefined) return DEFAULT_CREDENTIALS
  if (!Array.isArray(list) || list.length === 0) {
    throw new IdempotencyError('INVALID_OPTION', `${where} must be a non-empty list such as ['cookie:session'] or ['header:x-api-key'].`)
  }
  return { sources: list.map((entry) => credentialSource(entry, where)), guarded: false }
}

function credentialSource(entry: unknown, where: string): CredentialSource {
  const text = typeof entry === 'string' ? entry.trim() : ''
  if (text.toLowerCase() === 'authorization') return { kind: 'authorization' }
  const match = /^(cookie|header):(.+)$/i.exec(text)
  const name = match?.[2]?.trim() ?? ''
  if (match && isHeaderName(name)) {
    return match[1]?.toLowerCase() === 'cookie' ? { kind: 'cookie', name } : { kind: 'header', name: name.toLowerCase() }
  }
  throw new IdempotencyError(
    'INVALID_OPTION',
    `${where}: expected 'authorization', 'cookie:<name>' (e.g. cookie:session) or 'header:<name>' (e.g. header:x-api-key), got ${JSON.stringify(entry)}.`,
  )
}

/**
 * The credentials of a request under `rule`, one string per source it carries, in the rule's order
 * (empty: none). The Authorization part alone is the normalised credential, as the scope always hashed it.
 */
export function credentialParts(headers: HttpRequestLike['headers'], rule: CredentialRule, normalize: (value: string) => string): string[] {
  const parts: string[] = []
  for (const source of rule.sources) {
    if (source.kind === 'authorization') {
      const auth = headers.authorization
      const values = (Array.isArray(auth) ? auth : auth === undefined ? [] : [auth]).map(normalize).filter(Boolean)
      if (values.length > 0) parts.push(values.join(', '))
    } else if (source.kind === 'cookie') {
      const values = cookieValues(headers.cookie, source.name)
      if (values.length > 0) parts.push(`cookie ${source.name}=${values.join('; ')}`)
    } else {
      const value = headers[source.name]
      const values = (Array.isArray(value) ? value : value === undefined ? [] : [value]).map((v) => v.trim()).filter(Boolean)
      if (values.length > 0) parts.push(`header ${source.name}: ${values.join(', ')}`)
    }
  }
  if (parts.length === 0 && rule.guarded) refuseUnnamedCredential(headers)
  return parts
}

/**
 * Every value of cookie `name` (RFC 6265 §5.4), in order: a second cookie of the same name (set for
 * another path, or tossed by a sibling domain) makes another caller, never the first one's.
 */
function cookieValues(header: string | string[] | undefined, name: string): string[] {
  if (header === undefined) return []
  const values: string[] = []
  for (const line of Array.isArray(header) ? header : [header]) {
    for (const pair of line.split(';')) {
      const eq = pair.indexOf('=')
      if (eq > 0 && pair.slice(0, eq).trim() === name) {
        const value = pair.slice(eq + 1).trim()
        if (value !== '') values.push(value)
      }
    }
  }
  return values
}

/**
 * The headers {@link credentialParts} reads under `rule`, from a `get` of one header by name (a fetch
 * `Headers`, a GraphQL server's request): for front ends that hold no header record.
 */
export function credentialHeaders(rule: CredentialRule, get: (name: string) => string | null | undefined): HttpRequestLike['headers'] {
  const names = [
    'authorization',
    'cookie',
    ...rule.sources.flatMap((s) => (s.kind === 'header' ? [s.name] : [])),
    ...(rule.guarded ? API_KEY_HEADERS : []),
  ]
  const headers: HttpRequestLike['headers'] = {}
  for (const name of names) {
    const value = get(name)
    if (value !== null && value !== undefined) headers[name] = value
  }
  return headers
}

function refuseUnnamedCredential(headers: HttpRequestLike['headers']): void {
  const carried = headers.cookie !== undefined ? 'a Cookie header' : API_KEY_HEADERS.find((name) => headers[name] !== undefined)
  if (carried === undefined) return
  throw new IdempotencyError(
    'INVALID_OPTION',
    `A keyed request carries ${carried.startsWith('a ') ? carried : `an ${carried} header`} but no Authorization, and the idempotency layer was not told which credential identifies the caller: it would put every such caller in one shared scope, where one could replay another's response. Name the credential your API authenticates with, e.g. credentials: ['cookie:session'] or ['header:x-api-key'] (idemkey proxy: --scope-credentials cookie:session), or give a scope function; credentials: ['authorization'] says such requests are anonymous.`,
  )
}
