/**
 * GraphQL mutations that take effect once per idempotency key (docs/rpc.md): `useIdempotency` is an
 * Envelop plugin (GraphQL Yoga's plugin system), `apolloIdempotency` an Apollo Server plugin. A
 * mutation operation sent with a key (the
 * `Idempotency-Key` header, or `extensions.idempotencyKey`) runs once; a retry gets the first result
 * back; the same key with another operation or other variables is refused.
 */
import { type ExecutionResult, GraphQLError, type GraphQLFormattedError, getOperationAST, print } from 'graphql'
import { type Duration, runDurations } from '../../core/duration.js'
import { sha256Hex } from '../../core/fingerprint.js'
import type { Ledger } from '../../core/ledger.js'
import type { StoredResponse } from '../../core/store.js'
import { assertFunctions } from '../../core/validate.js'
import { IdempotencyError, isIdempotencyError } from '../../errors.js'
import { credentialHeaders, credentialRule } from '../../http/credentials.js'
import { credentialScope, functionScope, resolveScopeSecret } from '../../http/scope.js'
import { parseKeyHeader } from '../../protocol/key-header.js'

/** What a GraphQL server's context usually holds (Yoga's: the fetch `Request` and the request's params). */
export interface GraphQLContextLike {
  request?: { headers: { get(name: string): string | null } }
  params?: { extensions?: Record<string, unknown> }
}

/** Options of {@link useIdempotency}. */
export interface GraphQLIdempotencyOptions<C> {
  ledger: Ledger
  /** The operation's key. @default the `Idempotency-Key` header, else `extensions.idempotencyKey` */
  key?: (context: C) => string | undefined
  /** Refuse mutations sent without a key. @default false (they run as plain mutations) */
  required?: boolean
  /**
   * Namespace of the records: the caller's user or tenant from the context. @default a keyed hash of the
   * request's `Authorization` credential (as the HTTP layer's default scope), or `public` without one, so
   * two callers' keys never meet
   */
  scope?: (context: C) => string
  /**
   * What the default scope takes as the caller's identity, as the HTTP layer's `credentials`
   * (`'authorization'`, `'cookie:<name>'`, `'header:<name>'`). @default ['authorization'], refusing a
   * keyed mutation with an unnamed cookie or API key
   */
  credentials?: readonly string[]
  /** The secret of the default scope's hash. @default `IDEMKEY_SCOPE_SECRET`, else a warned-about constant */
  scopeSecret?: string | Uint8Array
  lease?: Duration
  ttl?: Duration
  wait?: Duration
}

/** An Envelop execute function (structural): what runs the operation, given its arguments. */
export type ExecuteFnLike = (args: { signal?: AbortSignal | undefined; [arg: string]: unknown }) => unknown

/** The part of an Envelop plugin this one implements (structural: no import of @envelop/types). */
export interface IdempotencyPlugin<C> {
  onExecute(payload: {
    args: { document: Parameters<typeof getOperationAST>[0]; operationName?: string | null; variableValues?: unknown; contextValue: C }
    setResultAndStopExecution(result: ExecutionResult): void
    /** Envelop's execute function and its setter: a held mutation runs through a wrapper of it. */
    executeFn?: ExecuteFnLike
    setExecuteFn?(executeFn: ExecuteFnLike): void
  }): Promise<void | { onExecuteDone(payload: { result: unknown }): Promise<void> }>
}

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/**
 * `extensions.idempotencyKey` as sent: a value that is no string (a number, an object) is passed on
 * for the ledger to refuse (400 IDEMPOTENCY_KEY_INVALID): dropping it would run the mutation without a
 * key, once per retry.
 */
function extensionKey(extensions: Record<string, unknown> | undefined): string | undefined {
  const key = extensions?.idempotencyKey
  return key === undefined || key === null ? undefined : (key as string)
}

/** A file of a GraphQL multipart request (the platform's `File`, or the ponyfill a server parses into). */
interface FileLike {
  name?: unknown
  type: string
  size: number
  arrayBuffer(): Promise<ArrayBuffer>
}

function isFileLike(value: object): value is FileLike {
  const file = value as Partial<FileLike>
  return typeof file.arrayBuffer === 'function' && typeof file.size === 'number' && typeof file.type === 'string'
}

