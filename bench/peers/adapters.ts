/**
 * The libraries of the peers bench, each wired in front of the same Express 4 endpoint as its own
 * documentation says (bench/peers/README.md says why each choice was made). An adapter builds an
 * Express app serving `POST /charges` from the shared kit; the server (server.ts) runs one per process.
 *
 * Peers are CommonJS packages without (or with partial) types: the little of each used here is
 * declared next to it.
 */
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)

// Express 4, as the peers were written for (the project's own tests use Express 5): the
// `express4` dev dependency is `npm:express@4`.
type Next = (error?: unknown) => void
type Req = IncomingMessage & { body?: unknown; path: string; originalUrl: string }
type Res = ServerResponse & {
  status(code: number): Res
  json(body: unknown): Res
  send(body: unknown): Res
  header(name: string, value: string): Res
}
type Handler = (req: Req, res: Res, next: Next) => unknown
type ErrorHandler = (error: unknown, req: Req, res: Res, next: Next) => unknown
export interface App {
  (req: IncomingMessage, res: ServerResponse): void
  use(...handlers: Array<Handler | ErrorHandler>): void
  post(path: string, ...handlers: Handler[]): void
}
interface Express {
  (): App
  json(): Handler
}
export const express = require('express4') as Express

/** The business logic every adapter puts in front of: one "charge", counted, answered 201 JSON. */
export interface Kit {
  /** Runs the charge for a parsed body; counts one execution. */
  charge(body: unknown): { id: string; amount: unknown }
  redisUrl: string
  postgresUrl: string
  sqliteDir: string
}

export interface Built {
  app: App
  close(): Promise<void>
}

export interface Adapter {
  name: string
  /** The row's label in the report, when not "library, store" from the name. */
  shown?: string
  /** Where the library keeps its records. */
  storage: 'none' | 'memory' | 'sqlite' | 'redis' | 'postgres'
  /** Packages whose versions the report prints. */
  packages: string[]
  build(kit: Kit): Promise<Built>
}

/** The plain route: run the charge, answer 201 with its JSON. */
function chargeRoute(kit: Kit): Handler {
  return (req, res) => {
    res.status(201).json(kit.charge(req.body))
  }
}

/** A typical JSON error handler: err.status, else a 4xx/5xx status already set, else 500. */
const errorHandler: ErrorHandler = (error, _req, res, next) => {
  if (res.headersSent) return next(error)
  const status = (error as { status?: number })?.status ?? (res.statusCode >= 400 ? res.statusCode : 500)
  res.status(status).json({ error: error instanceof Error ? error.message : String(error) })
}

const bare: Adapter = {
  name: 'bare',
  storage: 'none',
  packages: ['express4'],
  async build(kit) {
    const app = express()
    app.use(express.json())
    app.post('/charges', chargeRoute(kit))
    app.use(errorHandler)
    return { app, close: async () => {} }
  },
}

// ------------------------------------------------------------------------------------------- idemkey
// README "In your code" and docs/http.md "Express": body parser first, then the middleware on the
// route. Library defaults throughout (lease, wait, ttl, default scope); the server sets
// IDEMKEY_SCOPE_SECRET as a deployment would.
async function idemkeyApp(kit: Kit, store: import('idemkey').IdempotencyStore): Promise<Built> {
  const { Ledger } = await import('idemkey')
  const { idempotency } = await import('idemkey/express')
  const ledger = new Ledger({ store })
  const app = express()
  app.use(express.json())
  app.post('/charges', idempotency({ ledger }) as unknown as Handler, chargeRoute(kit))
  app.use(errorHandler)
  return { app, close: () => ledger.close() }
}

const idemkeyMemory: Adapter = {
  name: 'idemkey-memory',
  storage: 'memory',
  packages: ['express4'],
  async build(kit) {
    const { MemoryStore } = await import('idemkey/memory')
    return idemkeyApp(kit, new MemoryStore())
  },
}

