/**
 * What the NestJS module does beyond the shared conformance suite, on both of its platforms: the
 * bytes NestJS serializes are what replays send; guards run before the ledger and pipes release it;
 * `@Idempotent()` sets per-route options, opts a route in or out; `forRootAsync` builds the ledger
 * from other providers.
 */
import { randomUUID } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import {
  BadRequestException,
  Body,
  type CanActivate,
  Controller,
  type ExecutionContext,
  HttpCode,
  Module,
  NotFoundException,
  type PipeTransform,
  Post,
  Res,
  StreamableFile,
  UseGuards,
  UseInterceptors,
} from '@nestjs/common'
import { NestFactory } from '@nestjs/core'
import { FastifyAdapter } from '@nestjs/platform-fastify'
import { countingStore } from '../../../test/helpers/counting-store.js'
import type { MemoryStore } from '../../backends/memory/memory-store.js'
import { Ledger } from '../../core/ledger.js'
import { IdempotencyInterceptor, IdempotencyModule, Idempotent } from './index.js'

async function send(url: string, key: string | undefined, body: unknown = {}, headers: Record<string, string> = {}) {
  const all: Record<string, string> = { 'content-type': 'application/json', ...headers }
  if (key) all['idempotency-key'] = key
  const response = await fetch(url, { method: 'POST', headers: all, body: JSON.stringify(body) })
  return {
    status: response.status,
    type: response.headers.get('content-type'),
    replayed: response.headers.get('idempotent-replayed'),
    text: await response.text(),
  }
}

type Platform = 'express' | 'fastify'

async function start(platform: Platform, module: new () => unknown) {
  const settings = { logger: false as const, rawBody: true, forceCloseConnections: true }
  const app =
    platform === 'express'
      ? await NestFactory.create(module, settings)
      : await NestFactory.create(module, new FastifyAdapter({ forceCloseConnections: true }), settings)
  await app.listen(0, '127.0.0.1')
  return { url: `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}`, close: () => app.close() }
}

class AmountPipe implements PipeTransform {
  transform(value: { amount?: unknown }) {
    if (typeof value?.amount !== 'number') throw new BadRequestException('amount must be a number')
    return value
  }
}

class DenyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    return context.switchToHttp().getRequest<{ headers: Record<string, unknown> }>().headers['x-deny'] === undefined
  }
}

type RawReply = { status?(code: number): { json(body: unknown): void }; code?(code: number): { send(body: unknown): void } }
/** Express's `res` or Fastify's `reply`, for a handler that answers 201 with a Location and no body. */
type CreatedReply = {
  status?(code: number): { location(url: string): { end(): void } }
  code?(code: number): { header(name: string, value: string): { send(): void } }
}

