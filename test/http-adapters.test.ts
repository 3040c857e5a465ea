/**
 * What each adapter must do beyond the shared conformance suite: Express captures however a handler
 * sends and never breaks streaming; Fastify runs after its own validation and takes per-route options;
 * the fetch wrapper passes extra arguments through.
 */
import { randomUUID } from 'node:crypto'
import { request as rawRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import compression from 'compression'
import express from 'express'
import Fastify, { type FastifyInstance } from 'fastify'
import { Hono } from 'hono'
import multer from 'multer'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotency as expressIdempotency } from '../src/http/express/index.js'
import { idempotency as fastifyIdempotency } from '../src/http/fastify/index.js'
import { getIdempotency, withIdempotency } from '../src/http/fetch/index.js'
import { idempotency as honoIdempotency } from '../src/http/hono/index.js'
import { countingStore } from './helpers/counting-store.js'
import { type EncodedForm, encodedForm, postForm } from './helpers/multipart.js'

/** Serves an Express app on a free loopback port: its URL (with `path`), and a close that drops its connections. */
async function listen(app: ReturnType<typeof express>, path = ''): Promise<{ url: string; close: () => Promise<void> }> {
  const server = app.listen(0, '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}${path}`,
    close: async () => {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    },
  }
}

async function send(url: string, key: string | undefined, body: string, contentType = 'application/json') {
  const headers: Record<string, string> = { 'content-type': contentType }
  if (key) headers['idempotency-key'] = key
  const response = await fetch(url, { method: 'POST', headers, body })
  return { status: response.status, replayed: response.headers.get('idempotent-replayed'), text: await response.text() }
}

/** POSTs `{}` twice under one new key: the first answer and the second (a replay, when it was stored). */
async function postTwice(url: string) {
  const key = randomUUID()
  const once = async () => {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: '{}',
    })
    return { status: response.status, headers: response.headers, text: await response.text() }
  }
  const first = await once()
  return { first, replay: await once() }
}