const idemkeySqlite: Adapter = {
  name: 'idemkey-sqlite',
  storage: 'sqlite',
  packages: ['express4', 'better-sqlite3'],
  async build(kit) {
    const { SqliteStore } = await import('idemkey/sqlite')
    return idemkeyApp(kit, new SqliteStore({ path: `${kit.sqliteDir}/idemkey.db` }))
  },
}

/** The Redis prefix of idemkey's records in this bench: the runner deletes `peers-*` afterwards. */
export const IDEMKEY_REDIS_PREFIX = 'peers-idemkey'

const idemkeyRedis: Adapter = {
  name: 'idemkey-redis',
  storage: 'redis',
  packages: ['express4', 'ioredis'],
  async build(kit) {
    const { RedisStore } = await import('idemkey/redis')
    return idemkeyApp(kit, new RedisStore({ url: kit.redisUrl, prefix: IDEMKEY_REDIS_PREFIX }))
  },
}

/** The same store with its group commit off (`groupCommit: false`): one command per operation, as before it. */
const idemkeyRedisAlone: Adapter = {
  name: 'idemkey-redis-alone',
  shown: '**idemkey** (`groupCommit: false`), Redis',
  storage: 'redis',
  packages: ['express4', 'ioredis'],
  async build(kit) {
    const { RedisStore } = await import('idemkey/redis')
    return idemkeyApp(kit, new RedisStore({ url: kit.redisUrl, prefix: IDEMKEY_REDIS_PREFIX, groupCommit: false }))
  },
}

/**
 * The same store on the driver @node-idempotency and Powertools use: a node-redis client the app holds
 * (docs/redis.md), passed as `client`. The store's own client (`url`) is ioredis.
 */
const idemkeyRedisNode: Adapter = {
  name: 'idemkey-redis-node',
  shown: '**idemkey** (node-redis client), Redis',
  storage: 'redis',
  packages: ['express4', '@redis/client'],
  async build(kit) {
    const { RedisStore } = await import('idemkey/redis')
    const { createClient } = require('@redis/client') as {
      createClient(options: { url: string }): import('idemkey/redis').NodeRedisClientLike & { close(): Promise<unknown> }
    }
    const client = createClient({ url: kit.redisUrl })
    await client.connect()
    const built = await idemkeyApp(kit, new RedisStore({ client, prefix: IDEMKEY_REDIS_PREFIX }))
    return {
      app: built.app,
      close: async () => {
        await built.close()
        await client.close()
      },
    }
  },
}

/** idemkey's PostgreSQL table in this bench, apart from the test suites' default table; emptied afterwards. */
export const IDEMKEY_POSTGRES_TABLE = 'peers_idemkey_records'

const idemkeyPostgres: Adapter = {
  name: 'idemkey-postgres',
  storage: 'postgres',
  packages: ['express4', 'pg'],
  async build(kit) {
    const { PostgresStore } = await import('idemkey/postgres')
    const store = new PostgresStore({ connectionString: kit.postgresUrl, table: IDEMKEY_POSTGRES_TABLE })
    await store.migrate()
    return idemkeyApp(kit, store)
  },
}

// ---------------------------------------------------------------------------------- @node-idempotency
// The core README sends Express users to @node-idempotency/express, which is not on the npm registry
// (404), so this is a port of its middleware (packages/plugin-express/src/middleware.ts upstream):
// onRequest() before the route; a new key runs the route with res.send hooked to call onResponse()
// (not awaited, as upstream); a replay sends the stored status, Content-Type and body with
// Idempotent-Replayed: true; IdempotencyError codes map to 422, 400, 409 + Retry-After: 1. One
// deviation: errors that are not IdempotencyError (storage failures) go to next(err), where upstream
// drops them and leaves the request hanging.
interface NodeIdempotencyRequest {
  headers: IncomingMessage['headers']
  body: unknown
  path: string
  method: string
}
interface NodeIdempotencyResponse {
  body?: unknown
  error?: unknown
  additional?: { statusCode?: number; 'Content-Type'?: string }
}
interface NodeIdempotency {
  onRequest(req: NodeIdempotencyRequest): Promise<NodeIdempotencyResponse | undefined>
  onResponse(req: NodeIdempotencyRequest, res: NodeIdempotencyResponse): Promise<void>
}
type NodeIdempotencyCore = {
  Idempotency: new (storage: unknown, options?: object) => NodeIdempotency
  IdempotencyError: new (...args: never[]) => Error & { code: string }
}