/**
 * The variables as the fingerprint takes them: an uploaded file (the GraphQL multipart request) by its
 * name, type, size and a SHA-256 of its bytes. Taken as it is, Yoga's file was its own fields to the
 * fingerprint, a `lastModified` set when the request was parsed among them, so every retry of an upload
 * was refused 422 (and a platform `File`, `{}` to JSON, would let another file pass for the first).
 * Nesting past `depth` is left as it is (the fingerprint refuses it).
 */
async function fingerprintVariables(value: unknown, depth = 0): Promise<unknown> {
  if (typeof value !== 'object' || value === null || depth > 64) return value
  if (isFileLike(value)) {
    const bytes = new Uint8Array(await value.arrayBuffer())
    return {
      file: typeof value.name === 'string' ? value.name : null,
      type: value.type,
      size: value.size,
      sha256: sha256Hex(bytes),
    }
  }
  if (Array.isArray(value)) return Promise.all(value.map((item) => fingerprintVariables(item, depth + 1)))
  if (Object.getPrototypeOf(value) !== Object.prototype && Object.getPrototypeOf(value) !== null) return value
  const entries = await Promise.all(
    Object.entries(value).map(async ([name, item]) => [name, await fingerprintVariables(item, depth + 1)] as const),
  )
  return Object.fromEntries(entries)
}

/**
 * An answer of the plugin's own. `retryAfterS` is sent as `Retry-After` (Yoga sends an error's
 * `extensions.http.headers`; the Apollo plugin copies them), as the HTTP layer answers 409 and 503.
 */
const refusal = (message: string, code: string, status: number, retryAfterS?: number): ExecutionResult => ({
  errors: [
    new GraphQLError(message, {
      extensions: { code, http: { status, ...(retryAfterS === undefined ? {} : { headers: { 'retry-after': String(retryAfterS) } }) } },
    }),
  ],
})

/**
 * @example
 * const yoga = createYoga({ schema, plugins: [useIdempotency({ ledger })] })
 */
