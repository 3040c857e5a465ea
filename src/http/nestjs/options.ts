import type { Request as ExpressRequest } from 'express'
import type { FastifyRequest } from 'fastify'
import type { EngineOptions } from '../types.js'

/**
 * The request the scope function receives: the platform's own, as NestJS hands it to `@Req()`:
 * Express's `req` on `@nestjs/platform-express`, Fastify's `request` on `@nestjs/platform-fastify`.
 * Name yours to type it: `IdempotencyModule.forRoot<FastifyRequest>({ … })`.
 */
export type NestPlatformRequest = ExpressRequest | FastifyRequest

/** Options of the module and the interceptor: the engine's, plus what NestJS needs. */
export interface IdempotencyModuleOptions<Req = NestPlatformRequest> extends EngineOptions<Req> {
  /**
   * How long to wait for a response to end after the client went away, before the record is
   * released. @default 30_000
   */
  abandonAfterMs?: number
}

/** Per route or controller, through `@Idempotent(…)`: `false` leaves it alone, an object overrides any option but the ledger. */
export type RouteIdempotency = false | Partial<Omit<IdempotencyModuleOptions, 'ledger'>>

/** The injection token of the module's options (what `forRoot` was given, or `forRootAsync`'s factory made). */
export const IDEMPOTENCY_OPTIONS = Symbol.for('idemkey:nestjs:options')

/** The metadata key `@Idempotent()` sets, read with Nest's `Reflector`. */
export const IDEMPOTENT_METADATA = 'idemkey:idempotent'
