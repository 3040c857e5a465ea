/**
 * Type-level tests, checked by `tsc` (npm run typecheck): each adapter takes the types of the app and
 * route it is mounted on, and never narrows them. Nothing here runs.
 */
import express, { type Request as ExpressRequest } from 'express'
import Fastify, { type FastifyBaseLogger, type FastifyRequest, type FastifyTypeProvider } from 'fastify'
import { Hono } from 'hono'
import { validator } from 'hono/validator'
import Koa from 'koa'
import type { ParsedQs } from 'qs'
import { expectTypeOf } from 'vitest'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotency as expressIdempotency } from '../src/http/express/index.js'
import { idempotency as fastifyIdempotency } from '../src/http/fastify/index.js'
import { getIdempotency, withIdempotency } from '../src/http/fetch/index.js'
import { idempotency as honoIdempotency, type IdempotencyVariables } from '../src/http/hono/index.js'
import { type IdempotencyState, idempotency as koaIdempotency } from '../src/http/koa/index.js'
import { IdempotencyModule } from '../src/http/nestjs/index.js'
import type { IdempotencyContext, ReplayRequest, ReplayResponse } from '../src/http/types.js'

const ledger = new Ledger({ store: new MemoryStore() })
const charge = (amount: number) => ({ id: 'ch_1', amount })

// Express: the middleware is a RequestHandler for whatever route it is on.
const app = express()
// The README's own example: req.body stays what Express makes it (any), not unknown.
app.post('/charges', express.json(), expressIdempotency({ ledger }), (req, res) => {
  expectTypeOf(req.body).toBeAny()
  res.json(charge(req.body.amount))
})
app.post('/charges/:id', expressIdempotency({ ledger, scope: (req) => req.get('x-tenant') }), (req, res) => {
  expectTypeOf(req.params).toEqualTypeOf<{ id: string }>()
  expectTypeOf(req.query).toEqualTypeOf<ParsedQs>()
  expectTypeOf(req.idempotency).toEqualTypeOf<IdempotencyContext | undefined>()
  res.json(charge(Number(req.params.id)))
})
app.post('/locals/:id', expressIdempotency({ ledger }), (req, res: express.Response<{ ok: boolean }, { user: string }>) => {
  expectTypeOf(req.params).toEqualTypeOf<{ id: string }>()
  expectTypeOf(res.locals.user).toEqualTypeOf<string>()
  res.json({ ok: true })
})
app.post<'/typed/:id', { id: string }, { ok: boolean }, { amount: number }>('/typed/:id', expressIdempotency({ ledger }), (req, res) => {
  expectTypeOf(req.body).toEqualTypeOf<{ amount: number }>()
  res.json({ ok: req.body.amount > 0 })
})
app.use(expressIdempotency({ ledger }))
express.Router().use('/v1', expressIdempotency({ ledger }))
expressIdempotency({ ledger, scope: (req) => expectTypeOf(req).toEqualTypeOf<ExpressRequest>() as never })

// Fastify: registers on instances with type providers, other servers and loggers.
interface Provider extends FastifyTypeProvider {
  validator: this['schema'] extends { type: 'object' } ? { amount: number } : unknown
  serializer: this['schema'] extends { type: 'object' } ? { id: string } : unknown
}
const f = Fastify().withTypeProvider<Provider>()
await f.register(fastifyIdempotency, { ledger, keyHeader: 'X-Idempotency-Key', scope: (request) => request.headers['x-tenant'] as string })
f.post('/charges', { schema: { body: { type: 'object' } }, config: { idempotency: { required: true } } }, async (request) => {
  expectTypeOf(request.body).toEqualTypeOf<{ amount: number }>()
  expectTypeOf(request.idempotency).toEqualTypeOf<IdempotencyContext | undefined>()
})
await Fastify({ http2: true }).register(fastifyIdempotency, { ledger })
await Fastify({ loggerInstance: {} as FastifyBaseLogger & { extra: true } }).register(fastifyIdempotency, { ledger })
await f.register(async (child) => {
  await child.register(fastifyIdempotency, { ledger, scope: (request) => expectTypeOf(request).toEqualTypeOf<FastifyRequest>() as never })
})

