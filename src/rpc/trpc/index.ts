/**
 * tRPC mutations that take effect once per idempotency key (docs/rpc.md): `idempotent` wraps a
 * mutation's resolver; a retried call with the same key replays the first call's output, through the
 * router's transformer (superjson included), without running the resolver again.
 */
import { TRPCError } from '@trpc/server'
import { type Duration, runDurations } from '../../core/duration.js'
import type { IntentContext, Ledger } from '../../core/ledger.js'
import type { StoredResponse } from '../../core/store.js'
import { assertFunctions, assertMethods } from '../../core/validate.js'
import { IdempotencyError, isIdempotencyError } from '../../errors.js'
import { warnSharedScope } from '../../http/scope.js'
import { filePayload, formPayload } from '../form-payload.js'

/** What tRPC hands a resolver (the parts idemkey reads). */
export interface ResolverOptionsLike {
  ctx: unknown
  input: unknown
  path?: string | undefined
  signal?: AbortSignal | undefined
}

/** A tRPC transformer's value half (superjson, devalue, ...): what the router was created with. */
export interface TransformerLike {
  serialize(value: unknown): unknown
  deserialize(value: unknown): unknown
}

/** Options of {@link idempotent}. */
export interface IdempotentMutationOptions<O extends ResolverOptionsLike> {
  ledger: Ledger
  /**
   * The call's idempotency key: from the context (a header the context read, e.g.
   * `({ ctx }) => ctx.idempotencyKey`) or from an input field (`({ input }) => input.requestId`).
   * Return `undefined` to refuse the call (BAD_REQUEST), unless `optional` is set.
   */
  key: (opts: O) => string | undefined
  /** Run calls without a key as plain calls instead of refusing them. @default false */
  optional?: boolean
  /**
   * Namespace of the records, e.g. the caller's tenant from the context. One for every procedure: a key is
   * one intent, so the key of one procedure sent to another is refused, not run as a second call.
   * @default `trpc`, shared by every caller and procedure
   */
  scope?: (opts: O) => string
  /**
   * What must be equal for two calls with one key to be the same call, besides the procedure (always
   * compared). @default the input (through `transformer`, when given)
   */
  payload?: (opts: O) => unknown
  /** The router's transformer, so a replay returns what the first call returned (Dates, Maps, ...). @default JSON */
  transformer?: TransformerLike
  lease?: Duration
  ttl?: Duration
  wait?: Duration
}

const encoder = new TextEncoder()
const decoder = new TextDecoder()

/**
 * Wraps a mutation resolver: with a key, its output is recorded and replayed; the same key with
 * another input or on another procedure is a `UNPROCESSABLE_CONTENT` error (the call is not run); a
 * call while another with the same key still runs waits for it (up to `wait`), then replays it or gets
 * `CONFLICT` (retry later with the same key). A resolver that throws is released: a retry runs it again.
 * The resolver also receives `idempotency`, the ledger's context (`step` for durable steps, `signal`).
 *
 * @example
 * createOrder: t.procedure
 *   .input(orderInput)
 *   .mutation(idempotent({ ledger, key: ({ ctx }) => ctx.idempotencyKey, transformer: superjson },
 *     async ({ input }) => orders.create(input)))
 */