export function useIdempotency<C extends GraphQLContextLike = GraphQLContextLike>(
  options: GraphQLIdempotencyOptions<C>,
): IdempotencyPlugin<C> {
  const ledger = options?.ledger
  if (!ledger || typeof ledger.begin !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'useIdempotency({ ledger }) needs a Ledger: new Ledger({ store }).')
  }
  assertFunctions('useIdempotency()', { key: options.key, scope: options.scope })
  const keyOf =
    options.key ??
    ((context: C) => {
      const header = context.request?.headers.get('idempotency-key')
      if (header !== null && header !== undefined) return parseKeyHeader(header)
      return extensionKey(context.params?.extensions)
    })
  const scopeFn = options.scope
  // Only the default scope needs the secret, so only it warns when none is set.
  const secret = scopeFn ? undefined : resolveScopeSecret(options.scopeSecret)
  const credentials = credentialRule(options.credentials, 'useIdempotency({ credentials })')
  const scopeOf = (context: C): string => {
    if (scopeFn) return functionScope(scopeFn(context))
    const headers = credentialHeaders(credentials, (name) => context.request?.headers.get(name))
    return credentialScope(headers, secret as string | Uint8Array, credentials)
  }
  const runOptions = {
    encode: (result: ExecutionResult): StoredResponse => ({
      status: 200,
      headers: { 'content-type': 'application/json' },
      body: encoder.encode(JSON.stringify({ data: result.data ?? null })),
    }),
    decode: (response: StoredResponse): ExecutionResult => JSON.parse(decoder.decode(response.body)) as ExecutionResult,
    ...runDurations(options),
  }

  return {
    async onExecute({ args, setResultAndStopExecution, executeFn, setExecuteFn }) {
      const operation = getOperationAST(args.document, args.operationName ?? undefined)
      if (operation?.operation !== 'mutation') return
      let key: string | undefined
      try {
        // The header as the HTTP layer reads it: bare or an RFC 8941 string ("k" is k); empty is refused.
        key = keyOf(args.contextValue)
      } catch (error) {
        if (!isIdempotencyError(error) || error.code !== 'KEY_INVALID') throw error
        setResultAndStopExecution(refusal(error.message, 'IDEMPOTENCY_KEY_INVALID', 400))
        return
      }
      if (!key) {
        if (options.required) {
          setResultAndStopExecution(
            refusal(
              'This mutation needs an idempotency key: send an Idempotency-Key header (or extensions.idempotencyKey), and the same one when you retry.',
              'IDEMPOTENCY_KEY_REQUIRED',
              400,
            ),
          )
        }
        return
      }
      // The document (the operation with the fragments its selection uses) and the variables are what the
      // key stands for: the same key with another one is refused.
      const payload = {
        document: print(args.document),
        operationName: args.operationName ?? null,
        variables: await fingerprintVariables(args.variableValues ?? {}),
      }
      let begun: Awaited<ReturnType<typeof ledger.begin<ExecutionResult>>>
      try {
        begun = await ledger.begin<ExecutionResult>({ key, scope: scopeOf(args.contextValue), payload }, runOptions)
      } catch (error) {
        if (isIdempotencyError(error) && (error.code === 'KEY_INVALID' || error.code === 'SCOPE_INVALID')) {
          setResultAndStopExecution(refusal(error.message, 'IDEMPOTENCY_KEY_INVALID', 400))
          return
        }
        if (isIdempotencyError(error) && error.code === 'STORE_UNAVAILABLE') {
          setResultAndStopExecution(
            refusal(
              'The idempotency store is unavailable, so this mutation was not run. Retry with the same key.',
              'STORE_UNAVAILABLE',
              503,
              1,
            ),
          )
          return
        }
        throw error
      }
      switch (begun.kind) {
        case 'replayed':
          setResultAndStopExecution({ ...begun.value, extensions: { idempotency: { key, replayed: true } } })
          return
        case 'mismatch':
          setResultAndStopExecution(
            refusal(
              `The idempotency key "${key}" was used before with another operation or other variables, so this one was not run. A changed request needs a new key.`,
              'IDEMPOTENCY_KEY_REUSED',
              422,
            ),
          )
          return
        case 'in_progress': {
          const retryAfterS = Math.max(1, Math.ceil(begun.retryAfterMs / 1_000))
          setResultAndStopExecution(
            refusal(
              `A mutation with the idempotency key "${key}" is still running. Retry with the same key in ${retryAfterS} s to get its result.`,
              'IDEMPOTENCY_KEY_IN_PROGRESS',
              409,
              retryAfterS,
            ),
          )
          return
        }
        case 'acquired':
          if (executeFn && setExecuteFn) {
            // Envelop calls onExecuteDone only for an execution that returns. Yoga's cancellation makes one
            // whose client went away throw instead, which left the record held (and renewed) with no one to
            // finish it: every retry got 409 until the process ended. A held mutation runs to its end
            // without the request's signal (it ran, so its result is stored and the retry gets it), and an
            // execution that throws anyway is released.
            setExecuteFn(async ({ signal: _signal, ...executeArgs }) => {
              try {
                return await executeFn(executeArgs)
              } catch (error) {
                await begun.fail(error)
                throw error
              }
            })
          }
          return {
            async onExecuteDone({ result }) {
              const single = result as ExecutionResult & { [Symbol.asyncIterator]?: unknown }
              // A result with errors (a resolver threw) or a stream is released: the retry runs again.
              if (single[Symbol.asyncIterator] !== undefined || (single.errors?.length ?? 0) > 0) {
                await begun.fail(new Error('the mutation returned errors'))
                return
              }
              await begun.finish(single)
            },
          }
      }
    },
  }
}

/** A result as Apollo Server sends it (errors already formatted). */
export interface FormattedResultLike {
  data?: Record<string, unknown> | null
  errors?: ReadonlyArray<GraphQLFormattedError>
  extensions?: Record<string, unknown>
}

/** The part of Apollo Server's request context this plugin reads and writes (structural: no import of @apollo/server). */
export interface ApolloRequestContextLike<C, H extends { status?: number }> {
  contextValue: C
  operation?: { operation: string } | null
  document?: Parameters<typeof getOperationAST>[0]
  operationName?: string | null
  request: {
    variables?: Record<string, unknown>
    extensions?: Record<string, unknown>
    http?: { headers: { get(name: string): string | undefined } }
  }
  response: { body?: { kind: string; singleResult?: FormattedResultLike }; http: H }
}

/** What the Envelop plugin inside {@link apolloIdempotency} reads: Apollo's context, the key found, the headers. */
type ApolloEnvelopContext<C> = GraphQLContextLike & { apollo: C; key: () => string | undefined }

