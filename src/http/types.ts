import type { Duration } from '../core/duration.js'
import type { FailedWrites, Ledger, LedgerEvent } from '../core/ledger.js'
import type { Classification } from '../core/outcome.js'
import type { Reconcile, StepMethods } from '../core/steps.js'
import type { TransactionalStore } from '../core/store.js'
import type { ErrorFormat } from '../protocol/problem.js'

/** A request in the engine's neutral shape; adapters translate their framework's request to it. */
export interface HttpRequestLike {
  method: string
  /** Path and query, e.g. `/orders?expand=items`. */
  url: string
  /** Lower-case names; a header given twice is an array. */
  headers: Record<string, string | string[] | undefined>
  /** The raw body, read lazily (only covered requests are read). Throws `BODY_TOO_LARGE` past `limit` bytes. */
  body(limit: number): Promise<Uint8Array>
  /** The body as the framework already parsed it (JSON), when the raw bytes are gone. */
  parsedBody?: unknown
  /**
   * The framework's own request (Express `req`, Fastify `request`, Hono `Context`, fetch `Request`),
   * handed to the scope function so it can read what authentication middleware set on it.
   */
  native?: unknown
}

/** A response in the engine's neutral shape. */
export interface HttpResponseLike {
  status: number
  headers: Record<string, string | string[]>
  body: Uint8Array
  /**
   * The body's full length when `body` holds less of it: an adapter that streams stops keeping a copy
   * past `maxStoredBody`, since such a body is stored without its bytes anyway. @default body.byteLength
   */
  bodyLength?: number
}

/**
 * What a handler can read about the idempotent request it serves, and its durable steps: `step`,
 * `capture`, `now`, `uuid`, `random` (docs/steps.md).
 */
export interface IdempotencyContext<Tx = unknown> extends StepMethods {
  key: string
  scope: string
  /** The fencing token this attempt holds. */
  token: number
  /** An earlier attempt at this key did not finish (crash, timeout, transient failure). */
  takeover: boolean
  /** Aborted when this attempt loses its lease. */
  signal: AbortSignal
  /**
   * With `transactional: true`: the store transaction that also completes the record (PostgreSQL or
   * MySQL): the pool's client, or your tool's transaction with the store's `transactions` option. Typed
   * by the ledger where the adapter sees it (Hono, Koa, fetch), or once for the app with {@link Register}.
   */
  tx?: Tx
}

/**
 * Where an app names its ledger once, so that the context the adapters put on the request
 * (`req.idempotency` in Express, `request.idempotency` in Fastify, NestJS's `@IdempotencyCtx()`) has
 * the ledger's transaction as `tx`. Empty by default: `tx` is then `unknown`.
 *
 * @example
 * declare module 'idemkey/express' {
 *   interface Register { ledger: typeof ledger }
 * }
 */
// biome-ignore lint/suspicious/noEmptyInterface: filled by the app's declaration merging
export interface Register {}

/** The transaction `ledger.runInTransaction` (and `transactional: true`) hands the work, for a ledger type `L`. */
export type LedgerTransaction<L> = L extends Ledger<infer S> ? (S extends TransactionalStore<infer Tx> ? Tx : unknown) : unknown

/** The idempotency context of the ledger named in {@link Register}. */
export type RegisteredContext = IdempotencyContext<Register extends { ledger: infer L } ? LedgerTransaction<L> : unknown>

/** What the HTTP layer reports: the ledger's events, and its own configuration errors. */
export type EngineEvent =
  | LedgerEvent
  /** A misconfiguration found while serving a request (a scope function that returned nothing): answered `500`. */
  | { type: 'config_error'; key: string; error: Error }
  /**
   * A covered request with a key was answered: how (`outcome`), with which HTTP `status`, and
   * `durationMs` from the request reaching the layer to its answer (for `executed`, once the record was
   * settled). Not reported for requests the layer let through untouched. `key` is `''` when the header
   * did not parse.
   */
  | { type: 'answered'; key: string; outcome: AnswerOutcome; status: number; durationMs: number }