const nodeIdempotencyStatus: Record<string, number> = {
  IDEMPOTENCY_FINGERPRINT_MISSMATCH: 422,
  IDEMPOTENCY_KEY_LEN_EXEEDED: 400,
  IDEMPOTENCY_KEY_MISSING: 400,
  REQUEST_IN_PROGRESS: 409,
}

function nodeIdempotencyApp(kit: Kit, storage: unknown): App {
  const { Idempotency, IdempotencyError } = require('@node-idempotency/core') as NodeIdempotencyCore
  const idempotency = new Idempotency(storage)
  const record = async (request: NodeIdempotencyRequest, res: Res, payload: unknown) => {
    const statusCode = res.statusCode
    const additional: NodeIdempotencyResponse['additional'] = { statusCode }
    const contentType = res.getHeader('content-type')
    if (contentType) additional['Content-Type'] = String(contentType)
    let body = payload
    if (String(contentType ?? '').includes('application/json') && typeof payload === 'string') {
      try {
        body = JSON.parse(payload)
      } catch {
        // As upstream: keep the text.
      }
    }
    await idempotency.onResponse(request, { additional, ...(statusCode < 400 ? { body } : { error: body }) })
  }
  const middleware: Handler = async (req, res, next) => {
    const request = { headers: req.headers, body: req.body, path: req.url ?? '/', method: req.method ?? 'GET' }
    try {
      const stored = await idempotency.onRequest(request)
      if (!stored) {
        const send = res.send.bind(res)
        res.send = (body: unknown) => {
          record(request, res, body).catch(() => {})
          return send(body)
        }
        return next()
      }
      if (stored.additional?.statusCode) res.status(stored.additional.statusCode)
      if (stored.additional?.['Content-Type']) res.header('Content-Type', stored.additional['Content-Type'])
      res.header('Idempotent-Replayed', 'true')
      if (stored.body) res.send(stored.body)
      else next(stored.error)
    } catch (error) {
      if (error instanceof IdempotencyError) {
        if (error.code === 'REQUEST_IN_PROGRESS') res.header('Retry-After', '1')
        res.status(nodeIdempotencyStatus[error.code] ?? 500)
      }
      next(error)
    }
  }
  const app = express()
  app.use(express.json())
  app.use(middleware)
  app.post('/charges', chargeRoute(kit))
  app.use(errorHandler)
  return app
}

const nodeIdempotencyMemory: Adapter = {
  name: 'node-idempotency-memory',
  storage: 'memory',
  packages: ['@node-idempotency/core', '@node-idempotency/storage-adapter-memory', 'express4'],
  async build(kit) {
    const { MemoryStorageAdapter } = require('@node-idempotency/storage-adapter-memory') as { MemoryStorageAdapter: new () => unknown }
    return { app: nodeIdempotencyApp(kit, new MemoryStorageAdapter()), close: async () => {} }
  },
}

const nodeIdempotencyRedis: Adapter = {
  name: 'node-idempotency-redis',
  storage: 'redis',
  packages: ['@node-idempotency/core', '@node-idempotency/storage-adapter-redis', 'express4'],
  async build(kit) {
    const { RedisStorageAdapter } = require('@node-idempotency/storage-adapter-redis') as {
      RedisStorageAdapter: new (options: { url: string }) => { connect(): Promise<void>; disconnect(): Promise<void> }
    }
    const storage = new RedisStorageAdapter({ url: kit.redisUrl })
    await storage.connect()
    return { app: nodeIdempotencyApp(kit, storage), close: () => storage.disconnect() }
  },
}

