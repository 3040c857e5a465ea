/**
 * idemkey/trpc: a tRPC mutation wrapped with `idempotent` runs once per key, over tRPC's fetch adapter:
 * a retry replays the first output through the router's transformer (superjson: a Date stays a Date),
 * another input with the key is UNPROCESSABLE_CONTENT, a call while the first runs waits and replays,
 * a missing key is BAD_REQUEST, and the key can come from an input field instead of the context.
 */
import { randomUUID } from 'node:crypto'
import { initTRPC } from '@trpc/server'
import { fetchRequestHandler } from '@trpc/server/adapters/fetch'
import superjson from 'superjson'
import { MemoryStore } from '../../backends/memory/memory-store.js'
import { Ledger } from '../../core/ledger.js'
import { idempotent } from './index.js'

interface Context {
  idempotencyKey: string | undefined
  tenant: string
}

const t = initTRPC.context<Context>().create({ transformer: superjson })
const ledger = new Ledger({ store: new MemoryStore(), wait: '2s' })
let runs = 0
let release: () => void = () => {}

const router = t.router({
  createOrder: t.procedure
    .input((raw) => raw as { sku: string; qty: number; slow?: boolean })
    .mutation(
      idempotent(
        { ledger, key: ({ ctx }) => ctx.idempotencyKey, scope: ({ ctx }) => ctx.tenant, transformer: superjson },
        async ({ input }) => {
          runs++
          if (input.slow) await new Promise<void>((resolve) => (release = resolve))
          return { id: `order-${runs}`, sku: input.sku, at: new Date(Date.UTC(2026, 10, 25)), qty: input.qty }
        },
      ),
    ),
  fillCart: t.procedure
    .input((raw) => raw as { lines: Map<string, number>; gifts: Set<string> })
    .mutation(
      idempotent(
        { ledger, key: ({ ctx }) => ctx.idempotencyKey, scope: ({ ctx }) => ctx.tenant, transformer: superjson },
        async ({ input }) => ({ cart: ++runs, lines: input.lines, gifts: input.gifts.size }),
      ),
    ),
  archive: t.procedure
    .input((raw) => raw as { id: string })
    .mutation(
      idempotent({ ledger, key: ({ ctx }) => ctx.idempotencyKey, scope: ({ ctx }) => ctx.tenant }, async ({ input }) => ({
        archived: input.id,
        n: ++runs,
      })),
    ),
  remove: t.procedure
    .input((raw) => raw as { id: string })
    .mutation(
      idempotent({ ledger, key: ({ ctx }) => ctx.idempotencyKey, scope: ({ ctx }) => ctx.tenant }, async ({ input }) => ({
        removed: input.id,
        n: ++runs,
      })),
    ),
  // A scope that reads a field the context does not set (a session that is missing, a renamed field).
  profile: t.procedure
    .input((raw) => raw as { bio: string })
    .mutation(
      idempotent(
        { ledger, key: ({ ctx }) => ctx.idempotencyKey, scope: ({ ctx }) => (ctx as Context & { userId?: string }).userId as string },
        async ({ input }) => ({ saved: input.bio, n: ++runs }),
      ),
    ),
  pay: t.procedure
    .input((raw) => raw as { requestId: string; amount: number })
    .mutation(idempotent({ ledger, key: ({ input }) => input.requestId }, async ({ input }) => ({ paid: input.amount, n: ++runs }))),
})

