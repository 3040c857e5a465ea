import type { IncomingMessage } from 'node:http'
import { systemClock } from '../core/clock.js'
import { Schedule, type Scheduled } from '../core/schedule.js'
import { IdempotencyError } from '../errors.js'

/** Body deadlines of every read in the process, on one timer per length of deadline. */
const deadlines = new Schedule(systemClock)

/** How {@link readNodeBody} reads, beyond its limit. */
export interface ReadNodeBodyOptions {
  /** Aborting it stops the read, which rejects with the signal's reason. */
  signal?: AbortSignal
  /**
   * A deadline for the whole body, in ms from the call: past it the read stops with what `timedOut()`
   * returns. Cheaper than a signal with a timer of its own (no AbortController, no timer per read).
   */
  timeoutMs?: number
  timedOut?: () => unknown
  /** Called with each chunk's size before it is kept; what it throws stops the read with that error (a byte budget). */
  onChunk?: (bytes: number) => void
  /**
   * What a read that stops early (over the limit, aborted, `onChunk` threw) does with the request:
   * `destroy` it, closing the connection, or `pause` it, so the caller can still answer and then close
   * the connection itself. A client that goes away rejects the read either way.
   * @default 'destroy'
   */
  onStop?: 'destroy' | 'pause'
  /**
   * Leave the body in the request for a reader after this one (a multipart parser mounted after the
   * layer): it is read, then put back in front of the stream before its end is announced, so the next
   * reader gets every byte and then `end`. @default false
   */
  keep?: boolean
}

/** Reads a Node request body up to `limit` bytes; past it, `BODY_TOO_LARGE` (the layer answers 413). */
export async function readNodeBody(req: IncomingMessage, limit: number, options: ReadNodeBodyOptions = {}): Promise<Uint8Array> {
  const declared = Number(req.headers['content-length'])
  if (Number.isFinite(declared) && declared > limit) throw tooLarge(limit)
  if (req.readableEnded) return new Uint8Array(0)
  const { signal, onChunk, timeoutMs } = options
  return new Promise<Uint8Array>((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    const deadline: Scheduled | undefined =
      timeoutMs === undefined ? undefined : { dueAtMs: 0, fire: () => stop(options.timedOut?.() ?? new Error('body timed out')) }
    let settled = false
    const detach = () => {
      settled = true
      req.off('readable', onReadable)
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('error', onError)
      req.off('close', onClose)
      signal?.removeEventListener('abort', onAbort)
      if (deadline) deadlines.remove(deadline, timeoutMs as number)
    }
    const stop = (error: unknown) => {
      detach()
      if (options.onStop === 'pause') req.pause()
      else req.destroy()
      reject(error)
    }
    function onData(chunk: Buffer | string): void {
      const buffer = typeof chunk === 'string' ? Buffer.from(chunk) : chunk
      size += buffer.byteLength
      if (size > limit) {
        stop(tooLarge(limit))
        return
      }
      try {
        onChunk?.(buffer.byteLength)
      } catch (error) {
        stop(error)
        return
      }
      chunks.push(buffer)
    }
    function onEnd(): void {
      detach()
      resolve(Buffer.concat(chunks))
    }
    /** With `keep`: reads what has arrived; once the message is complete, puts it all back. */
    function onReadable(): void {
      while (!settled) {
        const chunk = req.read() as Buffer | string | null
        if (chunk === null) break
        onData(chunk)
      }
      if (settled || !req.complete) return
      detach()
      const body = Buffer.concat(chunks)
      // In the same turn as the read that found the end: the stream has not announced it yet, and with
      // the bytes back in front it will only once the next reader has taken them.
      if (body.byteLength > 0) req.unshift(body)
      resolve(body)
    }
    function onError(error: unknown): void {
      detach()
      reject(error)
    }
    function onClose(): void {
      // Closed before its end: the client went away mid-body.
      onError(Object.assign(new Error('aborted'), { code: 'ECONNRESET' }))
    }
    function onAbort(): void {
      stop(signal?.reason)
    }
    if (signal?.aborted) {
      onAbort()
      return
    }
    if (options.keep) req.on('readable', onReadable)
    else {
      req.on('data', onData)
      req.once('end', onEnd)
    }
    req.once('error', onError)
    req.once('close', onClose)
    signal?.addEventListener('abort', onAbort, { once: true })
    if (deadline) deadlines.add(deadline, timeoutMs as number)
    if (!options.keep) req.resume()
  })
}

