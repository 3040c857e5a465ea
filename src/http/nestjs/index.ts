/**
 * `idemkey/nestjs`: idempotency for NestJS on `@nestjs/platform-express` and `@nestjs/platform-fastify`:
 * a module (`IdempotencyModule.forRoot` / `forRootAsync`), an interceptor, and `@Idempotent()` for
 * per-route options.
 */
export type { IdempotencyContext, LedgerTransaction, Register, RegisteredContext, ReplayRequest, ReplayResponse } from '../types.js'
export { IdempotencyInterceptor } from './idempotency.interceptor.js'
export { IdempotencyModule, type IdempotencyModuleAsyncOptions, type IdempotencyModuleBinding } from './idempotency.module.js'
export { IdempotencyCtx, Idempotent } from './idempotent.decorator.js'
export {
  IDEMPOTENCY_OPTIONS,
  IDEMPOTENT_METADATA,
  type IdempotencyModuleOptions,
  type NestPlatformRequest,
  type RouteIdempotency,
} from './options.js'