/** One call through tRPC's fetch adapter, as a client's POST would arrive. */
async function call(path: string, input: unknown, headers: Record<string, string> = {}) {
  const request = new Request(`http://api/trpc/${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(superjson.serialize(input)),
  })
  const response = await fetchRequestHandler({
    endpoint: '/trpc',
    req: request,
    router,
    createContext: ({ req }) => ({
      idempotencyKey: req.headers.get('idempotency-key') ?? undefined,
      tenant: req.headers.get('x-tenant') ?? 'a',
    }),
  })
  const body = (await response.json()) as { result?: { data: unknown }; error?: { json: { message: string; data: { code: string } } } }
  return {
    status: response.status,
    data: body.result ? superjson.deserialize(body.result.data as never) : undefined,
    error: body.error?.json,
  }
}

describe('idemkey/trpc without a scope', () => {
  it('warns that every caller shares one scope, and not when a scope is given', async () => {
    vi.resetModules()
    const warned = vi.spyOn(process, 'emitWarning').mockImplementation(() => {})
    try {
      const fresh = await import('./index.js')
      const ledger = new Ledger({ store: new MemoryStore() })
      fresh.idempotent({ ledger, key: () => 'k', scope: () => 'tenant' }, () => 1)
      expect(warned).not.toHaveBeenCalled()
      fresh.idempotent({ ledger, key: () => 'k' }, () => 1)
      expect(warned.mock.calls.map((call) => call[1])).toEqual([{ code: 'IDEMKEY_SHARED_SCOPE' }])
      expect(String(warned.mock.calls[0]?.[0])).toMatch(/^idempotent\(\) \(idemkey\/trpc\) was given no scope/)
    } finally {
      warned.mockRestore()
    }
  })
})

describe('idemkey/trpc: options checked when made', () => {
  it("refuses a scope or payload that is no function, and a resolver that is none (a JavaScript app's scope: 'tenant' failed every call)", () => {
    expect(() => idempotent({ ledger, key: () => 'k', scope: 'tenant' as never }, () => 1)).toThrow(
      expect.objectContaining({
        code: 'INVALID_OPTION',
        message: expect.stringContaining('idempotent() (idemkey/trpc): scope must be a function'),
      }),
    )
    expect(() => idempotent({ ledger, key: () => 'k', scope: () => 't', payload: 'input' as never }, () => 1)).toThrow(
      'payload must be a function',
    )
    expect(() => idempotent({ ledger, key: () => 'k', scope: () => 't' }, undefined as never)).toThrow('resolver must be a function')
    // A transformer given as its name, or a data transformer without both halves: every call failed.
    expect(() => idempotent({ ledger, key: () => 'k', scope: () => 't', transformer: 'superjson' as never }, () => 1)).toThrow(
      'transformer must be an object with serialize(), deserialize()',
    )
    expect(() => idempotent({ ledger, key: () => 'k', scope: () => 't', transformer: superjson }, () => 1)).not.toThrow()
  })
})

describe('idemkey/trpc: idempotent mutations', () => {
  it('replays the first output to a retry with the same key, through the transformer (a Date stays a Date), without running again', async () => {
    const key = randomUUID()
    const before = runs
    const first = await call('createOrder', { sku: 'A', qty: 2 }, { 'idempotency-key': key })
    const retry = await call('createOrder', { sku: 'A', qty: 2 }, { 'idempotency-key': key })
    expect(first.status).toBe(200)
    expect(retry.data).toEqual(first.data)
    expect((retry.data as { at: unknown }).at).toBeInstanceOf(Date)
    expect(runs - before).toBe(1)
  })

  it('refuses the same key with another input as UNPROCESSABLE_CONTENT, and keeps tenants apart', async () => {
    const key = randomUUID()
    await call('createOrder', { sku: 'A', qty: 1 }, { 'idempotency-key': key })
    const other = await call('createOrder', { sku: 'B', qty: 1 }, { 'idempotency-key': key })
    expect(other.status).toBe(422)
    expect(other.error?.data.code).toBe('UNPROCESSABLE_CONTENT')
    const otherTenant = await call('createOrder', { sku: 'B', qty: 1 }, { 'idempotency-key': key, 'x-tenant': 'b' })
    expect(otherTenant.status).toBe(200)
  })

  it('makes a call with the key of one still running wait for it, then replays its output', async () => {
    const key = randomUUID()
    const before = runs
    const first = call('createOrder', { sku: 'C', qty: 1, slow: true }, { 'idempotency-key': key })
    await new Promise((resolve) => setTimeout(resolve, 50))
    const second = call('createOrder', { sku: 'C', qty: 1, slow: true }, { 'idempotency-key': key })
    await new Promise((resolve) => setTimeout(resolve, 50))
    release()
    const [a, b] = await Promise.all([first, second])
    expect(b.data).toEqual(a.data)
    expect(runs - before).toBe(1)
  })

  it('takes an input the transformer carries (a Map, a Set): replayed to the retry, refused with other entries (every such call failed with INVALID_ARGUMENT)', async () => {
    const key = randomUUID()
    const before = runs
    const cart = (qty: number) => ({ lines: new Map([['sku-1', qty]]), gifts: new Set(['card']) })
    const first = await call('fillCart', cart(2), { 'idempotency-key': key })
    expect(first.status).toBe(200)
    const retry = await call('fillCart', cart(2), { 'idempotency-key': key })
    expect(retry.data).toEqual(first.data)
    expect((retry.data as { lines: unknown }).lines).toEqual(new Map([['sku-1', 2]]))
    expect(runs - before).toBe(1)
    const other = await call('fillCart', cart(3), { 'idempotency-key': key })
    expect(other.status).toBe(422)
    expect(runs - before).toBe(1)
  })

  it("refuses the key with the same input on another procedure of the scope as UNPROCESSABLE_CONTENT (it replayed the first procedure's output, and the second never ran)", async () => {
    const key = randomUUID()
    const before = runs
    const archived = await call('archive', { id: 'doc-1' }, { 'idempotency-key': key })
    expect(archived.data).toMatchObject({ archived: 'doc-1' })
    const removed = await call('remove', { id: 'doc-1' }, { 'idempotency-key': key })
    expect(removed.status).toBe(422)
    expect(removed.error?.data.code).toBe('UNPROCESSABLE_CONTENT')
    expect(runs - before).toBe(1)
    expect((await call('archive', { id: 'doc-1' }, { 'idempotency-key': key })).data).toEqual(archived.data)
  })

  it("refuses a call whose scope function yields nothing as INTERNAL_SERVER_ERROR, not run (it fell back to a scope shared by every such caller, and replayed one caller's output to another)", async () => {
    const key = randomUUID()
    const before = runs
    const alice = await call('profile', { bio: 'hi' }, { 'idempotency-key': key, 'x-tenant': 'alice' })
    const bob = await call('profile', { bio: 'hi' }, { 'idempotency-key': key, 'x-tenant': 'bob' })
    for (const answer of [alice, bob]) {
      expect(answer.status).toBe(500)
      expect(answer.error?.data.code).toBe('INTERNAL_SERVER_ERROR')
      expect(answer.error?.message).toMatch(/scope/)
    }
    expect(runs - before).toBe(0)
  })

  it('refuses a call without a key as BAD_REQUEST, and takes the key from an input field when told to', async () => {
    const missing = await call('createOrder', { sku: 'D', qty: 1 })
    expect(missing.status).toBe(400)
    expect(missing.error?.message).toMatch(/needs an idempotency key/)
    const requestId = randomUUID()
    const a = await call('pay', { requestId, amount: 5 })
    const b = await call('pay', { requestId, amount: 5 })
    expect(b.data).toEqual(a.data)
  })
})

describe('idemkey/trpc: a router without a transformer', () => {
  const plain = initTRPC.context<Context>().create()
  let forgotten = 0
  const plainRouter = plain.router({
    forget: plain.procedure
      .input((raw) => raw as { id: string })
      .mutation(
        idempotent({ ledger, key: ({ ctx }) => ctx.idempotencyKey, scope: ({ ctx }) => ctx.tenant }, async () => {
          forgotten++
        }),
      ),
  })
  const send = async (key: string) => {
    const response = await fetchRequestHandler({
      endpoint: '/trpc',
      req: new Request('http://api/trpc/forget', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ id: 'x' }),
      }),
      router: plainRouter,
      createContext: ({ req }) => ({ idempotencyKey: req.headers.get('idempotency-key') ?? undefined, tenant: 'a' }),
    })
    return { status: response.status, body: await response.text() }
  }

  it('replays a mutation that returns nothing as nothing, the same bytes as the first answer (the replay said null)', async () => {
    const key = randomUUID()
    const first = await send(key)
    const retry = await send(key)
    expect(first.status).toBe(200)
    expect(retry).toEqual(first)
    expect(forgotten).toBe(1)
  })
})

describe('idemkey/trpc: a FormData input (tRPC 11 non-JSON inputs)', () => {
  const forms = initTRPC.context<Context>().create()
  let avatars = 0
  const formRouter = forms.router({
    setAvatar: forms.procedure
      .input((raw) => {
        if (!(raw instanceof FormData)) throw new Error('a form is expected')
        return raw
      })
      .mutation(
        idempotent({ ledger, key: ({ ctx }) => ctx.idempotencyKey, scope: ({ ctx }) => ctx.tenant }, async ({ input }) => ({
          avatar: ++avatars,
          bytes: ((input.get('image') as File | null)?.size ?? 0) + String(input.get('alt')).length,
        })),
      ),
  })
  const send = async (key: string, alt: string, image: string) => {
    const body = new FormData()
    body.append('alt', alt)
    body.append('image', new File([image], 'me.png', { type: 'image/png' }))
    const response = await fetchRequestHandler({
      endpoint: '/trpc',
      req: new Request('http://api/trpc/setAvatar', { method: 'POST', headers: { 'idempotency-key': key }, body }),
      router: formRouter,
      createContext: ({ req }) => ({ idempotencyKey: req.headers.get('idempotency-key') ?? undefined, tenant: 'a' }),
    })
    return { status: response.status, body: (await response.json()) as { result?: { data: unknown }; error?: { data: { code: string } } } }
  }

  it("tells forms apart by their fields and files' bytes: the same key with another form is refused, the same form replayed (every form was {} to the fingerprint)", async () => {
    const key = randomUUID()
    const first = await send(key, 'me', 'png-1')
    expect(first.body.result?.data).toEqual({ avatar: 1, bytes: 7 })
    expect((await send(key, 'me', 'png-1')).body.result?.data).toEqual({ avatar: 1, bytes: 7 })
    const otherField = await send(key, 'you', 'png-1')
    expect(otherField.status).toBe(422)
    const otherFile = await send(key, 'me', 'png-2')
    expect(otherFile.status).toBe(422)
    expect(avatars).toBe(1)
  })
})