describe('Express adapter', () => {
  let url: string
  let close: () => Promise<void> = async () => {}
  let runs = 0
  let releaseStream: () => void = () => {}

  beforeAll(async () => {
    const app = express()
    app.disable('x-powered-by')
    app.use(express.json())
    app.use(express.urlencoded({ extended: false }))
    app.use(expressIdempotency({ ledger: new Ledger({ store: new MemoryStore() }), maxStoredBody: 64 }))
    app.post('/json', (_req, res) => {
      runs++
      res.status(201).json({ run: runs })
    })
    app.post('/send', (_req, res) => {
      runs++
      res.status(202).send(`sent ${runs}`)
    })
    app.post('/pipe', (_req, res) => {
      runs++
      res.setHeader('content-type', 'text/plain')
      Readable.from(['piped ', 'in ', `pieces ${runs}`]).pipe(res)
    })
    app.post('/stream', (_req, res) => {
      runs++
      res.setHeader('content-type', 'text/event-stream')
      res.write('data: first\n\n')
      void new Promise<void>((resolve) => {
        releaseStream = resolve
      }).then(() => res.end(`data: last ${runs}\n\n`))
    })
    app.post('/long', (_req, res) => {
      runs++
      res.setHeader('content-type', 'text/plain')
      for (let i = 0; i < 10; i++) res.write('0123456789')
      res.end()
    })
    app.post('/form', (req, res) => {
      runs++
      res.status(201).json({ got: req.body })
    })
    app.post('/head', (_req, res) => {
      runs++
      // No header set before: Node keeps what writeHead is given out of getHeaders().
      res.writeHead(201, { 'content-type': 'application/json', etag: `"h${runs}"` })
      res.end(`{"run":${runs}}`)
    })
    ;({ url, close } = await listen(app))
  })
  afterAll(() => close())

  it("stores the headers a handler gives writeHead, when it set none before (app.disable('x-powered-by'))", async () => {
    const key = randomUUID()
    const first = await fetch(`${url}/head`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: '{}',
    })
    const replay = await fetch(`${url}/head`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: '{}',
    })
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.headers.get('content-type')).toBe('application/json')
    expect(replay.headers.get('etag')).toBe(first.headers.get('etag'))
    expect(await replay.text()).toBe(await first.text())
  })

  it.each(['/json', '/send', '/pipe'])('captures what %s sends and replays it byte for byte', async (path) => {
    const key = randomUUID()
    const before = runs
    const first = await send(url + path, key, '{}')
    const replay = await send(url + path, key, '{}')
    expect(first.text.length).toBeGreaterThan(0)
    expect(replay.text).toBe(first.text)
    expect(replay.status).toBe(first.status)
    expect(replay.replayed).toBe('true')
    expect(runs).toBe(before + 1)
  })

  it('lets a streaming handler reach the client before it ends, then stores the whole stream', async () => {
    const key = randomUUID()
    const firstChunk = await new Promise<string>((resolve, reject) => {
      const req = rawRequest(`${url}/stream`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key } })
      req.on('response', (res) => {
        let text = ''
        res.setEncoding('utf8')
        res.on('data', (chunk: string) => {
          text += chunk
          // The first event arrived while the handler still holds the response open.
          if (text === 'data: first\n\n') releaseStream()
        })
        res.on('end', () => resolve(text))
      })
      req.on('error', reject)
      req.end('{}')
    })
    expect(firstChunk).toMatch(/^data: first\n\ndata: last \d+\n\n$/)
    const replay = await send(`${url}/stream`, key, '{}')
    expect(replay.text).toBe(firstChunk)
    expect(replay.replayed).toBe('true')
  })

  it('stores a streamed body over the limit without its bytes, and runs it once', async () => {
    const key = randomUUID()
    const before = runs
    expect((await send(`${url}/long`, key, '{}')).text.length).toBe(100)
    const replay = await fetch(`${url}/long`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: '{}',
    })
    expect(replay.headers.get('idempotent-body-omitted')).toBe('100')
    expect(await replay.json()).toMatchObject({ code: 'BODY_OMITTED', status: 200 })
    expect(runs).toBe(before + 1)
  })

  it('tells two different form bodies parsed by express.urlencoded apart (422, not a replay)', async () => {
    const key = randomUUID()
    const form = 'application/x-www-form-urlencoded'
    expect((await send(`${url}/form`, key, 'amount=100', form)).status).toBe(201)
    expect((await send(`${url}/form`, key, 'amount=100', form)).replayed).toBe('true')
    expect((await send(`${url}/form`, key, 'amount=999', form)).status).toBe(422)
  })
})

describe('Express adapter options', () => {
  it('refuses an abandonAfterMs that is no delay when the middleware is made (NaN or negative released the record at once after the client left, its handler still running)', () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    for (const abandonAfterMs of [Number.NaN, -1, '30s', 2 ** 31]) {
      expect(() => expressIdempotency({ ledger, abandonAfterMs: abandonAfterMs as number }), String(abandonAfterMs)).toThrow(
        expect.objectContaining({
          code: 'INVALID_OPTION',
          message: expect.stringMatching(/^abandonAfterMs is a delay in milliseconds from 0 to 2147483647/),
        }),
      )
    }
    expect(() => expressIdempotency({ ledger, abandonAfterMs: 0 })).not.toThrow()
  })
})

