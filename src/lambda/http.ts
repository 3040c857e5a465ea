import { isUtf8 } from 'node:buffer'
import { createHash } from 'node:crypto'
import type { Ledger } from '../core/ledger.js'
import { assertFunctions } from '../core/validate.js'
import { credentialRule } from '../http/credentials.js'
import { createEngine } from '../http/engine.js'
import { isJsonType, tooLarge } from '../http/node-body.js'
import { credentialScope, resolveScopeSecret } from '../http/scope.js'
import type { EngineOptions, HttpRequestLike, HttpResponseLike, IdempotencyContext } from '../http/types.js'
import { assertLedger, inInvocation, invocationDeadline } from './invocation.js'
import type {
  ApiGatewayV1EventLike,
  ApiGatewayV1ResultLike,
  ApiGatewayV2EventLike,
  ApiGatewayV2ResultLike,
  LambdaContextLike,
} from './types.js'

/** An API Gateway or Function URL event of either payload format. */
export type HttpEventLike = ApiGatewayV1EventLike | ApiGatewayV2EventLike

/** The result a handler returns for the event type `E`. */
export type HttpResultFor<E> = E extends ApiGatewayV2EventLike ? ApiGatewayV2ResultLike | string | object : ApiGatewayV1ResultLike

/**
 * Options of {@link withIdempotency}: every engine option but the ledger. Without `scope`, the scope is
 * the authorizer's principal when API Gateway authorized the request (JWT `sub`, a Lambda authorizer's
 * `principalId`, the IAM caller), else the credentials as every other adapter keys them (`Authorization`,
 * or what `credentials` names).
 */
export type LambdaHttpOptions<E extends HttpEventLike = HttpEventLike> = Omit<EngineOptions<E>, 'ledger'>

const contexts = new WeakMap<object, IdempotencyContext>()

/** The idempotency context of an event a wrapped handler is serving, or `undefined` when it is not covered. */
export function getIdempotency(event: object): IdempotencyContext | undefined {
  return contexts.get(event)
}

/**
 * Wraps an API Gateway REST API (payload 1.0), HTTP API (2.0) or Function URL handler so each
 * Idempotency-Key runs it once, with the rules of every idemkey adapter (docs/http.md): a reused key
 * with another request answers 422, a concurrent duplicate 409, a replay carries `Idempotent-Replayed`,
 * failures are problem+json bodies. Uncovered requests (GET, no key) reach the handler untouched.
 *
 * @example
 * const ledger = new Ledger({ store: new DynamoDbStore({ table: 'idemkey' }) })
 * export const handler = withIdempotency(ledger, async (event) => ({ statusCode: 201, body: JSON.stringify(await charge(event)) }))
 */
export function withIdempotency<E extends HttpEventLike, C extends LambdaContextLike>(
  ledger: Ledger,
  handler: (event: E, context: C) => HttpResultFor<E> | Promise<HttpResultFor<E>>,
  options: LambdaHttpOptions<E> = {},
): (event: E, context: C) => Promise<HttpResultFor<E>> {
  assertLedger(ledger, 'withIdempotency (idemkey/lambda)')
  assertFunctions('withIdempotency()', { handler }, { required: ['handler'] })
  let secret: string | Uint8Array | undefined
  const credentials = credentialRule(options.credentials, 'withIdempotency({ credentials })')
  // The default scope: the authorizer's principal, else the Authorization credential as every adapter keys it.
  const scopeOf = (request: HttpRequestLike): string => {
    const principal = principalOf(request.native as E)
    if (principal !== undefined)
      return `principal:${principal.length <= 200 ? principal : createHash('sha256').update(principal).digest('hex')}`
    secret ??= resolveScopeSecret(options.scopeSecret)
    return credentialScope(request.headers, secret, credentials)
  }
  const engine = createEngine<E>(
    { ...options, ledger },
    {
      ...(options.scope ? {} : { scopeOf }),
      // No lease outlives the invocation: a timed-out one frees its record when it ends.
      runOptionsOf: () => ({ deadlineMs: invocationDeadline(ledger.clock) }),
    },
  )
  return function idempotentHandler(event: E, context: C): Promise<HttpResultFor<E>> {
    return inInvocation(context, async () => {
      const v2 = isV2(event)
      const method = v2 ? event.requestContext.http.method : (event as ApiGatewayV1EventLike).httpMethod
      const headers = lowerHeaders(event)
      if (!engine.applies(method, headers[engine.keyHeader] !== undefined)) return handler(event, context)
      const request: HttpRequestLike = {
        method,
        url: v2 ? `${event.rawPath}${event.rawQueryString ? `?${event.rawQueryString}` : ''}` : v1Url(event as ApiGatewayV1EventLike),
        headers,
        native: event,
        body: async (limit) => {
          const body = requestBody(event)
          if (body.byteLength > limit) throw tooLarge(limit)
          return body
        },
      }
      const response = await engine.handle(request, async (ctx) => {
        if (ctx) contexts.set(event, ctx)
        return fromResult(await handler(event, context), v2)
      })
      return (v2 ? toV2Result(response) : toV1Result(response)) as HttpResultFor<E>
    })
  }
}

function isV2(event: HttpEventLike): event is ApiGatewayV2EventLike {
  return (event as ApiGatewayV2EventLike).version === '2.0' && (event as ApiGatewayV2EventLike).requestContext?.http !== undefined
}

