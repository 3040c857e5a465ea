import { applyDecorators, createParamDecorator, type ExecutionContext, SetMetadata, UseInterceptors } from '@nestjs/common'
import { checkRouteOptions } from '../engine-config.js'
import { abandonAfter } from '../node-response.js'
import type { RegisteredContext } from '../types.js'
import { IdempotencyInterceptor } from './idempotency.interceptor.js'
import { IDEMPOTENT_METADATA, type RouteIdempotency } from './options.js'

/**
 * Makes a route (or every route of a controller) idempotent, with options of its own:
 * `@Idempotent({ required: true })`. `@Idempotent(false)` leaves it alone, also under a global
 * interceptor. The options override the module's, except the ledger. It binds the interceptor itself,
 * so it works without `global: true`; with it, the request is still handled once.
 *
 * @example
 * @Post('charges')
 * @Idempotent({ required: true })
 * create(@Body() body: ChargeDto) { return this.charges.create(body) }
 */
export function Idempotent(options: RouteIdempotency = {}): MethodDecorator & ClassDecorator {
  if (options === false) return SetMetadata(IDEMPOTENT_METADATA, false)
  checkRouteOptions(options)
  abandonAfter(options.abandonAfterMs)
  return applyDecorators(SetMetadata(IDEMPOTENT_METADATA, options), UseInterceptors(IdempotencyInterceptor)) as MethodDecorator &
    ClassDecorator
}

/**
 * The idempotency context of the request a handler serves (key, scope, fencing token, takeover flag,
 * lease signal), or `undefined` when the layer does not cover it.
 *
 * @example
 * @Post('charges')
 * create(@Body() body: ChargeDto, @IdempotencyCtx() ctx?: RegisteredContext) { … }
 */
export const IdempotencyCtx: () => ParameterDecorator = createParamDecorator(
  (_data: unknown, context: ExecutionContext): RegisteredContext | undefined =>
    context.switchToHttp().getRequest<{ idempotency?: RegisteredContext }>().idempotency,
)
