import type { IncomingMessage } from 'node:http'
import { distinctHeaders, isBytes, isJsonType, parseJsonOr, readNodeBody, tooLarge } from '../node-body.js'
import type { HttpRequestLike } from '../types.js'

/** What an Express-style request may carry beyond Node's: body-parser's marks, the raw bytes. */
export type BodyCarrier = IncomingMessage & {
  body?: unknown
  /** The raw body, where the app keeps it: `express.json({ verify: (req, _res, buf) => Object.assign(req, { rawBody: buf }) })`. */
  rawBody?: unknown
  _body?: boolean
  originalUrl?: string
}

/**
 * An Express request (or NestJS's, on its Express platform) in the engine's shape. `native` is what the
 * scope function receives.
 */
export function expressRequestLike(req: BodyCarrier, native: unknown = req): HttpRequestLike {
  return {
    method: req.method ?? 'GET',
    url: req.originalUrl ?? req.url ?? '/',
    headers: distinctHeaders(req),
    native,
    // A body parser before us consumed the stream (body-parser 1 sets _body; 2 only ends the stream).
    // Its raw bytes, when a `verify` hook kept them as req.rawBody, fingerprint exactly; else the parsed value.
    parsedBody: bodyParsed(req) && !isBytes(req.body) && !isBytes(req.rawBody) ? req.body : undefined,
    body: async (limit) => {
      if (isBytes(req.rawBody)) {
        const raw = Buffer.from(req.rawBody as Buffer)
        if (raw.byteLength > limit) throw tooLarge(limit)
        return raw
      }
      if (bodyParsed(req)) return isBytes(req.body) ? Buffer.from(req.body as Buffer) : new Uint8Array(0)
      // A body that is not JSON is left in the stream too, for a parser mounted after the layer (multer).
      const json = isJsonType(req.headers['content-type'])
      const bytes = await readNodeBody(req, limit, { keep: !json })
      // No body parser ran before us: hand the body on, parsed when it is JSON, so handlers still get it.
      req.body = parseJsonOr(bytes, req.headers['content-type'])
      req._body = true
      return bytes
    },
  }
}

function bodyParsed(req: BodyCarrier): boolean {
  return req._body === true || (req.readableEnded && req.body !== undefined)
}