describe('Express adapter: how it takes its copy of the response', () => {
  let url: string
  let close: () => Promise<void> = async () => {}
  let runs = 0
  const ownMethods: boolean[] = []
  const contexts: Array<{ own: boolean; key: string | undefined }> = []

  beforeAll(async () => {
    const app = express()
    app.use(express.json())
    // A wrapper installed before idemkey, as compression() is: it rewrites what goes out (each
    // lower-case letter one further, so the length Express has set still holds).
    const shift = (chunk: unknown) =>
      Buffer.isBuffer(chunk) ? Buffer.from(chunk.map((byte) => (byte >= 0x61 && byte < 0x7a ? byte + 1 : byte))) : chunk
    app.use('/wrapped', (_req, res, next) => {
      const end = res.end
      res.end = function shifted(this: typeof res, chunk?: unknown, ...rest: unknown[]) {
        return Reflect.apply(end, this, [shift(chunk), ...rest])
      } as typeof res.end
      next()
    })
    app.use(expressIdempotency({ ledger: new Ledger({ store: new MemoryStore() }) }))
    app.post('/plain', (req, res) => {
      runs++
      ownMethods.push(Object.hasOwn(res, 'write') || Object.hasOwn(res, 'end'))
      contexts.push({ own: Object.hasOwn(req, 'idempotency'), key: req.idempotency?.key })
      res.status(201).send(`plain ${runs}`)
    })
    app.post('/wrapped', (_req, res) => {
      runs++
      res.status(201).send(`wrapped ${runs}`)
    })
    ;({ url, close } = await listen(app))
  })
  afterAll(() => close())

  it('adds no write or end of its own to a response nothing else wrapped, and still replays it', async () => {
    const key = randomUUID()
    const first = await send(`${url}/plain`, key, '{"a":1}')
    const replay = await send(`${url}/plain`, key, '{"a":1}')
    expect(first).toMatchObject({ status: 201, replayed: null })
    expect(replay).toMatchObject({ status: 201, replayed: 'true', text: first.text })
    expect(ownMethods).toEqual([false])
  })

  it('gives the handler req.idempotency without adding a property to the request', async () => {
    contexts.length = 0
    const key = randomUUID()
    await send(`${url}/plain`, key, '{"b":1}')
    await send(`${url}/plain`, undefined, '{"b":1}')
    expect(contexts).toEqual([
      { own: false, key },
      { own: false, key: undefined },
    ])
  })

  it('stores what the handler wrote, not what a wrapper installed before idemkey made of it', async () => {
    const key = randomUUID()
    const first = await send(`${url}/wrapped`, key, '{"a":1}')
    const replay = await send(`${url}/wrapped`, key, '{"a":1}')
    expect(first.text).toMatch(/^xsbqqfe \d+$/)
    // The replay goes out through the same wrapper once: stored as it went out, it would be shifted twice.
    expect(replay).toMatchObject({ status: 201, replayed: 'true', text: first.text })
  })
})