export function idempotent<O extends ResolverOptionsLike, R>(
  options: IdempotentMutationOptions<O>,
  resolver: (opts: O & { idempotency: IntentContext | undefined }) => Promise<R> | R,
): (opts: O) => Promise<R> {
  const ledger = options?.ledger
  if (!ledger || typeof ledger.run !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', 'idempotent({ ledger, key }, resolver) needs a Ledger: new Ledger({ store }).')
  }
  if (typeof options.key !== 'function') {
    throw new IdempotencyError('INVALID_OPTION', "idempotent({ ledger, key }, resolver) needs key: (opts) => the call's idempotency key.")
  }
  assertFunctions('idempotent() (idemkey/trpc)', { resolver, scope: options.scope, payload: options.payload }, { required: ['resolver'] })
  // The router's transformer (superjson): what each output is recorded and replayed through.
  assertMethods('idempotent() (idemkey/trpc)', 'transformer', options.transformer, ['serialize', 'deserialize'])
  if (options.scope === undefined) warnSharedScope('idempotent() (idemkey/trpc)', 'scope: ({ ctx }) => ctx.userId')
  const transformer = options.transformer
  // The output as tRPC puts it on the wire. Nothing (a mutation that returns undefined) is stored as no
  // bytes and replayed as undefined: tRPC leaves `data` out of such an answer, and `null` would differ.
  const encode = (value: R): StoredResponse => {
    const wire = transformer ? transformer.serialize(value) : value
    return {
      status: 200,
      headers: { 'content-type': 'application/json' },
      body: wire === undefined ? new Uint8Array(0) : encoder.encode(JSON.stringify(wire)),
    }
  }
  const decode = (response: StoredResponse): R => {
    const wire = response.body.length === 0 ? undefined : (JSON.parse(decoder.decode(response.body)) as unknown)
    return (transformer ? transformer.deserialize(wire) : wire) as R
  }
  // The input as the client sent it, through the transformer: a superjson Map or Set has no JSON of its
  // own, and the fingerprint refused it (every such call failed). A FormData or a file (tRPC 11's non-JSON
  // inputs) by its entries and bytes: to JSON every form was {}, so another form under the key replayed.
  const payloadOf = async (opts: O): Promise<unknown> => {
    if (options.payload) return options.payload(opts)
    const input = opts.input
    if (input instanceof FormData) return { form: await formPayload(input) }
    if (input instanceof Blob) return { file: await filePayload(input) }
    return (transformer ? transformer.serialize(input) : input) ?? null
  }
  const runOptions = {
    encode,
    decode,
    ...runDurations(options),
  }

  return async (opts: O): Promise<R> => {
    const key = options.key(opts)
    if (key === undefined || key === null || key === '') {
      if (options.optional) return resolver({ ...opts, idempotency: undefined })
      throw new TRPCError({
        code: 'BAD_REQUEST',
        message: `This mutation needs an idempotency key (${opts.path ?? 'procedure'}): send one, and the same one when you retry.`,
      })
    }
    const scope = options.scope ? options.scope(opts) : 'trpc'
    if (typeof scope !== 'string' || scope === '') {
      // A scope function that yields nothing (a session the context lacks) is a configuration error:
      // the ledger would have put the call in its default scope, shared by every such caller.
      throw new TRPCError({
        code: 'INTERNAL_SERVER_ERROR',
        message: `The idempotency scope of ${opts.path ?? 'this mutation'} came out empty for this call, so it was not run: scope must return a user or tenant id for every call.`,
      })
    }
    // The procedure too: a scope holds every procedure (a key is one intent), so one key sent to another
    // procedure with the same input is a mismatch, neither a replay of the first's output nor a second run.
    const payload = { procedure: opts.path ?? null, input: await payloadOf(opts) }
    let result: Awaited<ReturnType<typeof ledger.run<R>>>
    try {
      result = await ledger.run<R>({ key, scope, payload }, (ctx) => resolver({ ...opts, idempotency: ctx }), runOptions)
    } catch (error) {
      if (isIdempotencyError(error) && (error.code === 'KEY_INVALID' || error.code === 'SCOPE_INVALID')) {
        throw new TRPCError({ code: 'BAD_REQUEST', message: error.message, cause: error })
      }
      if (isIdempotencyError(error) && error.code === 'STORE_UNAVAILABLE') {
        throw new TRPCError({
          code: 'SERVICE_UNAVAILABLE',
          message: 'The idempotency store is unavailable, so this call was not run. Retry with the same key.',
          cause: error,
        })
      }
      throw error
    }
    switch (result.kind) {
      case 'executed':
      case 'replayed':
        return result.value
      case 'mismatch':
        throw new TRPCError({
          code: 'UNPROCESSABLE_CONTENT',
          message: `The idempotency key "${key}" was used before with another input, so this call was not run. A changed call is a new one: give it a new key.`,
        })
      case 'in_progress':
        throw new TRPCError({
          code: 'CONFLICT',
          message: `A call with the idempotency key "${key}" is still running. Retry with the same key in ${Math.ceil(result.retryAfterMs / 1_000)} s to get its result.`,
        })
    }
  }
}
