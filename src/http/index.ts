/**
 * The neutral HTTP layer (`idemkey/http`): every rule of docs/http.md on a framework-free request/response shape.
 * Framework adapters: `idemkey/express`, `idemkey/fastify`, `idemkey/hono`, `idemkey/fetch`, `idemkey/koa`,
 * `idemkey/nestjs`.
 */

export { KEY_HEADER, KEY_HEADER_NAME, parseKeyHeader } from '../protocol/key-header.js'
export { DEFAULT_PROBLEM_BASE, type ErrorFormat, type LayerAnswer, problem, type RenderedAnswer, stripeError } from '../protocol/problem.js'
export { BODY_OMITTED_HEADER, REPLAYED_HEADER } from '../protocol/response-headers.js'
export { createEngine, type IdempotencyEngine } from './engine.js'
export {
  credentialScope,
  functionScope,
  headerScope,
  normalizeCredential,
  SCOPE_SECRET_ENV,
  SCOPE_SOURCES,
} from './scope.js'
export { DEFAULT_STORED_HEADERS, defaultScope, requestFingerprint } from './stored.js'
export type {
  Decision,
  EngineEvent,
  EngineOptions,
  HttpRequestLike,
  HttpResponseLike,
  IdempotencyContext,
  LedgerTransaction,
  Register,
  RegisteredContext,
  ReplayRequest,
  ReplayResponse,
} from './types.js'
