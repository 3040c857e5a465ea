import { type DynamicModule, type FactoryProvider, Module, type ModuleMetadata, type Provider } from '@nestjs/common'
import { APP_INTERCEPTOR } from '@nestjs/core'
import { IdempotencyInterceptor } from './idempotency.interceptor.js'
import { IDEMPOTENCY_OPTIONS, type IdempotencyModuleOptions, type NestPlatformRequest } from './options.js'

/** Whether the module binds the interceptor to every route of the app. */
export interface IdempotencyModuleBinding {
  /**
   * Bind the interceptor to every route of the app (`APP_INTERCEPTOR`); routes opt out with
   * `@Idempotent(false)`. Without it, routes opt in with `@Idempotent()` or
   * `@UseInterceptors(IdempotencyInterceptor)`. @default false
   */
  global?: boolean
}

/** `forRootAsync`: options made by a factory, from providers of other modules (a config service, a pool). */
export interface IdempotencyModuleAsyncOptions<Req = NestPlatformRequest> extends IdempotencyModuleBinding {
  /** Modules whose providers the factory injects. */
  imports?: ModuleMetadata['imports']
  /** Tokens of the providers the factory receives, in order. */
  inject?: FactoryProvider['inject']
  /** Makes the options (the ledger above all); may be async. */
  // biome-ignore lint/suspicious/noExplicitAny: what Nest's own FactoryProvider takes
  useFactory: (...args: any[]) => IdempotencyModuleOptions<Req> | Promise<IdempotencyModuleOptions<Req>>
}

/**
 * The NestJS module. Its options and interceptor are visible to every module of the app (it is a
 * global module), so `@Idempotent()` and `@UseInterceptors(IdempotencyInterceptor)` work anywhere.
 *
 * @example
 * @Module({ imports: [IdempotencyModule.forRoot({ ledger, global: true })] })
 * export class AppModule {}
 */
@Module({})
// biome-ignore lint/complexity/noStaticOnlyClass: a NestJS dynamic module is a class with static factories
export class IdempotencyModule {
  /** With options at hand. */
  static forRoot<Req = NestPlatformRequest>(options: IdempotencyModuleOptions<Req> & IdempotencyModuleBinding): DynamicModule {
    const { global, ...engineOptions } = options
    return dynamicModule([{ provide: IDEMPOTENCY_OPTIONS, useValue: engineOptions }], global)
  }

  /**
   * With options made from other providers.
   *
   * @example
   * IdempotencyModule.forRootAsync({
   *   imports: [ConfigModule],
   *   inject: [ConfigService],
   *   useFactory: (config: ConfigService) => ({ ledger: new Ledger({ store: new PostgresStore({ pool: new Pool({ connectionString: config.get('DATABASE_URL') }) }) }) }),
   *   global: true,
   * })
   */
  static forRootAsync<Req = NestPlatformRequest>(options: IdempotencyModuleAsyncOptions<Req>): DynamicModule {
    const provider: FactoryProvider = { provide: IDEMPOTENCY_OPTIONS, useFactory: options.useFactory, inject: options.inject ?? [] }
    return { ...dynamicModule([provider], options.global), imports: options.imports ?? [] }
  }
}

function dynamicModule(providers: Provider[], global: boolean | undefined): DynamicModule {
  return {
    module: IdempotencyModule,
    global: true,
    providers: [...providers, IdempotencyInterceptor, ...(global ? [{ provide: APP_INTERCEPTOR, useClass: IdempotencyInterceptor }] : [])],
    exports: [IDEMPOTENCY_OPTIONS, IdempotencyInterceptor],
  }
}