/**
 * How the HTTP layer answered a covered request: the handler ran (`executed`), a stored outcome was
 * replayed, the key was reused with another request (`mismatch`, `422`), another request held it
 * (`in_progress`, `409`), the store was down (`store_unavailable`, `503`), or the request was refused
 * before the ledger (`rejected`: a bad key or body, a misconfigured scope).
 */
export type AnswerOutcome = 'executed' | 'replayed' | 'mismatch' | 'in_progress' | 'store_unavailable' | 'rejected'

/**
 * Options of the HTTP layer, shared by every adapter. `Req` is the framework's own request type, which
 * the scope function receives.
 */
export interface EngineOptions<Req = HttpRequestLike> {
  /** The ledger behind the layer. */
  ledger: Ledger
  /** Methods the layer covers; others pass through untouched. @default ['POST', 'PATCH'] */
  methods?: string[]
  /** Answer `400` to a covered request without a key. @default false */
  required?: boolean
  /**
   * The request header that carries the key, for APIs that name it otherwise (`X-Idempotency-Key`).
   * Matched case-insensitively; problems name it as given here.
   * @default 'Idempotency-Key'
   */
  keyHeader?: string
  /**
   * The scope of a request, from the framework's own request object (so it sees what authentication
   * middleware set, e.g. `req.user`): a user or tenant id. It must return a non-empty string for every
   * covered request; `undefined`, `null` or `''` is a configuration error (`500`), never a fallback to a
   * shared scope. Its value is stored as `fn:<value>`.
   * @default `cred:` + HMAC-SHA-256 of the Authorization credential under `scopeSecret`, or `public` without one
   */
  scope?: (req: Req) => string | number | null | undefined | Promise<string | number | null | undefined>
  /**
   * What the default scope (no `scope` function) takes as the caller's identity: the credentials your
   * API authenticates with, as `'authorization'`, `'cookie:<name>'` or `'header:<name>'`; the scope is an
   * HMAC of those the request carries, `public` when it carries none. Without this option only
   * `Authorization` counts, and a keyed request that carries a `Cookie` or an API-key header
   * (`X-Api-Key`, `Api-Key`, `X-Auth-Token`, …) but no `Authorization` is refused (`500` invalid-option):
   * those callers would otherwise share one scope. Ignored with a `scope` function.
   * @default ['authorization'], refusing unnamed cookies and API keys
   * @example credentials: ['cookie:session'] // or ['header:x-api-key'], or both
   */
  credentials?: readonly string[]
  /**
   * The deployment secret that keys the default credential scope, shared by every instance.
   * @default process.env.IDEMKEY_SCOPE_SECRET (a warning at start-up when neither is set)
   */
  scopeSecret?: string | Uint8Array
  /** The fingerprint of a request (hex SHA-256). @default method, path with query, canonical body */
  fingerprint?: (req: HttpRequestLike, body: Uint8Array) => string
  /** How long to wait for an in-flight duplicate before `409`. @default the ledger's (10s) */
  wait?: Duration
  /** @default the ledger's (30s) */
  lease?: Duration
  /** @default the ledger's (24h) */
  ttl?: Duration
  /** Response headers to store besides content-type, content-encoding, content-location, location, etag, last-modified. */
  storedHeaders?: string[]
  /** Largest response body stored for replay; a larger one is stored without its body. @default 1 MiB */
  maxStoredBody?: number
  /** Largest request body the layer reads to fingerprint it; `413` beyond. @default 1 MiB */
  maxRequestBody?: number
  /** When the store is unreachable, run the handler unprotected instead of answering `503`. @default false */
  failOpen?: boolean
  /** Which statuses are stored, replayed as failures, or released. @default 2xx/3xx completed; 4xx failed except 401, 408, 409, 425, 429; those and 5xx transient */
  classify?: (status: number) => Classification
  /** Run the handler in the store's transaction, reachable as `ctx.tx` (PostgreSQL or MySQL: docs/postgres.md). @default false */
  transactional?: boolean
  /**
   * With `transactional: true`, what becomes of the handler's writes when it answers a final failure (a
   * 4xx that is stored and replayed, such as `422 out of stock`): `'rollback'` undoes them (to a savepoint
   * taken before the handler) and records the answer in the same transaction; `'commit'` keeps them with
   * the answer, for a handler that deliberately records something on a decline (docs/http.md, "What
   * happens to the handler's writes"). @default 'rollback'
   */
  failedWrites?: FailedWrites
  /** Called on a takeover, before the handler, with the steps an earlier attempt started but did not record (docs/steps.md). */
  reconcile?: Reconcile
  /** Base of the problem `type` URIs; a slug is appended. @default 'https://idemkey.dev/docs/errors#' */
  problemBaseUrl?: string
  /**
   * How the layer writes its own answers (`400` bad key, `409` in progress, `422` reused key, `503`
   * store down, …; docs/http.md): `'problem'` (RFC 9457), `'stripe'` (Stripe's error object and
   * statuses, so Stripe's client libraries raise their errors), or a function that writes a
   * `LayerAnswer` in the API's own format. Replays are never rewritten.
   * @default 'problem'
   * @example
   * errorFormat: (answer) => ({ body: { errors: [{ code: answer.code, message: answer.detail }] } })
   */
  errorFormat?: ErrorFormat
  /**
   * Called for each ledger event of the requests this layer serves, and for its configuration errors.
   * The real cause of a `503` (the store's error) reaches you here as a `store_error` event; clients
   * get a generic detail. Must not throw.
   */
  onEvent?: (event: EngineEvent) => void
  /**
   * Called before each replay is sent, with what identifies the request and the stored response about
   * to go out: add or change its headers, or log. It runs only on replays (never on a first run, nor on
   * the layer's own problems), and costs nothing when not set. What it throws fails the request as an
   * error in a handler would (the framework answers `500`); the record is unchanged.
   *
   * @example
   * onReplay: (request, response) => { response.headers['x-replayed-key'] = request.key }
   */
  onReplay?: (request: ReplayRequest, response: ReplayResponse) => void | Promise<void>
}

