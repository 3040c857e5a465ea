/**
 * The neutral HTTP layer (`idemkey/http`): every rule of docs/http.md on a framework-free request/response shape.
 * Framework adapters: `idemkey/express`, `idemkey/fastify`, `idemkey/hono`, `idemkey/fetch`, `idemkey/koa`,
 * `idemkey/nestjs`.
 */
export { createEngine, type IdempotencyEngine } from './engine.js'
export { KEY_HEADER, KEY_HEADER_NAME, parseKeyHeader } from './key-header.js'
export { DEFAULT_PROBLEM_BASE, problem, stripeError } from './problem.js'
export {
  credentialScope,
  functionScope,
  headerScope,
  normalizeCredential,
  SCOPE_SECRET_ENV,
  SCOPE_SOURCES,
} from './scope.js'
export { BODY_OMITTED_HEADER, DEFAULT_STORED_HEADERS, defaultScope, REPLAYED_HEADER, requestFingerprint } from './stored.js'
export type {
  Decision,
  EngineEvent,
  EngineOptions,
  ErrorFormat,
  HttpRequestLike,
  HttpResponseLike,
  IdempotencyContext,
  LayerAnswer,
  LedgerTransaction,
  Register,
  RegisteredContext,
  RenderedAnswer,
  ReplayRequest,
  ReplayResponse,
} from './types.js'