describe('Express adapter beside compression()', () => {
  const servers: Array<() => Promise<void>> = []
  afterAll(async () => {
    for (const close of servers) await close()
  })

  /** An app whose handler answers a JSON body, with compression() mounted after or before idemkey. */
  async function app(order: 'after' | 'before') {
    let runs = 0
    const app = express()
    if (order === 'before') app.use(compression({ threshold: 0 }))
    app.use(expressIdempotency({ ledger: new Ledger({ store: new MemoryStore() }) }))
    if (order === 'after') app.use(compression({ threshold: 0 }))
    app.post('/orders', (_req, res) => {
      runs++
      res.status(201).json({ order: runs, note: 'x'.repeat(200) })
    })
    const { url, close } = await listen(app)
    servers.push(close)
    return url
  }

  const post = async (url: string, key: string) => {
    const response = await fetch(`${url}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'accept-encoding': 'gzip' },
      body: '{}',
    })
    return {
      status: response.status,
      encoding: response.headers.get('content-encoding'),
      replayed: response.headers.get('idempotent-replayed'),
      text: await response.text(),
    }
  }

  it('replays a response compression() mounted after idemkey compressed, with its Content-Encoding', async () => {
    const url = await app('after')
    const key = randomUUID()
    const first = await post(url, key)
    const replay = await post(url, key)
    expect(first).toMatchObject({ status: 201, encoding: 'gzip', replayed: null })
    expect(JSON.parse(first.text)).toMatchObject({ order: 1 })
    // The stored bytes are the gzip that went out: without their Content-Encoding a client reads gzip as text.
    expect(replay).toMatchObject({ status: 201, encoding: 'gzip', replayed: 'true', text: first.text })
  })

  it('replays a response compression() mounted before idemkey compresses as it went out the first time', async () => {
    const url = await app('before')
    const key = randomUUID()
    const first = await post(url, key)
    const replay = await post(url, key)
    expect(first).toMatchObject({ status: 201, encoding: 'gzip', replayed: null })
    // idemkey keeps what the handler wrote, before compression(): compressed once on the way out, not labelled twice.
    expect(replay).toMatchObject({ status: 201, encoding: 'gzip', replayed: 'true', text: first.text })
  })
})

describe('Express adapter before a multipart parser (multer)', () => {
  let url: string
  let close: () => Promise<void> = async () => {}
  let runs = 0

  beforeAll(async () => {
    const app = express()
    app.use(expressIdempotency({ ledger: new Ledger({ store: new MemoryStore() }) }))
    // multer reads the request stream after the layer has read it to fingerprint the upload.
    app.post('/documents', multer({ storage: multer.memoryStorage() }).single('file'), (req, res) => {
      runs++
      res.status(201).json({ run: runs, title: req.body.title, file: req.file?.buffer.toString('utf8') })
    })
    ;({ url, close } = await listen(app))
  })
  afterAll(() => close())

  const upload = async (key: string, form: EncodedForm) => {
    const { text, ...answer } = await postForm(`${url}/documents`, key, form)
    return { ...answer, body: JSON.parse(text) as unknown }
  }

  it('hands the upload on to the parser after fingerprinting it, and replays the retry', async () => {
    const key = randomUUID()
    const form = await encodedForm('the first upload')
    const first = await upload(key, form)
    expect(first).toMatchObject({ status: 201, replayed: null, body: { run: 1, title: 'report', file: 'the first upload' } })
    const replay = await upload(key, form)
    expect(replay).toMatchObject({ status: 201, replayed: 'true', body: first.body })
    expect(runs).toBe(1)
  })
})

/**
 * A JSON parser of the kind apps plug in for money: integers past 2^53 become BigInt. The rest is
 * JSON.parse, which turns 1e400 into Infinity.
 */
function bigIntJson(text: string): unknown {
  const marked = text.replace(/:\s*(\d{16,})/g, ':"__big:$1"')
  // A reviver recurses: only pay for it (and its stack) when there is a big number to revive.
  if (marked === text) return JSON.parse(text)
  return JSON.parse(marked, (_key, value) => (typeof value === 'string' && value.startsWith('__big:') ? BigInt(value.slice(6)) : value))
}

describe('Express adapter behind a body parser that keeps no raw bytes', () => {
  let url: string
  let close: () => Promise<void> = async () => {}
  let runs = 0

  beforeAll(async () => {
    const app = express()
    app.use(express.text({ type: 'application/json', limit: '1mb' }))
    app.use((req, _res, next) => {
      if (typeof req.body === 'string') req.body = bigIntJson(req.body)
      next()
    })
    app.use(expressIdempotency({ ledger: new Ledger({ store: new MemoryStore() }) }))
    app.post('/pay', (_req, res) => {
      runs++
      res.status(201).json({ run: runs })
    })
    ;({ url, close } = await listen(app, '/pay'))
  })
  afterAll(() => close())

  it("tells apart BigInt values a custom parser made (422, not the other payee's replay)", async () => {
    const key = randomUUID()
    expect((await send(url, key, '{"account":9007199254740993}')).status).toBe(201)
    const other = await send(url, key, '{"account":9007199254740992}')
    expect(other.status).toBe(422)
    expect(other.replayed).toBeNull()
  })

  it("answers 400 problem, never another request's replay, when the parsed body holds Infinity", async () => {
    const key = randomUUID()
    const before = runs
    const first = await send(url, key, '{"amount":1e400,"payee":"ann"}')
    const second = await send(url, key, '{"amount":1e400,"payee":"bob"}')
    for (const answer of [first, second]) {
      expect(answer.status).toBe(400)
      expect(JSON.parse(answer.text)).toMatchObject({ code: 'BODY_INVALID', detail: expect.stringMatching(/raw body/) })
    }
    expect(runs).toBe(before)
  })

  it('answers 400 problem, never 500 nor a shared fingerprint, to a parsed body nested 15,000 or 30,000 deep', async () => {
    for (const depth of [15_000, 30_000]) {
      const key = randomUUID()
      const answer = await send(url, key, `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`)
      expect(answer.status).toBe(400)
      expect(JSON.parse(answer.text)).toMatchObject({ code: 'BODY_INVALID' })
    }
  })
})

/** A MemoryStore that runs "transactions" and can fence the next completion out (SPEC §6). */
class FencingTxStore extends MemoryStore {
  fenceNext = false
  async transaction<R>(fn: (tx: object) => Promise<R>): Promise<R> {
    return fn({})
  }
  async completeInTransaction(_tx: object, ...args: Parameters<MemoryStore['complete']>): Promise<boolean> {
    return this.fenceNext ? false : this.complete(...args)
  }
  /** Its transactions hold no writes, so there is nothing to roll back to. */
  async savepointInTransaction(): Promise<void> {}
}

describe('Express adapter in transactional mode', () => {
  let url: string
  let close: () => Promise<void> = async () => {}
  const store = new FencingTxStore()

  beforeAll(async () => {
    const app = express()
    app.use(express.json())
    app.use(expressIdempotency({ ledger: new Ledger({ store }), transactional: true }))
    app.post('/object', (_req, res) => {
      res.writeHead(201, 'Made', { 'content-type': 'application/json', 'x-order': 'o1' })
      res.end('{"id":"ch_1"}')
    })
    app.post('/flat', (_req, res) => {
      res.writeHead(201, ['content-type', 'text/plain', 'x-tag', 'a', 'x-tag', 'b'])
      res.end('made')
    })
    ;({ url, close } = await listen(app))
  })
  afterAll(() => close())
  afterEach(() => {
    store.fenceNext = false
  })

  it('keeps the status and headers a handler gave writeHead once the transaction committed', async () => {
    const response = await fetch(`${url}/object`, { method: 'POST', headers: { 'idempotency-key': randomUUID() } })
    expect(response.status).toBe(201)
    expect(response.statusText).toBe('Made')
    expect(response.headers.get('x-order')).toBe('o1')
    expect(await response.text()).toBe('{"id":"ch_1"}')
    const flat = await fetch(`${url}/flat`, { method: 'POST', headers: { 'idempotency-key': randomUUID() } })
    expect(flat.status).toBe(201)
    expect(flat.headers.get('x-tag')).toBe('a, b')
    expect(await flat.text()).toBe('made')
  })

  it("answers the 409 problem, not the handler's writeHead status and headers, when the holder was fenced out", async () => {
    store.fenceNext = true
    const response = await fetch(`${url}/object`, { method: 'POST', headers: { 'idempotency-key': randomUUID() } })
    expect(response.status).toBe(409)
    expect(response.headers.get('content-type')).toBe('application/problem+json')
    expect(response.headers.get('x-order')).toBeNull()
    expect(await response.text()).not.toContain('ch_1')
  })

  it('refuses failedWrites at start-up without transactional: true, and an unknown value', () => {
    expect(() => expressIdempotency({ ledger: new Ledger({ store }), failedWrites: 'commit' })).toThrow(/add transactional: true/)
    expect(() => expressIdempotency({ ledger: new Ledger({ store }), transactional: true, failedWrites: 'keep' as never })).toThrow(
      /failedWrites is 'rollback'/,
    )
  })

  it('refuses transactional: true at start-up when the store runs no transactions', () => {
    expect(() => expressIdempotency({ ledger: new Ledger({ store: new MemoryStore() }), transactional: true })).toThrow(
      /transactional: true needs a store that runs transactions/,
    )
  })
})

describe('Fastify adapter', () => {
  let app: FastifyInstance
  let url: string
  let store: ReturnType<typeof countingStore>
  let runs = 0

  beforeAll(async () => {
    store = countingStore()
    app = Fastify({ forceCloseConnections: true })
    await app.register(fastifyIdempotency, { ledger: new Ledger({ store }) })
    const schema = { body: { type: 'object', required: ['amount'], properties: { amount: { type: 'integer' } } } }
    app.post('/validated', { schema }, async (_request, reply) => reply.code(201).send({ run: ++runs }))
    app.post('/off', { config: { idempotency: false } }, async () => ({ run: ++runs }))
    app.post('/strict', { config: { idempotency: { required: true } } }, async () => ({ run: ++runs }))
    app.post('/stream', async (request, reply) => {
      runs++
      reply.type('text/plain')
      return reply.send(Readable.from(['a', 'b', `${request.idempotency?.token}`]))
    })
    await app.listen({ port: 0, host: '127.0.0.1' })
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  })
  afterAll(() => app.close())

  it('never touches the ledger for a request that fails schema validation', async () => {
    const before = store.acquired
    const answer = await send(`${url}/validated`, randomUUID(), '{"amount":"lots"}')
    expect(answer.status).toBe(400)
    expect(store.acquired).toBe(before)
    expect((await send(`${url}/validated`, randomUUID(), '{"amount":5}')).status).toBe(201)
    expect(store.acquired).toBe(before + 1)
  })

  it('leaves a route with config.idempotency = false alone', async () => {
    const key = randomUUID()
    const before = store.acquired
    await send(`${url}/off`, key, '{}')
    expect((await send(`${url}/off`, key, '{}')).replayed).toBeNull()
    expect(store.acquired).toBe(before)
  })

  it('applies per-route options: required keys on one route only', async () => {
    expect((await send(`${url}/strict`, undefined, '{}')).status).toBe(400)
    expect((await send(`${url}/validated`, undefined, '{"amount":1}')).status).toBe(201)
  })

  it("refuses a route's own bad options when the route is added, not with a 500 at each request", async () => {
    const other = Fastify()
    await other.register(fastifyIdempotency, { ledger: new Ledger({ store: new MemoryStore() }) })
    expect(() => other.post('/bad', { config: { idempotency: { maxRequestBody: -1 } } }, async () => ({ ok: true }))).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: expect.stringMatching(/^maxRequestBody must be a whole number of bytes/),
      }),
    )
    await other.close()
  })

  it('captures a stream the handler sends and replays it', async () => {
    const key = randomUUID()
    const first = await send(`${url}/stream`, key, '{}')
    expect(first.text).toBe('ab1')
    const replay = await send(`${url}/stream`, key, '{}')
    expect(replay.text).toBe('ab1')
    expect(replay.replayed).toBe('true')
  })
})

describe('Fastify adapter: a reply sent as a fetch Response or a web stream', () => {
  let app: FastifyInstance
  let url: string
  let runs = 0

  beforeAll(async () => {
    app = Fastify({ forceCloseConnections: true })
    await app.register(fastifyIdempotency, { ledger: new Ledger({ store: new MemoryStore() }) })
    // Fastify 5 sends a fetch Response with its own status and headers.
    app.post('/response', async (_request, reply) =>
      reply.send(
        new Response(JSON.stringify({ run: ++runs }), { status: 201, headers: { 'content-type': 'application/json', etag: `"r${runs}"` } }),
      ),
    )
    app.post('/web-stream', async (_request, reply) => {
      const text = `web ${++runs}`
      reply.code(202).type('text/plain')
      return reply.send(
        new ReadableStream<Uint8Array>({
          start(controller) {
            controller.enqueue(new TextEncoder().encode(text))
            controller.close()
          },
        }),
      )
    })
    await app.listen({ port: 0, host: '127.0.0.1' })
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  })
  afterAll(() => app.close())

  it('replays a fetch Response the handler sends with its status, headers and body', async () => {
    const { first, replay } = await postTwice(`${url}/response`)
    expect(first.status).toBe(201)
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.status).toBe(201)
    expect(replay.text).toBe(first.text)
    expect(replay.headers.get('content-type')).toBe('application/json')
    expect(replay.headers.get('etag')).toBe(first.headers.get('etag'))
  })

  it('replays a web ReadableStream the handler sends as the bytes it streamed', async () => {
    const { first, replay } = await postTwice(`${url}/web-stream`)
    expect(first).toMatchObject({ status: 202, text: expect.stringMatching(/^web \d+$/) })
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.status).toBe(202)
    expect(replay.text).toBe(first.text)
  })
})

describe('Fastify adapter: a reply without a Content-Type', () => {
  let app: FastifyInstance
  let url: string
  let runs = 0

  beforeAll(async () => {
    app = Fastify({ forceCloseConnections: true })
    await app.register(fastifyIdempotency, { ledger: new Ledger({ store: new MemoryStore() }) })
    app.post('/created', async (_request, reply) => reply.code(201).header('location', `/things/${++runs}`).send())
    await app.listen({ port: 0, host: '127.0.0.1' })
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  })
  afterAll(() => app.close())

  it('replays a response that had no Content-Type without one', async () => {
    const { first, replay } = await postTwice(`${url}/created`)
    expect(first.status).toBe(201)
    expect(first.headers.get('content-type')).toBeNull()
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.status).toBe(201)
    expect(replay.headers.get('location')).toBe(first.headers.get('location'))
    expect(replay.headers.get('content-type')).toBeNull()
    expect(replay.text).toBe('')
  })
})

describe('Fastify adapter: a reply stream that fails', () => {
  let app: FastifyInstance
  let url: string
  let runs = 0

  beforeAll(async () => {
    app = Fastify({ forceCloseConnections: true })
    await app.register(fastifyIdempotency, { ledger: new Ledger({ store: new MemoryStore(), wait: '200ms' }) })
    app.post('/broken-stream', async (_request, reply) => {
      runs++
      reply.type('text/plain')
      return reply.send(
        new Readable({
          read() {
            this.destroy(new Error('upstream went away'))
          },
        }),
      )
    })
    await app.listen({ port: 0, host: '127.0.0.1' })
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
  })
  afterAll(() => app.close())

  it('releases the record when the stream the handler sends fails, so the retry runs again', async () => {
    const { first, replay } = await postTwice(`${url}/broken-stream`)
    expect(first.status).toBe(500)
    expect(replay.status).toBe(500)
    expect(replay.headers.get('idempotent-replayed')).toBeNull()
    expect(runs).toBe(2)
  })
})

describe('Hono adapter: a response stream that fails', () => {
  it('releases the record when the stream the handler answers with fails, so the retry runs again', async () => {
    let runs = 0
    const app = new Hono()
    app.post('/broken-stream', honoIdempotency({ ledger: new Ledger({ store: new MemoryStore(), wait: '200ms' }) }), (c) => {
      runs++
      return c.body(
        new ReadableStream<Uint8Array>({
          pull(controller) {
            controller.error(new Error('upstream went away'))
          },
        }),
      )
    })
    const key = randomUUID()
    const post = () =>
      app.request('/broken-stream', { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{}' })
    const onError = vi.spyOn(console, 'error').mockImplementation(() => {})
    try {
      expect((await post()).status).toBe(500)
      expect((await post()).status).toBe(500)
    } finally {
      onError.mockRestore()
    }
    expect(runs).toBe(2)
  })
})

describe('Hono adapter: a body that middleware before it read', () => {
  it('fingerprints a body that middleware before it read through c.req, and the handler still reads it', async () => {
    let runs = 0
    const app = new Hono()
    // A webhook signature check, say: it reads the body before the layer sees the request.
    app.use(async (c, next) => {
      await c.req.text()
      await next()
    })
    app.post('/charges', honoIdempotency({ ledger: new Ledger({ store: new MemoryStore() }) }), async (c) => {
      const body = (await c.req.json()) as { amount: number }
      return c.json({ run: ++runs, amount: body.amount }, 201)
    })
    const key = randomUUID()
    const post = async (body: string) => {
      const response = await app.request('/charges', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body,
      })
      return { status: response.status, replayed: response.headers.get('idempotent-replayed'), text: await response.text() }
    }
    const first = await post('{"amount":5}')
    expect(first).toEqual({ status: 201, replayed: null, text: '{"run":1,"amount":5}' })
    expect(await post('{"amount":5}')).toEqual({ ...first, replayed: 'true' })
    expect((await post('{"amount":6}')).status).toBe(422)
    expect(runs).toBe(1)
  })
})

describe('Fastify adapter with a custom JSON parser', () => {
  let app: FastifyInstance
  let url: string
  let runs = 0

  beforeAll(async () => {
    app = Fastify({ forceCloseConnections: true })
    app.removeContentTypeParser('application/json')
    app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
      try {
        done(null, bigIntJson(body as string))
      } catch (error) {
        done(error as Error, undefined)
      }
    })
    await app.register(fastifyIdempotency, { ledger: new Ledger({ store: new MemoryStore() }) })
    app.post('/pay', async (_request, reply) => reply.code(201).send({ run: ++runs }))
    await app.listen({ port: 0, host: '127.0.0.1' })
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/pay`
  })
  afterAll(() => app.close())

  it('fingerprints the bytes the client sent, not what the parser made of them', async () => {
    const key = randomUUID()
    expect((await send(url, key, '{"account":9007199254740993,"amount":1e400}')).status).toBe(201)
    expect((await send(url, key, '{"account":9007199254740993,"amount":1e400}')).replayed).toBe('true')
    expect((await send(url, key, '{"account":9007199254740992,"amount":1e400}')).status).toBe(422)
    expect((await send(url, key, '{"account":9007199254740993,"amount":1e401}')).status).toBe(422)
    expect(runs).toBe(1)
  })

  it('still reads a body larger than the layer fingerprints as 413, and runs nothing', async () => {
    const key = randomUUID()
    const big = JSON.stringify({ pad: 'x'.repeat(1024 * 1024 + 10) })
    const answer = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: big })
    expect(answer.status).toBe(413)
  })
})

