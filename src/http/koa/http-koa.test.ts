/**
 * What the Koa middleware does beyond the shared conformance suite: it reads the body itself or takes
 * what a body parser kept (raw text first, then the parsed value), hands it on, and stores whatever
 * `ctx.body` held (string, Buffer, object, stream, nothing) as the bytes Koa sends.
 */
import { randomUUID } from 'node:crypto'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import multer from '@koa/multer'
import Koa from 'koa'
import { type EncodedForm, encodedForm, postForm } from '../../../test/helpers/multipart.js'
import { MemoryStore } from '../../backends/memory/memory-store.js'
import { Ledger } from '../../core/ledger.js'
import { type IdempotencyState, idempotency } from './index.js'

async function send(url: string, key: string | undefined, body: string, contentType = 'application/json') {
  const headers: Record<string, string> = { 'content-type': contentType }
  if (key) headers['idempotency-key'] = key
  const response = await fetch(url, { method: 'POST', headers, body })
  return {
    status: response.status,
    type: response.headers.get('content-type'),
    replayed: response.headers.get('idempotent-replayed'),
    text: await response.text(),
  }
}

async function listen(app: Koa<IdempotencyState>): Promise<{ url: string; server: Server }> {
  app.silent = true
  const server = createServer(app.callback()).listen(0, '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server }
}

/** Reads the body as koa-bodyparser does: `ctx.request.body` parsed, `ctx.request.rawBody` the text (when `keepRaw`). */
function bodyParser(keepRaw: boolean): Koa.Middleware {
  return async (ctx, next) => {
    const request = ctx.request as { body?: unknown; rawBody?: string }
    if (request.body !== undefined) return next()
    const chunks: Buffer[] = []
    for await (const chunk of ctx.req) chunks.push(chunk as Buffer)
    const text = Buffer.concat(chunks).toString('utf8')
    // A parser of the kind apps plug in for money: integers past 2^53 become BigInt.
    request.body = JSON.parse(text.replace(/:\s*(\d{16,})/g, ':"$1"'), (_k, v) =>
      typeof v === 'string' && /^\d{16,}$/.test(v) ? BigInt(v) : v,
    )
    if (keepRaw) request.rawBody = text
    return next()
  }
}

describe('Koa adapter', () => {
  let url: string
  let server: Server
  let runs = 0
  const seen: unknown[] = []

  beforeAll(async () => {
    const app = new Koa<IdempotencyState>()
    app.use(idempotency({ ledger: new Ledger({ store: new MemoryStore() }), maxStoredBody: 64 }))
    // A body parser after the layer finds the body it handed on, and skips the (read) stream.
    app.use(bodyParser(false))
    app.use(async (ctx) => {
      runs++
      seen.push((ctx.request as { body?: unknown }).body)
      switch (ctx.path) {
        case '/object':
          ctx.status = 201
          ctx.body = { run: runs, token: ctx.state.idempotency?.token }
          return
        case '/buffer':
          ctx.type = 'application/octet-stream'
          ctx.body = Buffer.from([0, 1, 2, runs])
          return
        case '/stream':
          ctx.type = 'text/plain'
          ctx.body = Readable.from(['streamed ', 'in ', `pieces ${runs}`])
          return
        case '/response':
          ctx.body = new Response(`fetch response ${runs}`, { status: 202, headers: { 'content-type': 'text/plain', etag: `"r${runs}"` } })
          return
        case '/empty':
          ctx.status = 204
          return
        case '/nothing':
          // No body at all: Koa answers the status text.
          ctx.status = 402
          return
        case '/long':
          ctx.type = 'text/plain'
          ctx.body = Readable.from(['0123456789'.repeat(10)])
          return
        case '/thrown':
          ctx.throw(409, 'conflict, try again')
          return
        case '/bypass':
          ctx.respond = false
          ctx.res.statusCode = 201
          ctx.res.end(`raw ${runs}`)
      }
    })
    ;({ url, server } = await listen(app))
  })
  afterAll(async () => {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
  })

  it.each(['/object', '/buffer', '/stream', '/response', '/empty', '/nothing'])(
    'stores what %s sends and replays it byte for byte, with its status and type',
    async (path) => {
      const key = randomUUID()
      const before = runs
      const first = await send(url + path, key, '{}')
      const replay = await send(url + path, key, '{}')
      expect(replay).toEqual({ ...first, replayed: 'true' })
      expect(runs).toBe(before + 1)
    },
  )

  it('sends what Koa would have sent on the first run', async () => {
    expect(await send(`${url}/object`, randomUUID(), '{}')).toMatchObject({ status: 201, type: 'application/json; charset=utf-8' })
    expect(await send(`${url}/stream`, randomUUID(), '{}')).toMatchObject({
      status: 200,
      text: expect.stringMatching(/^streamed in pieces \d+$/),
    })
    expect(await send(`${url}/response`, randomUUID(), '{}')).toMatchObject({ status: 202, type: 'text/plain' })
    expect(await send(`${url}/nothing`, randomUUID(), '{}')).toMatchObject({ status: 402, text: 'Payment Required' })
  })

  it('hands the body it read on to the handler, parsed when it is JSON', async () => {
    seen.length = 0
    await send(`${url}/object`, randomUUID(), '{"amount":100}')
    expect(seen).toEqual([{ amount: 100 }])
  })

  it('stores a streamed body over the limit without its bytes, and runs it once', async () => {
    const key = randomUUID()
    const before = runs
    expect((await send(`${url}/long`, key, '{}')).text).toHaveLength(100)
    const replay = await send(`${url}/long`, key, '{}')
    expect(JSON.parse(replay.text)).toMatchObject({ code: 'BODY_OMITTED', status: 200 })
    expect(runs).toBe(before + 1)
  })

  it('releases the record of a handler that bypasses Koa (ctx.respond = false): there is nothing to store', async () => {
    const key = randomUUID()
    const before = runs
    expect((await send(`${url}/bypass`, key, '{}')).status).toBe(201)
    expect((await send(`${url}/bypass`, key, '{}')).replayed).toBeNull()
    expect(runs).toBe(before + 2)
  })

  it('releases the record when the handler throws (ctx.throw included): the retry runs again', async () => {
    const key = randomUUID()
    const before = runs
    expect((await send(`${url}/thrown`, key, '{}')).status).toBe(409)
    const retry = await send(`${url}/thrown`, key, '{}')
    expect(retry.status).toBe(409)
    expect(retry.replayed).toBeNull()
    expect(runs).toBe(before + 2)
  })
})

describe.each([
  ['keeps the raw text (ctx.request.rawBody)', true],
  ['keeps only the parsed value', false],
])('Koa adapter behind a body parser that %s', (_name, keepRaw) => {
  let url: string
  let server: Server
  let runs = 0

  beforeAll(async () => {
    const app = new Koa<IdempotencyState>()
    app.use(bodyParser(keepRaw))
    app.use(idempotency({ ledger: new Ledger({ store: new MemoryStore() }) }))
    app.use(async (ctx) => {
      ctx.status = 201
      ctx.body = { run: ++runs }
    })
    ;({ url, server } = await listen(app))
  })
  afterAll(async () => {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
  })

  it('replays the same body and answers 422 to another', async () => {
    const key = randomUUID()
    const first = await send(url, key, '{"amount":100,"payee":"ann"}')
    expect(first.status).toBe(201)
    expect((await send(url, key, '{ "payee": "ann", "amount": 100 }')).replayed).toBe('true')
    expect((await send(url, key, '{"amount":999,"payee":"ann"}')).status).toBe(422)
  })

  it('tells apart integers past 2^53 (from the raw text, or the BigInt the parser made)', async () => {
    const key = randomUUID()
    expect((await send(url, key, '{"account":9007199254740993}')).status).toBe(201)
    expect((await send(url, key, '{"account":9007199254740992}')).status).toBe(422)
  })
})

describe('Koa adapter before a multipart parser (@koa/multer)', () => {
  let url: string
  let server: Server
  let runs = 0

  beforeAll(async () => {
    const app = new Koa<IdempotencyState>()
    app.use(idempotency({ ledger: new Ledger({ store: new MemoryStore() }) }))
    // @koa/multer reads the request stream after the layer has read it to fingerprint the upload.
    const upload = multer({ storage: multer.memoryStorage() }).single('file')
    app.use(async (ctx, next) => {
      if (ctx.path !== '/documents') return next()
      await upload(ctx, async () => {})
      runs++
      ctx.status = 201
      ctx.body = {
        run: runs,
        title: (ctx.request as unknown as { body: { title?: string } }).body.title,
        file: ctx.file?.buffer.toString('utf8'),
      }
    })
    ;({ url, server } = await listen(app))
  })
  afterAll(() => new Promise((resolve) => server.close(resolve)))

  const post = async (key: string, form: EncodedForm) => {
    const { text, ...answer } = await postForm(`${url}/documents`, key, form)
    return { ...answer, body: text }
  }

  it('hands the upload on to the parser after fingerprinting it, and replays the retry', async () => {
    const key = randomUUID()
    const form = await encodedForm('the first upload')
    const first = await post(key, form)
    expect(first).toMatchObject({ status: 201, replayed: null })
    expect(JSON.parse(first.body)).toEqual({ run: 1, title: 'report', file: 'the first upload' })
    const replay = await post(key, form)
    expect(replay).toMatchObject({ status: 201, replayed: 'true', body: first.body })
    expect(runs).toBe(1)
    // Another upload under another key is fingerprinted and parsed on its own.
    const other = await post(randomUUID(), await encodedForm('a second upload'))
    expect(JSON.parse(other.body)).toEqual({ run: 2, title: 'report', file: 'a second upload' })
  })
})