// ---------------------------------------------------------------------------------- express-idempotency
// Its README: app.use(idempotency({ dataAdapter })); the route returns early when the middleware has
// already answered (isHit), and reports a handler error with reportError before passing it on.
const expressIdempotencyRedis: Adapter = {
  name: 'express-idempotency-redis',
  storage: 'redis',
  packages: ['express-idempotency', 'express-idempotency-redis-adapter', 'express4'],
  async build(kit) {
    const { idempotency, getSharedIdempotencyService } = require('express-idempotency') as {
      idempotency(options: object): Handler
      getSharedIdempotencyService(): { isHit(req: Req): boolean; reportError(req: Req): Promise<void> }
    }
    const RedisAdapter = (
      require('express-idempotency-redis-adapter') as {
        default: new (options: object) => { connect(): Promise<void>; disconnect(): Promise<void> }
      }
    ).default
    const dataAdapter = new RedisAdapter({ connectionConfig: { url: kit.redisUrl } })
    await dataAdapter.connect()
    const app = express()
    app.use(express.json())
    app.use(idempotency({ dataAdapter }))
    app.post('/charges', async (req, res, next) => {
      const service = getSharedIdempotencyService()
      if (service.isHit(req)) return
      try {
        res.status(201).json(kit.charge(req.body))
      } catch (error) {
        await service.reportError(req).catch(() => {})
        next(error)
      }
    })
    app.use(errorHandler)
    return { app, close: () => dataAdapter.disconnect() }
  },
}

// ------------------------------------------------------------------------------------------ Powertools
// Powertools makes a function idempotent, not a route: the route turns the request into an event
// { method, path, headers, body }, calls the function made idempotent with makeIdempotent() (key from
// the Idempotency-Key header, its CachePersistenceLayer on node-redis), and sends its result. Outside
// Lambda there is no context: a stand-in gives the in-progress expiry (the remaining time) of 60 s.
const powertoolsRedis: Adapter = {
  name: 'powertools-redis',
  storage: 'redis',
  packages: ['@aws-lambda-powertools/idempotency', '@redis/client', 'express4'],
  async build(kit) {
    const { makeIdempotent, IdempotencyConfig } = require('@aws-lambda-powertools/idempotency') as {
      makeIdempotent<F>(fn: F, options: object): F
      IdempotencyConfig: new (options: object) => object
    }
    const { CachePersistenceLayer } = require('@aws-lambda-powertools/idempotency/cache') as {
      CachePersistenceLayer: new (options: { client: unknown }) => object
    }
    const { createClient } = require('@redis/client') as {
      createClient(options: { url: string }): { connect(): Promise<{ close(): Promise<void> }> }
    }
    const client = await createClient({ url: kit.redisUrl }).connect()
    const config = new IdempotencyConfig({ eventKeyJmesPath: 'headers."idempotency-key"' })
    type Event = { method?: string; path: string; headers: IncomingMessage['headers']; body: unknown }
    const createCharge = makeIdempotent(async (event: Event, _context?: object) => ({ statusCode: 201, body: kit.charge(event.body) }), {
      persistenceStore: new CachePersistenceLayer({ client }),
      config,
      keyPrefix: 'peers-powertools',
    })
    const lambdaContext = { getRemainingTimeInMillis: () => 60_000 }
    const statusFor: Record<string, number> = {
      IdempotencyAlreadyInProgressError: 409,
      IdempotencyValidationError: 422,
      IdempotencyKeyError: 400,
    }
    const app = express()
    app.use(express.json())
    app.post('/charges', async (req, res, next) => {
      try {
        const result = await createCharge({ method: req.method, path: req.path, headers: req.headers, body: req.body }, lambdaContext)
        res.status(result.statusCode).json(result.body)
      } catch (error) {
        const status = statusFor[(error as Error)?.name]
        if (status) Object.assign(error as Error, { status })
        next(error)
      }
    })
    app.use(errorHandler)
    return { app, close: () => client.close() }
  },
}

// --------------------------------------------------------------------------------------------- floors
// Not libraries: the least any middleware that records before and after the route can do on Redis,
// to tell how much of a library's cost is its own. A new key is one `SET key 'p' NX GET PX`, the answer
// one `SET key <status and body> PX` awaited before the response is sent (as idemkey does: an answer
// sent before its record is written lets a retry run the effect again); a replay sends the stored body.
// No fingerprint, fence, lease, scope, header capture or validation: the floor of item 5 of issue 27.
interface FloorClient {
  set(key: string, value: string, ...options: Array<string | number>): Promise<string | null>
  close(): Promise<unknown>
}