/** What {@link EngineOptions.onReplay} learns about the request being answered with a replay. */
export interface ReplayRequest {
  method: string
  /** Path and query. */
  url: string
  key: string
  /** The scope the key lives in (`fn:…`, `cred:…`, `public`). */
  scope: string
}

/**
 * The replay about to be sent: its headers may be changed in place; its status and body are what was
 * stored, and stay as they are (byte for byte).
 */
export interface ReplayResponse {
  readonly status: number
  headers: Record<string, string | string[]>
  readonly body: Uint8Array
}

/** What to do with a request, decided before the handler runs. */
export type Decision =
  /** Not covered, or no key and none required: run the handler untouched. */
  | { kind: 'passthrough' }
  /** Answer this now (replay, 4xx, 409, 503): do not run the handler. `outcome` says which kind of answer it is. */
  | { kind: 'respond'; response: HttpResponseLike; outcome?: AnswerOutcome }
  /** Run the handler, then call `finish` with its response (or `fail` with its error). */
  | {
      kind: 'execute'
      context: IdempotencyContext
      /**
       * Stores or releases the outcome; resolves once the record is settled, with the response the
       * client should get: the handler's own, except in `transactional` mode when its transaction did
       * not commit (fenced out: `409`; the commit failed: `503`), since its writes were rolled back.
       */
      finish(response: HttpResponseLike): Promise<HttpResponseLike>
      /** The handler threw: releases the record. */
      fail(error: unknown): Promise<void>
    }
