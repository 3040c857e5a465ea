import { randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import type { AnswerOutcome, HttpRequestLike } from '../../http/types.js'
import { keyHash } from '../../observability/recorder.js'
import { KEY_HEADER, parseKeyHeader } from '../../protocol/key-header.js'
import { pathOf } from './http.js'

/** One request, as the access log and the HTTP metrics see it. */
export interface AccessEntry {
  /** `X-Request-Id` when the client sent a usable one, else the trace id of `traceparent`, else a new UUID. */
  requestId: string
  method: string
  /** The path, without the query string (which may carry secrets). */
  path: string
  /** The status the client got (or was being sent when it went away). */
  status: number
  /** How the proxy answered: the HTTP layer's outcome, `passthrough` for traffic it does not cover, `proxy_error`. */
  outcome: AnswerOutcome | 'passthrough' | 'proxy_error'
  /** The upstream's status, when the request reached it. */
  upstreamStatus?: number
  /** `keyHash(scope, key)` of a covered request with a key, as `idemkey inspect` and the unrecorded line show it. */
  keyHash?: string
  durationMs: number
}

/** What the access log learns of a request while it is served. */
export interface Trail {
  startedAt: number
  outcome: AccessEntry['outcome']
  upstreamStatus?: number
  scope?: string
}

/** Keeps the scope the engine computed on the request's trail, for the access log's key hash. */
export function trailScope(scopeOf: (req: HttpRequestLike) => string): (req: HttpRequestLike) => string {
  return (req) => {
    const scope = scopeOf(req)
    const trail = (req as { trail?: Trail }).trail
    if (trail) trail.scope = scope
    return scope
  }
}

/** The access log's entry of a finished request, answered `status`. */
export function accessEntry(req: IncomingMessage, status: number, trail: Trail): AccessEntry {
  const entry: AccessEntry = {
    requestId: requestIdOf(req),
    method: req.method ?? 'GET',
    path: pathOf(req),
    status,
    outcome: trail.outcome,
    durationMs: Math.round((performance.now() - trail.startedAt) * 100) / 100,
  }
  if (trail.upstreamStatus !== undefined) entry.upstreamStatus = trail.upstreamStatus
  if (trail.scope !== undefined) {
    try {
      const key = parseKeyHeader(req.headers[KEY_HEADER])
      if (key !== undefined) entry.keyHash = keyHash(trail.scope, key)
    } catch {
      // A key that does not parse was answered 400 before any record: no hash to log.
    }
  }
  return entry
}

/**
 * The request's id: its `X-Request-Id` when that is 1–200 visible ASCII characters, else the trace id
 * of a W3C `traceparent`, else a new UUID.
 */
export function requestIdOf(req: IncomingMessage): string {
  const given = req.headers['x-request-id']
  if (typeof given === 'string' && /^[\x21-\x7e]{1,200}$/.test(given)) return given
  const parent = req.headers.traceparent
  const trace = typeof parent === 'string' ? /^[\da-f]{2}-([\da-f]{32})-[\da-f]{16}-[\da-f]{2}$/.exec(parent.trim()) : null
  if (trace && trace[1] !== '0'.repeat(32)) return trace[1] as string
  return randomUUID()
}