function floorApp(kit: Kit, client: FloorClient, awaitRecord: boolean): App {
  const middleware: Handler = async (req, res, next) => {
    const header = req.headers['idempotency-key']
    if (typeof header !== 'string' || header === '') return next()
    const key = `peers-floor:${header}`
    try {
      const prior = await client.set(key, 'p', 'NX', 'GET', 'PX', 86_400_000)
      if (prior === 'p') {
        res.status(409).header('Retry-After', '1')
        return res.json({ error: 'in progress' })
      }
      if (prior !== null) {
        const at = prior.indexOf('|')
        res.status(Number(prior.slice(0, at))).header('Content-Type', 'application/json; charset=utf-8')
        return res.send(prior.slice(at + 1))
      }
    } catch (error) {
      return next(error)
    }
    const json = res.json.bind(res)
    res.json = (body: unknown) => {
      const record = client.set(key, `${res.statusCode}|${JSON.stringify(body)}`, 'PX', 86_400_000)
      if (!awaitRecord) {
        record.catch(() => {})
        return json(body)
      }
      record.then(
        () => json(body),
        (error: unknown) => next(error),
      )
      return res
    }
    next()
  }
  const app = express()
  app.use(express.json())
  app.post('/charges', middleware, chargeRoute(kit))
  app.use(errorHandler)
  return app
}

/** The floor on ioredis, auto-pipelined and tuned as RedisStore opens its own client from a URL. */
const floorRedis: Adapter = {
  name: 'floor-redis',
  shown: 'floor: 2 SET awaited (ioredis), Redis',
  storage: 'redis',
  packages: ['express4', 'ioredis'],
  async build(kit) {
    const { Redis } = require('ioredis') as {
      Redis: new (url: string, options: object) => FloorClient & { quit(): Promise<unknown> }
    }
    const client = new Redis(kit.redisUrl, { maxRetriesPerRequest: 1, enableAutoPipelining: true })
    return {
      app: floorApp(kit, client, true),
      close: async () => {
        await client.quit()
      },
    }
  },
}

/** The floor on node-redis, the driver @node-idempotency uses, its record awaited or (as that peer does) not. */
function floorRedisNode(awaitRecord: boolean): Adapter {
  return {
    name: awaitRecord ? 'floor-redis-node' : 'floor-redis-node-early',
    shown: `floor: 2 SET${awaitRecord ? ' awaited' : ', answer first'} (node-redis), Redis`,
    storage: 'redis',
    packages: ['express4', '@redis/client'],
    async build(kit) {
      const { createClient } = require('@redis/client') as {
        createClient(options: { url: string }): {
          connect(): Promise<unknown>
          sendCommand(args: string[]): Promise<string | null>
          close(): Promise<unknown>
        }
      }
      const redis = createClient({ url: kit.redisUrl })
      await redis.connect()
      const client: FloorClient = {
        set: (key, value, ...options) => redis.sendCommand(['SET', key, value, ...options.map(String)]),
        close: () => redis.close(),
      }
      return {
        app: floorApp(kit, client, awaitRecord),
        close: async () => {
          await client.close()
        },
      }
    },
  }
}

export const ADAPTERS: Adapter[] = [
  bare,
  idemkeyMemory,
  idemkeySqlite,
  idemkeyRedis,
  idemkeyRedisNode,
  idemkeyRedisAlone,
  idemkeyPostgres,
  nodeIdempotencyMemory,
  nodeIdempotencyRedis,
  expressIdempotencyRedis,
  powertoolsRedis,
  floorRedis,
  floorRedisNode(true),
  floorRedisNode(false),
]

/** The charge, with its execution counter (what /__stats reports). */
export function makeCharge(): { charge: Kit['charge']; executions: () => number } {
  let executions = 0
  return {
    charge(body) {
      executions++
      return { id: `ch_${randomUUID()}`, amount: (body as { amount?: unknown } | undefined)?.amount }
    },
    executions: () => executions,
  }
}
