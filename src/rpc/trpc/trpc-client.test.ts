/**
 * idemkey/trpc through tRPC's own client over HTTP (`httpLink` and `httpBatchLink` against a standalone
 * server): a key is one intent. With the default scope, the key of one mutation sent to another procedure is
 * refused UNPROCESSABLE_CONTENT and not run, whether the two calls go one per request or in one batch.
 */
import { randomUUID } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import { createTRPCClient, httpBatchLink, httpLink, TRPCClientError } from '@trpc/client'
import { initTRPC } from '@trpc/server'
import { createHTTPServer } from '@trpc/server/adapters/standalone'
import { MemoryStore } from '../../backends/memory/memory-store.js'
import { Ledger } from '../../core/ledger.js'
import { idempotent } from './index.js'

interface Context {
  idempotencyKey: string | undefined
}

const t = initTRPC.context<Context>().create()
const ledger = new Ledger({ store: new MemoryStore(), wait: '2s' })
const ran: string[] = []
// No `scope`: the default one is what this file pins (the warning it prints is tested in trpc.test.ts).
const keyed = <R>(resolver: (opts: { input: { id: string }; path?: string }) => R) =>
  idempotent({ ledger, key: ({ ctx }: { ctx: Context; input: { id: string } }) => ctx.idempotencyKey }, resolver)

const router = t.router({
  archive: t.procedure
    .input((raw) => raw as { id: string })
    .mutation(
      keyed(({ input }) => {
        ran.push(`archive ${input.id}`)
        return { archived: input.id }
      }),
    ),
  remove: t.procedure
    .input((raw) => raw as { id: string })
    .mutation(
      keyed(({ input }) => {
        ran.push(`remove ${input.id}`)
        return { removed: input.id }
      }),
    ),
})

let key = ''
let url = ''
const server = createHTTPServer({
  router,
  createContext: ({ req }) => ({ idempotencyKey: (req.headers['idempotency-key'] as string | undefined) ?? undefined }),
})

beforeAll(async () => {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()))
})
beforeEach(() => {
  key = randomUUID()
  ran.length = 0
})

const links = {
  httpLink: () => httpLink({ url, headers: () => ({ 'idempotency-key': key }) }),
  httpBatchLink: () => httpBatchLink({ url, headers: () => ({ 'idempotency-key': key }) }),
}

/** The tRPC error code a call was refused with, or its output. */
async function settle<R>(call: Promise<R>): Promise<R | { refused: string | undefined }> {
  try {
    return await call
  } catch (error) {
    const code = error instanceof TRPCClientError ? (error.data as { code?: string } | undefined)?.code : undefined
    if (code) return { refused: code }
    throw error
  }
}

describe.each(Object.keys(links) as (keyof typeof links)[])('idemkey/trpc over %s, default scope', (link) => {
  let client: ReturnType<typeof createTRPCClient<typeof router>>
  beforeAll(() => {
    client = createTRPCClient<typeof router>({ links: [links[link]()] })
  })

  it('refuses the key of one procedure sent to another as UNPROCESSABLE_CONTENT, one call after the other (both ran)', async () => {
    expect(await settle(client.archive.mutate({ id: 'doc-1' }))).toEqual({ archived: 'doc-1' })
    expect(await settle(client.remove.mutate({ id: 'doc-1' }))).toEqual({ refused: 'UNPROCESSABLE_CONTENT' })
    expect(await settle(client.archive.mutate({ id: 'doc-1' }))).toEqual({ archived: 'doc-1' })
    expect(ran).toEqual(['archive doc-1'])
  })

  it('runs one of two procedures sent together with one key, and refuses the other as UNPROCESSABLE_CONTENT (both ran)', async () => {
    const answers = await Promise.all([settle(client.archive.mutate({ id: 'doc-2' })), settle(client.remove.mutate({ id: 'doc-2' }))])
    expect(ran).toHaveLength(1)
    const refused = answers.filter((answer) => 'refused' in answer)
    expect(refused).toEqual([{ refused: 'UNPROCESSABLE_CONTENT' }])
  })

  it('replays to a second identical call sent with the key, not run again', async () => {
    const answers = await Promise.all([settle(client.archive.mutate({ id: 'doc-3' })), settle(client.archive.mutate({ id: 'doc-3' }))])
    expect(answers).toEqual([{ archived: 'doc-3' }, { archived: 'doc-3' }])
    expect(ran).toEqual(['archive doc-3'])
  })
})