// Hono: the app's Env, path parameters and validated input reach the handler; scope can take the Env.
type Env = { Bindings: { DB: string }; Variables: { user: { id: string } } & IdempotencyVariables }
const h = new Hono<Env>()
h.post(
  '/charges/:id',
  honoIdempotency<Env>({ ledger, scope: (c) => c.get('user').id }),
  validator('json', () => ({ amount: 1 })),
  async (c) => {
    expectTypeOf(c.req.param('id')).toEqualTypeOf<string>()
    expectTypeOf(c.env.DB).toEqualTypeOf<string>()
    expectTypeOf(c.get('user')).toEqualTypeOf<{ id: string }>()
    expectTypeOf(c.req.valid('json')).toEqualTypeOf<{ amount: number }>()
    expectTypeOf(c.get('idempotency')).toEqualTypeOf<IdempotencyContext | undefined>()
    return c.json({ ok: true }, 201)
  },
)
h.post(
  '/validated',
  validator('json', () => ({ amount: 1 })),
  honoIdempotency({ ledger }),
  async (c) => {
    expectTypeOf(c.req.valid('json')).toEqualTypeOf<{ amount: number }>()
    return c.text('x')
  },
)

// fetch: a subclass of Request (Next.js's NextRequest) and a typed route context pass through.
class NextRequest extends Request {
  nextUrl = new URL('http://localhost')
}
const POST = withIdempotency(
  ledger,
  async (request: NextRequest, route: { params: Promise<{ id: string }> }) => {
    expectTypeOf(request.nextUrl).toEqualTypeOf<URL>()
    expectTypeOf(getIdempotency(request)).toEqualTypeOf<IdempotencyContext | undefined>()
    return Response.json({ id: (await route.params).id })
  },
  { scope: (request) => request.nextUrl.hostname },
)
expectTypeOf(POST).toEqualTypeOf<(request: NextRequest, route: { params: Promise<{ id: string }> }) => Promise<Response>>()
expectTypeOf(withIdempotency(ledger, async (request) => Response.json(await request.json()))).toEqualTypeOf<
  (request: Request) => Promise<Response>
>()

// Koa: the app's state and context types stay as they are, through chained use() too.
type State = { user: { id: string } } & IdempotencyState
type Context = { requestId: string }
const k = new Koa<State, Context>()
k.use(koaIdempotency<Koa.ParameterizedContext<State, Context>>({ ledger, scope: (ctx) => ctx.state.user.id + ctx.requestId }))
  .use(koaIdempotency({ ledger }))
  .use(async (ctx) => {
    expectTypeOf(ctx.state.user).toEqualTypeOf<{ id: string }>()
    expectTypeOf(ctx.state.idempotency).toEqualTypeOf<IdempotencyContext | undefined>()
    expectTypeOf(ctx.requestId).toEqualTypeOf<string>()
  })

// NestJS: the scope function takes the platform's request, or the one named.
IdempotencyModule.forRoot({ ledger, global: true, scope: (req) => req.headers['x-tenant'] as string })
IdempotencyModule.forRoot<FastifyRequest>({ ledger, scope: (request) => expectTypeOf(request).toEqualTypeOf<FastifyRequest>() as never })
IdempotencyModule.forRootAsync({
  inject: ['CONFIG'],
  useFactory: async (config: { url: string }) => ({ ledger, problemBaseUrl: config.url }),
})

// The hooks every adapter shares.
expressIdempotency({
  ledger,
  onReplay: (request, response) => {
    expectTypeOf(request).toEqualTypeOf<ReplayRequest>()
    expectTypeOf(response).toEqualTypeOf<ReplayResponse>()
    response.headers['x-replayed-key'] = request.key
    // @ts-expect-error a replay's body is what was stored
    response.body = new Uint8Array()
  },
})
