/**
 * The engine's options, resolved once (src/http/engine.ts): checked, defaulted, and turned into what
 * every request uses (the scope rule, the fingerprint, the ledger's run options).
 */
import { runDuration } from '../core/duration.js'
import { type Ledger, type RunOptions, rollsBackFailed } from '../core/ledger.js'
import { classifyStatus } from '../core/outcome.js'
import { isTransactionalStore, type TransactionalStore } from '../core/store.js'
import { assertFunctions, nameList } from '../core/validate.js'
import { IdempotencyError } from '../errors.js'
import { keyHeaderName } from '../protocol/key-header.js'
import { type AnswerRenderer, answerRenderer, DEFAULT_PROBLEM_BASE } from '../protocol/problem.js'
import { credentialRule } from './credentials.js'
import { credentialScope, functionScope, resolveScopeSecret } from './scope.js'
import { fromStored, requestFingerprint, storedHeaderSet, toStored } from './stored.js'
import type { EngineEvent, EngineOptions, HttpRequestLike, HttpResponseLike } from './types.js'

const MiB = 1024 * 1024

/** What idemkey's own front ends (the proxy) set beyond the public options. */
export interface EngineInternals {
  /** Replaces the scope rule with one that namespaces its own scopes (e.g. the proxy's trusted header). */
  scopeOf?: (req: HttpRequestLike) => string
  /** Run options of one request on top of the engine's (a Lambda invocation's deadline). */
  runOptionsOf?: (req: HttpRequestLike) => Partial<RunOptions<HttpResponseLike>>
}

/** The resolved options. */
export interface EngineConfig {
  ledger: Ledger
  methods: Set<string>
  /** The key header as the user spelled it (for messages), and lower-cased (for lookups). */
  header: string
  keyHeader: string
  required: boolean
  failOpen: boolean
  transactional: boolean
  maxRequestBody: number
  /** Writes the layer's own answers in the API's error format (`errorFormat`). */
  render: AnswerRenderer
  scopeOf: (req: HttpRequestLike) => string | Promise<string>
  fingerprintOf: NonNullable<EngineOptions['fingerprint']>
  runOptions: RunOptions<HttpResponseLike>
  runOptionsOf: EngineInternals['runOptionsOf']
  onReplay: EngineOptions['onReplay']
  onEvent: ((event: EngineEvent) => void) | undefined
}

export function resolveEngineConfig<Req>(options: EngineOptions<Req>, internals: EngineInternals): EngineConfig {
  if (!options?.ledger || typeof options.ledger.begin !== 'function' || typeof options.ledger.run !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'idempotency({ ledger }) needs a Ledger: new Ledger({ store }).')
  }
  const ledger: Ledger = options.ledger
  assertFunctions('idempotency()', {
    scope: options.scope,
    fingerprint: options.fingerprint,
    classify: options.classify,
    onEvent: options.onEvent,
    onReplay: options.onReplay,
  })
  if (options.transactional && !isTransactionalStore(ledger.store)) {
    // Said once at start-up, not as a failure of every request.
    throw new IdempotencyError(
      'INVALID_OPTION',
      `transactional: true needs a store that runs transactions (PostgresStore, MySqlStore); ${ledger.store.name} does not. Drop the option or change the store.`,
    )
  }
  if (options.transactional) rollsBackFailed(ledger.store as TransactionalStore<unknown>, options.failedWrites)
  else if (options.failedWrites !== undefined) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      "failedWrites applies to the handler's writes in the store's transaction: add transactional: true, or drop failedWrites.",
    )
  }
  const { header, keyHeader, maxRequestBody, maxStoredBody, wait, lease, ttl } = resolveRouteOptions(options)
  const allow = storedHeaderSet(nameList(options.storedHeaders, 'storedHeaders', "['location', 'x-request-id']"))
  const errorFormat = options.errorFormat
  if (errorFormat !== undefined && errorFormat !== 'problem' && errorFormat !== 'stripe' && typeof errorFormat !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `errorFormat must be 'problem', 'stripe' or a function of the layer's answer, got ${JSON.stringify(errorFormat)}.`,
    )
  }
  const render = answerRenderer(errorFormat, options.problemBaseUrl ?? DEFAULT_PROBLEM_BASE, header)
  const classify = options.classify ?? classifyStatus
  const scopeFn = options.scope
  // Only the default scope needs the secret, so only it warns when none is set.
  const secret = scopeFn || internals.scopeOf ? undefined : resolveScopeSecret(options.scopeSecret)
  const credentials = credentialRule(options.credentials, 'idempotency({ credentials })')
  const onEvent = options.onEvent as ((event: EngineEvent) => void) | undefined
  return {
    ledger,
    methods: new Set((nameList(options.methods, 'methods', "['POST', 'PATCH']") ?? ['POST', 'PATCH']).map((m) => m.toUpperCase())),
    header,
    keyHeader,
    required: options.required === true,
    failOpen: options.failOpen === true,
    transactional: options.transactional === true,
    maxRequestBody,
    render,
    scopeOf: internals.scopeOf
      ? internals.scopeOf
      : scopeFn
        ? async (req: HttpRequestLike) => functionScope(await scopeFn((req.native ?? req) as Req))
        : (req: HttpRequestLike) => credentialScope(req.headers, secret as string | Uint8Array, credentials),
    fingerprintOf: options.fingerprint ?? requestFingerprint,
    runOptions: {
      encode: (response) => toStored(response, allow, maxStoredBody),
      decode: (stored) => fromStored(stored, render),
      classify: (response) => classify(response.status),
      wait,
      lease,
      ttl,
      onEvent,
      reconcile: options.reconcile,
      failedWrites: options.failedWrites,
    },
    runOptionsOf: internals.runOptionsOf,
    onReplay: options.onReplay,
    onEvent,
  }
}

/** The options that need no ledger (sizes, durations, the key header), checked and defaulted. */
type RouteOptions = Pick<EngineOptions<unknown>, 'maxRequestBody' | 'maxStoredBody' | 'wait' | 'lease' | 'ttl' | 'keyHeader'>

function resolveRouteOptions(options: RouteOptions) {
  const { name: header, lower: keyHeader } = keyHeaderName(options.keyHeader)
  const duration = (name: 'wait' | 'lease' | 'ttl') => {
    const value = options[name]
    return value === undefined ? undefined : runDuration(name, value)
  }
  return {
    header,
    keyHeader,
    maxRequestBody: byteLimit(options.maxRequestBody, 'maxRequestBody'),
    maxStoredBody: byteLimit(options.maxStoredBody, 'maxStoredBody'),
    wait: duration('wait'),
    lease: duration('lease'),
    ttl: duration('ttl'),
  }
}

/**
 * Checks the options that need no ledger as the engine will, for per-route options checked where they
 * are declared (NestJS's `@Idempotent(...)`): a bad one fails at start-up, not with a 500 at each
 * request of its route.
 */
export function checkRouteOptions(options: RouteOptions): void {
  resolveRouteOptions(options)
}

/** A size option in bytes: 1 MiB when not given, else a whole number of bytes, 0 or more. */
function byteLimit(value: unknown, name: string): number {
  if (value === undefined) return MiB
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `${name} must be a whole number of bytes, 0 or more (e.g. 1048576 for 1 MiB), got ${typeof value === 'string' ? `"${value}"` : String(value)}.`,
    )
  }
  return value
}