/** Who API Gateway's authorizer says the caller is, if it authorized the request. */
export function principalOf(event: HttpEventLike): string | undefined {
  const pick = (...values: unknown[]) => {
    for (const value of values) if ((typeof value === 'string' && value !== '') || typeof value === 'number') return String(value)
    return undefined
  }
  if (isV2(event)) {
    const authorizer = event.requestContext.authorizer
    if (!authorizer) return undefined
    return pick(
      authorizer.jwt?.claims?.sub,
      authorizer.lambda?.principalId,
      authorizer.principalId,
      authorizer.iam?.userArn,
      authorizer.iam?.userId,
    )
  }
  const context = (event as ApiGatewayV1EventLike).requestContext
  const authorizer = context?.authorizer
  return pick(
    (authorizer?.claims as Record<string, unknown> | undefined)?.sub,
    authorizer?.principalId,
    context?.identity?.cognitoIdentityId,
    context?.identity?.userArn,
  )
}

/** Lower-case header names; a v1 header given twice (multiValueHeaders) is an array. */
function lowerHeaders(event: HttpEventLike): Record<string, string | string[] | undefined> {
  const out: Record<string, string | string[] | undefined> = {}
  const multi = (event as ApiGatewayV1EventLike).multiValueHeaders
  if (multi) {
    for (const name in multi) {
      const values = multi[name]
      if (values && values.length > 0) out[name.toLowerCase()] = values.length === 1 ? values[0] : [...values]
    }
  }
  const single = event.headers ?? {}
  for (const name in single) {
    const lower = name.toLowerCase()
    if (out[lower] === undefined && single[name] !== undefined) out[lower] = single[name]
  }
  const cookies = (event as ApiGatewayV2EventLike).cookies
  if (cookies && cookies.length > 0 && out.cookie === undefined) out.cookie = cookies.join('; ')
  return out
}

function v1Url(event: ApiGatewayV1EventLike): string {
  const params = new URLSearchParams()
  const multi = event.multiValueQueryStringParameters
  if (multi) {
    for (const name in multi) for (const value of multi[name] ?? []) params.append(name, value)
  } else if (event.queryStringParameters) {
    for (const name in event.queryStringParameters) {
      const value = event.queryStringParameters[name]
      if (value !== undefined) params.append(name, value)
    }
  }
  const query = params.toString()
  return query ? `${event.path}?${query}` : event.path
}

function requestBody(event: HttpEventLike): Uint8Array {
  const body = event.body
  if (body === null || body === undefined || body === '') return new Uint8Array(0)
  return event.isBase64Encoded ? Buffer.from(body, 'base64') : Buffer.from(body, 'utf8')
}

/** The handler's result in the engine's shape (a 2.0 handler may return a plain value: API Gateway sends it as JSON). */
function fromResult(result: unknown, v2: boolean): HttpResponseLike {
  const structured = typeof result === 'object' && result !== null && typeof (result as { statusCode?: unknown }).statusCode === 'number'
  if (!structured) {
    if (v2) {
      const body = typeof result === 'string' ? result : JSON.stringify(result ?? null)
      return { status: 200, headers: { 'content-type': 'application/json' }, body: Buffer.from(body, 'utf8') }
    }
    throw new TypeError(
      'A REST API (payload 1.0) handler must return { statusCode, headers?, body }; the wrapped handler returned something else.',
    )
  }
  const r = result as ApiGatewayV1ResultLike & ApiGatewayV2ResultLike
  const headers: Record<string, string | string[]> = {}
  for (const name in r.headers ?? {}) headers[name.toLowerCase()] = String(r.headers?.[name])
  for (const name in r.multiValueHeaders ?? {}) headers[name.toLowerCase()] = (r.multiValueHeaders?.[name] ?? []).map(String)
  if (r.cookies && r.cookies.length > 0) headers['set-cookie'] = [...r.cookies]
  const body =
    r.body === undefined || r.body === ''
      ? new Uint8Array(0)
      : r.isBase64Encoded
        ? Buffer.from(r.body, 'base64')
        : Buffer.from(r.body, 'utf8')
  return { status: r.statusCode as number, headers, body }
}

/** Text goes back as text; anything else (or bytes that are not UTF-8) as base64. */
function encodeBody(response: HttpResponseLike): { body: string; isBase64Encoded: boolean } {
  const bytes = Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength)
  const type = response.headers['content-type']
  const text = typeof type === 'string' && (isJsonType(type) || /^text\/|xml|javascript|x-www-form-urlencoded/i.test(type))
  if (text && isUtf8(bytes)) {
    return { body: bytes.toString('utf8'), isBase64Encoded: false }
  }
  if (bytes.byteLength === 0) return { body: '', isBase64Encoded: false }
  return { body: bytes.toString('base64'), isBase64Encoded: true }
}

function toV1Result(response: HttpResponseLike): ApiGatewayV1ResultLike {
  const headers: Record<string, string> = {}
  const multiValueHeaders: Record<string, string[]> = {}
  for (const name in response.headers) {
    const value = response.headers[name] as string | string[]
    if (Array.isArray(value)) multiValueHeaders[name] = value
    else headers[name] = value
  }
  const result: ApiGatewayV1ResultLike = { statusCode: response.status, headers, ...encodeBody(response) }
  if (Object.keys(multiValueHeaders).length > 0) result.multiValueHeaders = multiValueHeaders
  return result
}

function toV2Result(response: HttpResponseLike): ApiGatewayV2ResultLike {
  const headers: Record<string, string> = {}
  let cookies: string[] | undefined
  for (const name in response.headers) {
    const value = response.headers[name] as string | string[]
    if (name === 'set-cookie') cookies = Array.isArray(value) ? value : [value]
    else headers[name] = Array.isArray(value) ? value.join(', ') : value
  }
  const result: ApiGatewayV2ResultLike = { statusCode: response.status, headers, ...encodeBody(response) }
  if (cookies) result.cookies = cookies
  return result
}