describe.each<Platform>(['express', 'fastify'])('NestJS on %s', (platform) => {
  const store = countingStore()
  let runs = 0
  let app: { url: string; close(): Promise<void> }

  @Controller()
  class ChargesController {
    @Post('charges')
    create(@Body() body: unknown) {
      return { run: ++runs, body, at: Math.random() }
    }

    @Post('accepted')
    @HttpCode(202)
    accepted() {
      return `accepted ${++runs}`
    }

    @Post('strict')
    @Idempotent({ required: true })
    strict() {
      return { run: ++runs }
    }

    @Post('off')
    @Idempotent(false)
    off() {
      return { run: ++runs }
    }

    @Post('guarded')
    @UseGuards(DenyGuard)
    guarded() {
      return { run: ++runs }
    }

    @Post('validated')
    validated(@Body(AmountPipe) body: { amount: number }) {
      return { run: ++runs, amount: body.amount }
    }

    @Post('missing')
    missing() {
      throw new NotFoundException(`no charge ${++runs}`)
    }

    @Post('file')
    file() {
      return new StreamableFile(Buffer.from(`file ${++runs}`), { type: 'text/plain' })
    }

    @Post('raw')
    raw(@Res() reply: RawReply) {
      const body = { run: ++runs }
      if (reply.code) reply.code(201).send(body)
      else reply.status?.(201).json(body)
    }

    @Post('created')
    created(@Res() reply: CreatedReply) {
      const location = `/charges/${++runs}`
      if (reply.code) reply.code(201).header('location', location).send()
      else reply.status?.(201).location(location).end()
    }
  }

  @Module({ imports: [IdempotencyModule.forRoot({ ledger: new Ledger({ store }), global: true })], controllers: [ChargesController] })
  class AppModule {}

  beforeAll(async () => {
    app = await start(platform, AppModule)
  })
  afterAll(() => app.close())

  it.each(['/charges', '/accepted', '/file', '/raw', '/created'])(
    'replays what %s sent, byte for byte, with its status and type',
    async (path) => {
      const key = randomUUID()
      const before = runs
      const first = await send(app.url + path, key, { amount: 1 })
      const replay = await send(app.url + path, key, { amount: 1 })
      expect(first.status).toBe(path === '/accepted' ? 202 : 201)
      expect(first.replayed).toBeNull()
      expect(replay).toEqual({ ...first, replayed: 'true' })
      expect(runs).toBe(before + 1)
    },
  )

  it('stores an HttpException the handler threw as a final failure and replays it', async () => {
    const key = randomUUID()
    const first = await send(`${app.url}/missing`, key)
    expect(first.status).toBe(404)
    expect(JSON.parse(first.text)).toMatchObject({ statusCode: 404, message: expect.stringMatching(/^no charge \d+$/) })
    expect(await send(`${app.url}/missing`, key)).toEqual({ ...first, replayed: 'true' })
  })

  it('requires a key on a route with @Idempotent({ required: true }), and runs it once under the global interceptor too', async () => {
    const missing = await send(`${app.url}/strict`, undefined)
    expect(missing.status).toBe(400)
    expect(JSON.parse(missing.text)).toMatchObject({ code: 'KEY_MISSING' })
    expect((await send(`${app.url}/charges`, undefined)).status).toBe(201)
    const key = randomUUID()
    const before = runs
    const first = await send(`${app.url}/strict`, key)
    expect(await send(`${app.url}/strict`, key)).toEqual({ ...first, replayed: 'true' })
    expect(runs).toBe(before + 1)
  })

  it('refuses bad route options where @Idempotent(...) is declared, not with a 500 at each request', () => {
    const refusals: Array<[Parameters<typeof Idempotent>[0], RegExp]> = [
      [{ maxRequestBody: -1 }, /^maxRequestBody must be a whole number of bytes/],
      [{ maxStoredBody: Number.NaN }, /^maxStoredBody must be a whole number of bytes/],
      [{ lease: 'soon' }, /^lease "soon" is not a duration/],
      // The ledger refuses both at each run; a route said so with a 500 at every request.
      [{ lease: 0 }, /^lease must be longer than 0/],
      [{ ttl: '0s' }, /^ttl must be longer than 0/],
      // NaN or negative: the record was released at once after the client left, its handler still running.
      [{ abandonAfterMs: Number.NaN }, /^abandonAfterMs is a delay in milliseconds from 0/],
      [{ abandonAfterMs: -1 }, /^abandonAfterMs is a delay in milliseconds from 0/],
      [{ keyHeader: 'Idempotency Key' }, /Idempotency Key/],
    ]
    for (const [options, message] of refusals) {
      expect(() => Idempotent(options), JSON.stringify(options)).toThrow(
        expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringMatching(message) }),
      )
    }
    expect(() => Idempotent({ required: true, wait: '5s' })).not.toThrow()
  })

  it('leaves a route with @Idempotent(false) alone', async () => {
    const key = randomUUID()
    const before = store.acquired
    await send(`${app.url}/off`, key)
    expect((await send(`${app.url}/off`, key)).replayed).toBeNull()
    expect(store.acquired).toBe(before)
  })

  it('never touches the ledger for a request a guard refuses', async () => {
    const before = store.acquired
    expect((await send(`${app.url}/guarded`, randomUUID(), {}, { 'x-deny': '1' })).status).toBe(403)
    expect(store.acquired).toBe(before)
  })

  it('releases the record when a pipe rejects the request, so its 400 is never replayed', async () => {
    const key = randomUUID()
    const rejected = await send(`${app.url}/validated`, key, { amount: 'lots' })
    expect(rejected.status).toBe(400)
    expect((await send(`${app.url}/validated`, key, { amount: 'lots' })).replayed).toBeNull()
    // Released, not stored: the same key with a corrected body runs (no 422).
    const fixed = await send(`${app.url}/validated`, key, { amount: 5 })
    expect(fixed.status).toBe(201)
    expect(JSON.parse(fixed.text)).toMatchObject({ amount: 5 })
  })
})

describe.each<Platform>(['express', 'fastify'])('NestJS on %s without a global interceptor (forRootAsync)', (platform) => {
  const store = countingStore()
  let runs = 0
  let app: { url: string; close(): Promise<void> }
  const CONFIG = Symbol('config')

  @Module({ providers: [{ provide: CONFIG, useValue: { store } }], exports: [CONFIG] })
  class ConfigModule {}

  @Controller()
  class OptInController {
    @Post('plain')
    plain() {
      return { run: ++runs }
    }

    @Post('opted')
    @Idempotent()
    opted() {
      return { run: ++runs }
    }
  }

  @Controller('intercepted')
  @UseInterceptors(IdempotencyInterceptor)
  class InterceptedController {
    @Post()
    create() {
      return { run: ++runs }
    }
  }

  // In a module of its own: the interceptor's options come from the (global) idempotency module.
  @Module({ controllers: [InterceptedController] })
  class FeatureModule {}

  @Module({
    imports: [
      IdempotencyModule.forRootAsync({
        imports: [ConfigModule],
        inject: [CONFIG],
        useFactory: async (config: { store: MemoryStore }) => ({ ledger: new Ledger({ store: config.store }) }),
      }),
      FeatureModule,
    ],
    controllers: [OptInController],
  })
  class AppModule {}

  beforeAll(async () => {
    app = await start(platform, AppModule)
  })
  afterAll(() => app.close())

  it('leaves routes that did not opt in alone', async () => {
    const key = randomUUID()
    await send(`${app.url}/plain`, key)
    expect((await send(`${app.url}/plain`, key)).replayed).toBeNull()
    expect(store.acquired).toBe(0)
  })

  it.each(['/opted', '/intercepted'])('covers %s, opted in with @Idempotent() or @UseInterceptors (in another module)', async (path) => {
    const key = randomUUID()
    const before = runs
    const first = await send(app.url + path, key)
    expect(await send(app.url + path, key)).toEqual({ ...first, replayed: 'true' })
    expect(runs).toBe(before + 1)
  })
})