/** An Apollo Server plugin (structural: `plugins: [apolloIdempotency({ ledger })]`). */
export interface ApolloIdempotencyPlugin<C> {
  requestDidStart(): Promise<{
    responseForOperation<H extends { status?: number }>(
      requestContext: ApolloRequestContextLike<C, H>,
    ): Promise<{ body: { kind: 'single'; singleResult: FormattedResultLike }; http: H } | null>
    willSendResponse<H extends { status?: number }>(requestContext: ApolloRequestContextLike<C, H>): Promise<void>
  }>
}

/**
 * The same rules as {@link useIdempotency}, as an Apollo Server 4/5 plugin. The key comes from the
 * `Idempotency-Key` header or `extensions.idempotencyKey` unless `key` reads it from the context.
 *
 * @example
 * const server = new ApolloServer({ schema, plugins: [apolloIdempotency({ ledger })] })
 */
export function apolloIdempotency<C = unknown>(
  options: Omit<GraphQLIdempotencyOptions<C>, 'key'> & {
    key?: (requestContext: ApolloRequestContextLike<C, { status?: number }>) => string | undefined
  },
): ApolloIdempotencyPlugin<C> {
  const ledger = options?.ledger
  if (!ledger || typeof ledger.begin !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'apolloIdempotency({ ledger }) needs a Ledger: new Ledger({ store }).')
  }
  assertFunctions('apolloIdempotency()', { key: options.key, scope: options.scope })
  // The Envelop plugin holds the rules; Apollo's hooks feed it what it reads and take what it decides.
  // Made once, so its durations and scope secret are checked when the server is built.
  const scopeOf = options.scope
  const envelop = useIdempotency<ApolloEnvelopContext<C>>({
    ledger,
    key: (context) => context.key(),
    ...(options.required !== undefined ? { required: options.required } : {}),
    ...(scopeOf ? { scope: (context: ApolloEnvelopContext<C>) => scopeOf(context.apollo) } : {}),
    ...(options.scopeSecret !== undefined ? { scopeSecret: options.scopeSecret } : {}),
    ...(options.credentials !== undefined ? { credentials: options.credentials } : {}),
    ...runDurations(options),
  })
  return {
    async requestDidStart() {
      let done: ((result: unknown) => Promise<void>) | undefined
      return {
        async responseForOperation(rc) {
          if (rc.operation?.operation !== 'mutation' || !rc.document) return null
          // Read where the Envelop plugin reads it, so a malformed header is its 400, not a crash here.
          const key = () => {
            const header = rc.request.http?.headers.get('idempotency-key')
            return options.key?.(rc) ?? (header === undefined ? undefined : parseKeyHeader(header)) ?? extensionKey(rc.request.extensions)
          }
          let answer: ExecutionResult | undefined
          const hooks = await envelop.onExecute({
            args: {
              document: rc.document,
              operationName: rc.operationName,
              variableValues: rc.request.variables ?? {},
              // The request's headers as Yoga's context holds them: the default scope reads Authorization.
              contextValue: {
                apollo: rc.contextValue,
                key,
                request: { headers: { get: (name) => rc.request.http?.headers.get(name) ?? null } },
              },
            },
            setResultAndStopExecution: (result) => {
              answer = result
            },
          })
          if (hooks) done = (result) => hooks.onExecuteDone({ result })
          if (!answer) return null
          const http = answer.errors?.[0]?.extensions?.http as { status?: number; headers?: Record<string, string> } | undefined
          if (http?.status !== undefined) rc.response.http.status = http.status
          // Apollo's head carries a HeaderMap: the Retry-After of a 409 or 503.
          const headers = (rc.response.http as { headers?: { set(name: string, value: string): unknown } }).headers
          for (const [name, value] of Object.entries(http?.headers ?? {})) headers?.set(name, value)
          const formatted: FormattedResultLike = {
            ...(answer.data !== undefined ? { data: answer.data as Record<string, unknown> | null } : {}),
            ...(answer.errors ? { errors: answer.errors.map((error) => error.toJSON()) } : {}),
            ...(answer.extensions ? { extensions: answer.extensions as Record<string, unknown> } : {}),
          }
          return { body: { kind: 'single', singleResult: formatted }, http: rc.response.http }
        },
        async willSendResponse(rc) {
          if (!done) return
          const body = rc.response.body
          await done(
            body?.kind === 'single' && body.singleResult
              ? body.singleResult
              : { errors: [new GraphQLError('incremental delivery is not recorded')] },
          )
        },
      }
    },
  }
}
