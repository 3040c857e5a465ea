/**
 * The two platforms NestJS runs on, seen by the interceptor: what their request looks like to the
 * engine, which Node response they write to, and how to answer through them.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Readable } from 'node:stream'
import { StreamableFile } from '@nestjs/common'
import { type BodyCarrier, expressRequestLike } from '../express/request.js'
import { distinctHeaders, isBytes, tooLarge } from '../node-body.js'
import { sendNode } from '../node-response.js'
import type { HttpRequestLike, HttpResponseLike } from '../types.js'

/** Fastify's request as the interceptor reads it (NestJS keeps the raw body there with `rawBody: true`). */
interface FastifyRequestLike {
  raw: IncomingMessage
  method: string
  url: string
  body?: unknown
  rawBody?: unknown
}

/** Fastify's reply, as far as the interceptor answers through it. */
interface FastifyReplyLike {
  raw: ServerResponse
  code(status: number): unknown
  header(name: string, value: string | string[]): unknown
  send(payload?: Buffer | Readable): unknown
}

export interface Platform {
  /** The Node response the platform finally writes the handler's answer to. */
  rawResponse: ServerResponse
  requestLike(): HttpRequestLike
  /**
   * Sets a replay's or problem's status and headers on the platform response and returns what the
   * interceptor hands NestJS to send as its body, byte for byte: a `StreamableFile` of the bytes (which
   * NestJS writes as they are on both platforms), or nothing for an empty body.
   */
  answer(response: HttpResponseLike): StreamableFile | undefined
  /** Sends a replay or problem itself, for a handler that takes the response (`@Res()`): NestJS sends nothing for those. */
  send(response: HttpResponseLike): void
}

/** The platform a request came in on, from the objects `context.switchToHttp()` gives. */
export function platformOf(request: unknown, response: unknown): Platform {
  if (isFastifyReply(response)) {
    const req = request as FastifyRequestLike
    return {
      rawResponse: response.raw,
      requestLike: () => fastifyRequestLike(req),
      answer(answer) {
        response.code(answer.status)
        for (const [name, value] of Object.entries(answer.headers)) response.header(name, value)
        return body(answer)
      },
      send(answer) {
        response.code(answer.status)
        for (const [name, value] of Object.entries(answer.headers)) response.header(name, value)
        // Fastify types a Buffer as application/octet-stream; a stored response without a type has
        // none, so its body goes as a stream of known length instead.
        const bytes = Buffer.from(answer.body)
        if (answer.headers['content-type'] !== undefined) response.send(bytes)
        else if (bytes.byteLength === 0) response.send()
        else {
          response.header('content-length', String(bytes.byteLength))
          response.send(Readable.from([bytes]))
        }
      },
    }
  }
  const req = request as BodyCarrier
  const res = response as ServerResponse
  return {
    rawResponse: res,
    requestLike: () => expressRequestLike(req),
    answer(answer) {
      res.statusCode = answer.status
      for (const [name, value] of Object.entries(answer.headers)) res.setHeader(name, value)
      return body(answer)
    },
    send: (answer) => sendNode(res, answer),
  }
}

function isFastifyReply(response: unknown): response is FastifyReplyLike {
  const reply = response as Partial<FastifyReplyLike> | undefined
  return (
    typeof reply?.code === 'function' && typeof reply.header === 'function' && typeof reply.send === 'function' && reply.raw !== undefined
  )
}

function body(answer: HttpResponseLike): StreamableFile | undefined {
  if (answer.body.byteLength === 0) return undefined
  const type = answer.headers['content-type']
  return new StreamableFile(Buffer.from(answer.body), {
    type: typeof type === 'string' ? type : undefined,
    length: answer.body.byteLength,
  })
}

/**
 * Fastify has read and parsed the body by the time an interceptor runs. With NestJS's `rawBody: true`
 * its bytes are at hand and fingerprint exactly; otherwise the parsed value does (see docs/http.md).
 */
function fastifyRequestLike(request: FastifyRequestLike): HttpRequestLike {
  const raw = isBytes(request.rawBody) ? Buffer.from(request.rawBody as Buffer) : undefined
  const parsed = request.body
  return {
    method: request.method,
    url: request.url,
    headers: distinctHeaders(request.raw),
    native: request,
    parsedBody: raw === undefined && parsed !== undefined && parsed !== null && !isBytes(parsed) ? parsed : undefined,
    body: async (limit) => {
      if (raw) {
        if (raw.byteLength > limit) throw tooLarge(limit)
        return raw
      }
      if (!isBytes(parsed)) return new Uint8Array(0)
      const bytes = Buffer.from(parsed as Buffer)
      if (bytes.byteLength > limit) throw tooLarge(limit)
      return bytes
    },
  }
}

/** Nest's metadata keys and route parameter types (`@nestjs/common`'s constants and RouteParamtypes). */
const ROUTE_ARGS_METADATA = '__routeArguments__'
const RESPONSE_PASSTHROUGH_METADATA = '__responsePassthrough__'
const RESPONSE_PARAM = 1
const NEXT_PARAM = 2
const getMetadata = (key: string, target: object, property: string): unknown =>
  (Reflect as unknown as { getMetadata(key: string, target: object, property: string): unknown }).getMetadata(key, target, property)

/**
 * Whether the handler answers by itself through `@Res()` or `@Next()` (without `passthrough`), as NestJS
 * decides it: then NestJS sends nothing the interceptor returns, and a replay must be written directly.
 */
export function handlesResponse(controller: object, method: string): boolean {
  const args = (getMetadata(ROUTE_ARGS_METADATA, controller, method) ?? {}) as Record<string, unknown>
  const takes = Object.keys(args).some((key) => {
    const type = Number(key.split(':')[0])
    return type === RESPONSE_PARAM || type === NEXT_PARAM
  })
  return takes && getMetadata(RESPONSE_PASSTHROUGH_METADATA, controller, method) !== true
}