/** Reads a fetch body stream up to `limit` bytes. */
export async function readWebBody(
  body: ReadableStream<Uint8Array> | null,
  contentLength: string | null,
  limit: number,
): Promise<Uint8Array> {
  if (!body) return new Uint8Array(0)
  const declared = Number(contentLength)
  if (contentLength !== null && Number.isFinite(declared) && declared > limit) throw tooLarge(limit)
  const reader = body.getReader()
  const chunks: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > limit) {
      await reader.cancel().catch(() => {})
      throw tooLarge(limit)
    }
    chunks.push(value)
  }
  return Buffer.concat(chunks)
}

export function tooLarge(limit: number): IdempotencyError {
  return new IdempotencyError(
    'BODY_TOO_LARGE',
    `The request body is larger than ${limit} bytes, the most the idempotency layer reads to fingerprint a request. Send a smaller body, or raise maxRequestBody.`,
  )
}

/** Node's headers with repeated ones as arrays (so a duplicated Idempotency-Key is seen as such). */
export function distinctHeaders(req: IncomingMessage): Record<string, string | string[] | undefined> {
  const headers: Record<string, string | string[] | undefined> = {}
  const raw = req.rawHeaders
  for (let i = 0; i < raw.length; i += 2) {
    const name = (raw[i] as string).toLowerCase()
    const value = raw[i + 1] as string
    const existing = headers[name]
    headers[name] = existing === undefined ? value : Array.isArray(existing) ? [...existing, value] : [existing, value]
  }
  return headers
}

/** A Headers object as a record; Set-Cookie kept apart so it is never joined. */
export function headersRecord(headers: Headers): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {}
  headers.forEach((value, name) => {
    if (name !== 'set-cookie') out[name] = value
  })
  const cookies = headers.getSetCookie?.() ?? []
  if (cookies.length > 0) out['set-cookie'] = cookies
  return out
}

/** Statuses whose responses carry no body (a Response with a body for them throws). */
export const NULL_BODY_STATUSES = new Set([101, 103, 204, 205, 304])

/** A neutral response as a fetch Response. */
export function toWebResponse(response: { status: number; headers: Record<string, string | string[]>; body: Uint8Array }): Response {
  const headers = new Headers()
  for (const [name, value] of Object.entries(response.headers)) {
    if (Array.isArray(value)) for (const v of value) headers.append(name, v)
    else headers.set(name, value)
  }
  return new Response(NULL_BODY_STATUSES.has(response.status) ? null : (response.body as Uint8Array<ArrayBuffer>), {
    status: response.status,
    headers,
  })
}

/** Whether a Content-Type is JSON (`application/json` or any `*+json`), whatever its parameters. */
export function isJsonType(contentType: string | string[] | undefined): boolean {
  const type = (Array.isArray(contentType) ? contentType[0] : contentType)?.split(';')[0]?.trim().toLowerCase() ?? ''
  return type === 'application/json' || type.endsWith('+json')
}

/** Whether a Content-Type is `application/x-www-form-urlencoded`, whatever its parameters. */
export function isFormType(contentType: string | string[] | undefined): boolean {
  return (
    (Array.isArray(contentType) ? contentType[0] : contentType)?.split(';')[0]?.trim().toLowerCase() === 'application/x-www-form-urlencoded'
  )
}

/** A body a framework kept as it came (a Buffer, or text), not as something it parsed. */
export function isBytes(value: unknown): value is Buffer | string {
  return Buffer.isBuffer(value) || typeof value === 'string'
}

/** A framework's header record (numbers, arrays, unset entries) as the engine's strings. */
export function plainHeaders(headers: Record<string, unknown>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {}
  // for-in, not Object.entries: no array per header (Node's header records have no prototype).
  for (const name in headers) {
    const value = headers[name]
    if (value !== undefined && value !== null)
      out[name] = typeof value === 'string' ? value : Array.isArray(value) ? value.map(String) : String(value)
  }
  return out
}

/** A body read by the layer, as a handler expects it: parsed when it is JSON, else the bytes. */
export function parseJsonOr(bytes: Uint8Array, contentType: string | undefined): unknown {
  if (isJsonType(contentType)) {
    try {
      return JSON.parse(Buffer.from(bytes).toString('utf8'))
    } catch {
      // Invalid JSON: the handler gets the bytes and answers as it sees fit.
    }
  }
  return Buffer.from(bytes)
}