describe('fetch adapter', () => {
  it("hands back the handler's own Response, unbuffered, for requests it does not cover", async () => {
    const store = countingStore()
    const streamed = () =>
      new Response(new ReadableStream({ start: (c) => c.enqueue(new TextEncoder().encode('event: tick\n\n')) }), {
        headers: { 'content-type': 'text/event-stream' },
      })
    let own: Response | undefined
    const handler = withIdempotency(new Ledger({ store }), async () => {
      own = streamed()
      return own
    })
    const get = await handler(new Request('http://localhost/events', { headers: { 'idempotency-key': 'k' } }))
    expect(get).toBe(own)
    const keyless = await handler(new Request('http://localhost/events', { method: 'POST', body: '{}' }))
    expect(keyless).toBe(own)
    expect(store.acquired).toBe(0)
  })

  it('passes extra handler arguments (a Next.js route context) through and exposes the context', async () => {
    const ledger = new Ledger({ store: new MemoryStore() })
    const handler = withIdempotency(ledger, async (request: Request, route: { params: { id: string } }) =>
      Response.json({ id: route.params.id, token: getIdempotency(request)?.token ?? null }, { status: 201 }),
    )
    const key = randomUUID()
    const make = () => new Request('http://localhost/orders/7', { method: 'POST', headers: { 'idempotency-key': key }, body: '{}' })
    const first = await handler(make(), { params: { id: '7' } })
    expect(await first.json()).toEqual({ id: '7', token: 1 })
    const replay = await handler(make(), { params: { id: '7' } })
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(await replay.json()).toEqual({ id: '7', token: 1 })
  })
})
