/**
 * Turns one `fetch(input, init)` call into something that can be sent several times with the same
 * bytes: the headers merged as fetch would, the body read once into memory, and the fields of an
 * input `Request` carried over.
 */

/** One call, ready to be sent again and again. */
export interface ReplayableRequest {
  url: string | URL
  method: string
  headers: Headers
  /** The whole `RequestInit`, without its signal (each attempt gets its own). */
  init: RequestInit
}

/** Fields of a `Request` that fetch would keep when the `Request` itself is the input. */
const REQUEST_FIELDS = ['cache', 'credentials', 'integrity', 'keepalive', 'mode', 'redirect', 'referrer', 'referrerPolicy'] as const

/** The method fetch will use, upper-cased (fetch itself upper-cases only the six standard ones). */
export function methodOf(input: string | URL | Request, init: RequestInit): string {
  return (init.method ?? (input instanceof Request ? input.method : 'GET')).toUpperCase()
}

/**
 * Reads the call once. Every body is serialized here, once, so each attempt sends the same bytes:
 * a stream could be read only once, and a `FormData` would get a new multipart boundary each time
 * (another fingerprint on the server: a 422 on the retry).
 */
export async function toReplayable(input: string | URL | Request, init: RequestInit, method: string): Promise<ReplayableRequest> {
  const fromRequest = input instanceof Request ? input : undefined
  // As in fetch: init.headers, when given, replace the Request's headers instead of merging with them.
  const headers = new Headers(init.headers ?? fromRequest?.headers)
  const body = await readBody(init.body ?? (fromRequest?.body ? fromRequest.clone() : undefined), headers)
  const merged: RequestInit = {}
  if (fromRequest) {
    for (const field of REQUEST_FIELDS) {
      const value = fromRequest[field]
      // An empty referrer, or 'about:client', means "the default": leave it to fetch.
      if (value !== undefined && value !== '' && value !== 'about:client') Object.assign(merged, { [field]: value })
    }
  }
  const { signal: _signal, body: _body, headers: _headers, duplex: _duplex, ...rest } = init as RequestInit & { duplex?: unknown }
  Object.assign(merged, rest, { method, headers })
  if (body !== undefined) merged.body = body
  return { url: fromRequest ? fromRequest.url : input instanceof URL ? input : String(input), method, headers, init: merged }
}

const encoder = new TextEncoder()

async function readBody(source: RequestInit['body'] | Request, headers: Headers): Promise<Uint8Array<ArrayBuffer> | undefined> {
  if (source === undefined || source === null) return undefined
  // The two commonest bodies without a Response (which costs more than the rest of the call): the
  // same bytes and content type fetch would send.
  if (typeof source === 'string') {
    if (!headers.has('content-type')) headers.set('content-type', 'text/plain;charset=UTF-8')
    return encoder.encode(source)
  }
  // A copy (as fetch takes one), a plain Uint8Array even from a Buffer.
  if (source instanceof Uint8Array && source.buffer instanceof ArrayBuffer) return new Uint8Array(source)
  // A Response serializes any BodyInit exactly as fetch would, content type included.
  const carrier = source instanceof Request ? source : new Response(source)
  const type = carrier.headers.get('content-type')
  if (type !== null && !headers.has('content-type')) headers.set('content-type', type)
  return new Uint8Array(await carrier.arrayBuffer())
}
