/**
 * idemkey/graphql: the Envelop plugin in a real GraphQL Yoga server. A mutation sent with a key runs once;
 * a retry gets the first result (marked replayed); the same key with other variables or another
 * operation is refused (422, IDEMPOTENCY_KEY_REUSED); a mutation whose resolver failed is released so
 * the retry runs; queries and keyless mutations pass through; the key may come in extensions.
 */
import { randomUUID } from 'node:crypto'
import { createSchema, createYoga, type Plugin, useExecutionCancellation } from 'graphql-yoga'
import { MemoryStore } from '../../backends/memory/memory-store.js'
import { Ledger } from '../../core/ledger.js'
import { IdempotencyError } from '../../errors.js'
import { apolloIdempotency, useIdempotency } from './index.js'

let charges = 0
let failNext = false
const schema = createSchema({
  typeDefs: `
    type Charge { id: ID!, amount: Int! }
    type Query { charges: Int! }
    type Mutation { charge(amount: Int!): Charge! }`,
  resolvers: {
    Query: { charges: () => charges },
    Mutation: {
      charge: (_: unknown, { amount }: { amount: number }) => {
        if (failNext) {
          failNext = false
          throw new Error('the bank timed out')
        }
        return { id: `ch_${++charges}`, amount }
      },
    },
  },
})
const ledger = new Ledger({ store: new MemoryStore() })
const yoga = createYoga({ schema, plugins: [useIdempotency({ ledger, scopeSecret: 'graphql-test-secret' })], logging: false })

async function send(
  query: string,
  variables: Record<string, unknown>,
  key?: string,
  extensions?: Record<string, unknown>,
  authorization?: string,
) {
  const response = await yoga.fetch('http://yoga/graphql', {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(key ? { 'idempotency-key': key } : {}),
      ...(authorization ? { authorization } : {}),
    },
    body: JSON.stringify({ query, variables, ...(extensions ? { extensions } : {}) }),
  })
  return {
    status: response.status,
    body: (await response.json()) as {
      data?: { charge?: { id: string } }
      errors?: Array<{ extensions?: { code?: string } }>
      extensions?: unknown
    },
  }
}
const CHARGE = 'mutation Charge($amount: Int!) { charge(amount: $amount) { id amount } }'

describe('idemkey/graphql: the Envelop plugin in GraphQL Yoga', () => {
  it('runs a keyed mutation once and replays its result to the retry, marked replayed', async () => {
    const key = randomUUID()
    const before = charges
    const first = await send(CHARGE, { amount: 5 }, key)
    const retry = await send(CHARGE, { amount: 5 }, key)
    expect(first.body.data?.charge).toEqual({ id: `ch_${before + 1}`, amount: 5 })
    expect(retry.body.data).toEqual(first.body.data)
    expect(retry.body.extensions).toEqual({ idempotency: { key, replayed: true } })
    expect(charges - before).toBe(1)
  })

  it('refuses the same key with other variables or another operation: 422, IDEMPOTENCY_KEY_REUSED, nothing run', async () => {
    const key = randomUUID()
    await send(CHARGE, { amount: 5 }, key)
    const before = charges
    const other = await send(CHARGE, { amount: 6 }, key)
    expect(other.status).toBe(422)
    expect(other.body.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_REUSED')
    const otherOperation = await send('mutation { charge(amount: 5) { id } }', {}, key)
    expect(otherOperation.body.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_REUSED')
    expect(charges).toBe(before)
  })

  it("keeps callers apart by default: another Authorization credential with the same key runs on its own, never gets the other's result", async () => {
    const key = randomUUID()
    const before = charges
    const alice = await send(CHARGE, { amount: 5 }, key, undefined, 'Bearer alice')
    const bob = await send(CHARGE, { amount: 5 }, key, undefined, 'Bearer bob')
    const aliceAgain = await send(CHARGE, { amount: 5 }, key, undefined, 'bearer  alice')
    expect(charges - before).toBe(2)
    expect(bob.body.data?.charge?.id).not.toBe(alice.body.data?.charge?.id)
    expect(bob.body.extensions).toBeUndefined()
    expect(aliceAgain.body.data).toEqual(alice.body.data)
    expect(aliceAgain.body.extensions).toEqual({ idempotency: { key, replayed: true } })
    // Without a credential: the public scope, apart from both.
    await send(CHARGE, { amount: 5 }, key)
    expect(charges - before).toBe(3)
  })

  it('keeps cookie users apart with credentials, and without them refuses a keyed mutation that carries a cookie, nothing run', async () => {
    const named = createYoga({
      schema,
      plugins: [useIdempotency({ ledger, scopeSecret: 'graphql-test-secret', credentials: ['cookie:session'] })],
      logging: false,
    })
    const post = async (target: typeof yoga, key: string, cookie: string) => {
      const response = await target.fetch('http://yoga/graphql', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key, cookie },
        body: JSON.stringify({ query: CHARGE, variables: { amount: 5 } }),
      })
      return (await response.json()) as { data?: { charge?: { id: string } }; errors?: Array<{ message: string }> }
    }
    const key = randomUUID()
    const before = charges
    const alice = await post(named, key, 'session=alice')
    const bob = await post(named, key, 'session=bob')
    expect(charges - before).toBe(2)
    expect(bob.data?.charge?.id).not.toBe(alice.data?.charge?.id)
    const refused = await post(yoga, randomUUID(), 'session=alice')
    expect(charges - before).toBe(2)
    expect(refused.errors?.length).toBeGreaterThan(0)
  })

  it('counts the fragments a mutation selects through: the same key with another fragment body is refused', async () => {
    const key = randomUUID()
    const withFragment = (fields: string) =>
      `mutation Charge($amount: Int!) { charge(amount: $amount) { ...C } } fragment C on Charge { ${fields} }`
    expect((await send(withFragment('id'), { amount: 5 }, key)).body.data?.charge?.id).toMatch(/^ch_/)
    const other = await send(withFragment('id amount'), { amount: 5 }, key)
    expect(other.status).toBe(422)
    expect(other.body.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_REUSED')
  })

  it('releases a mutation whose resolver failed: the retry with the same key runs it', async () => {
    const key = randomUUID()
    failNext = true
    const failed = await send(CHARGE, { amount: 7 }, key)
    expect(failed.body.errors?.length).toBe(1)
    const retry = await send(CHARGE, { amount: 7 }, key)
    expect(retry.body.data?.charge?.id).toMatch(/^ch_/)
  })

  it('takes the key from extensions.idempotencyKey, and lets queries and keyless mutations through', async () => {
    const key = randomUUID()
    const before = charges
    const a = await send(CHARGE, { amount: 1 }, undefined, { idempotencyKey: key })
    const b = await send(CHARGE, { amount: 1 }, undefined, { idempotencyKey: key })
    expect(b.body.data).toEqual(a.body.data)
    expect(charges - before).toBe(1)
    await send(CHARGE, { amount: 1 })
    await send(CHARGE, { amount: 1 })
    expect(charges - before).toBe(3)
    expect((await send('{ charges }', {}, randomUUID())).body.data).toEqual({ charges })
  })

  it('reads the Idempotency-Key header as the HTTP layer does: "k" (an RFC 8941 string) and k are one key, an empty one is refused 400 (it ran twice, or without a key)', async () => {
    const key = randomUUID()
    const before = charges
    const first = await send(CHARGE, { amount: 4 }, `"${key}"`)
    const retry = await send(CHARGE, { amount: 4 }, key)
    expect(retry.body.data).toEqual(first.body.data)
    expect(retry.body.extensions).toEqual({ idempotency: { key, replayed: true } })
    expect(charges - before).toBe(1)
    for (const header of ['""', '"unterminated']) {
      const refused = await send(CHARGE, { amount: 4 }, header)
      expect(refused.status, header).toBe(400)
      expect(refused.body.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_INVALID')
    }
    const empty = await yoga.fetch('http://yoga/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': '' },
      body: JSON.stringify({ query: CHARGE, variables: { amount: 4 } }),
    })
    expect(empty.status).toBe(400)
    expect(charges - before).toBe(1)
  })

  it('refuses an extensions.idempotencyKey that is no string with 400 IDEMPOTENCY_KEY_INVALID, nothing run (it was dropped, and each retry ran again)', async () => {
    const before = charges
    for (const idempotencyKey of [12345, { id: 'k' }, ['k']]) {
      const refused = await send(CHARGE, { amount: 1 }, undefined, { idempotencyKey })
      expect(refused.status, JSON.stringify(idempotencyKey)).toBe(400)
      expect(refused.body.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_INVALID')
    }
    expect(charges - before).toBe(0)
  })
})

describe('idemkey/graphql: file uploads (the GraphQL multipart request)', () => {
  it('replays the retry of an upload and refuses the key with another file (422): files count by name, type, size and bytes (the retry was refused 422)', async () => {
    let uploads = 0
    const yogaUploads = createYoga({
      schema: createSchema({
        typeDefs: 'scalar File type Query { ok: Boolean } type Mutation { upload(file: File!): Int! }',
        resolvers: { Mutation: { upload: async (_: unknown, { file }: { file: File }) => (await file.text()).length + 100 * ++uploads } },
      }),
      plugins: [useIdempotency({ ledger: new Ledger({ store: new MemoryStore() }), scope: () => 'shop' })],
      logging: false,
    })
    const key = randomUUID()
    const upload = async (text: string) => {
      const body = new FormData()
      body.append('operations', JSON.stringify({ query: 'mutation ($f: File!) { upload(file: $f) }', variables: { f: null } }))
      body.append('map', JSON.stringify({ 0: ['variables.f'] }))
      body.append('0', new File([text], 'invoice.txt', { type: 'text/plain' }))
      const response = await yogaUploads.fetch('http://yoga/graphql', { method: 'POST', headers: { 'idempotency-key': key }, body })
      return {
        status: response.status,
        body: (await response.json()) as { data?: unknown; errors?: Array<{ extensions?: { code?: string } }> },
      }
    }
    const first = await upload('aaaa')
    expect(first.body.data).toEqual({ upload: 104 })
    expect((await upload('aaaa')).body.data).toEqual({ upload: 104 })
    const other = await upload('bbbb')
    expect(other.status).toBe(422)
    expect(other.body.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_REUSED')
    expect(uploads).toBe(1)
  })
})

describe('idemkey/graphql: a client that goes away while its mutation runs', () => {
  it('records the mutation a cancelled request started, so the retry gets its result (the record was held, renewed, until the process ended: every retry 409)', async () => {
    let runs = 0
    let started: () => void = () => {}
    let finish: () => void = () => {}
    const running = new Promise<void>((resolve) => (started = resolve))
    const cancellable = createYoga({
      schema: createSchema({
        typeDefs: 'type Shipment { id: Int! } type Query { ok: Boolean } type Mutation { ship: Shipment! }',
        resolvers: {
          Mutation: {
            ship: async () => {
              started()
              await new Promise<void>((resolve) => (finish = resolve))
              return { id: ++runs }
            },
          },
        },
      }),
      // Yoga's request cancellation: a client that disconnects aborts the execution.
      plugins: [
        useExecutionCancellation(),
        useIdempotency({ ledger: new Ledger({ store: new MemoryStore(), wait: '500ms' }), scope: () => 'shop' }),
      ],
      logging: false,
    })
    const key = randomUUID()
    const ship = (signal?: AbortSignal) =>
      cancellable.fetch('http://yoga/graphql', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ query: 'mutation { ship { id } }' }),
        ...(signal ? { signal } : {}),
      })
    const client = new AbortController()
    const first = ship(client.signal)
    await running
    client.abort()
    finish()
    await Promise.resolve(first).catch(() => undefined)
    await new Promise((resolve) => setTimeout(resolve, 20))
    const retry = await ship()
    expect(retry.status).toBe(200)
    expect(await retry.json()).toEqual({ data: { ship: { id: 1 } }, extensions: { idempotency: { key, replayed: true } } })
    expect(runs).toBe(1)
  })
})

describe('idemkey/graphql: an execution that throws', () => {
  it('releases the held mutation, so the retry with the same key runs it (it stayed held, and every retry got 409)', async () => {
    let runs = 0
    let executorDown = true
    const yogaWithFlakyExecutor = createYoga({
      schema: createSchema({
        typeDefs: 'type Query { ok: Boolean } type Mutation { ship: Int! }',
        resolvers: { Mutation: { ship: () => ++runs } },
      }),
      plugins: [
        <Plugin>{
          onExecute({ executeFn, setExecuteFn }) {
            setExecuteFn((args) => {
              if (!executorDown) return executeFn(args)
              executorDown = false
              throw new Error('the executor is down')
            })
          },
        },
        useIdempotency({ ledger: new Ledger({ store: new MemoryStore(), wait: '300ms' }), scope: () => 'shop' }),
      ],
      logging: false,
    })
    const key = randomUUID()
    const ship = () =>
      yogaWithFlakyExecutor.fetch('http://yoga/graphql', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ query: 'mutation { ship }' }),
      })
    expect((await ship()).status).toBe(500)
    const retry = await ship()
    expect(retry.status).toBe(200)
    expect(await retry.json()).toEqual({ data: { ship: 1 } })
  })
})

/** A mutation that runs until told to finish, so a second request with its key finds it in flight. */
function blockingShip() {
  let started: () => void = () => {}
  let finish: () => void = () => {}
  const running = new Promise<void>((resolve) => (started = resolve))
  return {
    running,
    finish: () => finish(),
    typeDefs: 'type Query { ok: Boolean } type Mutation { ship: Int! }',
    resolvers: {
      Mutation: {
        ship: async () => {
          started()
          await new Promise<void>((resolve) => (finish = resolve))
          return 1
        },
      },
    },
  }
}

describe('idemkey/graphql: answers that say retry later carry Retry-After', () => {
  it('answers a mutation still in flight at the end of the wait 409 IDEMPOTENCY_KEY_IN_PROGRESS with a Retry-After, as the HTTP layer does (clients backed off blind)', async () => {
    const ship = blockingShip()
    const yogaInFlight = createYoga({
      schema: createSchema({ typeDefs: ship.typeDefs, resolvers: ship.resolvers }),
      plugins: [useIdempotency({ ledger: new Ledger({ store: new MemoryStore(), wait: '100ms' }), scope: () => 'shop' })],
      logging: false,
    })
    const key = randomUUID()
    const send = () =>
      yogaInFlight.fetch('http://yoga/graphql', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ query: 'mutation { ship }' }),
      })
    const first = send()
    await ship.running
    const duplicate = await send()
    expect(duplicate.status).toBe(409)
    expect(((await duplicate.json()) as { errors: Array<{ extensions: { code: string } }> }).errors[0]?.extensions.code).toBe(
      'IDEMPOTENCY_KEY_IN_PROGRESS',
    )
    expect(duplicate.headers.get('retry-after')).toMatch(/^[12]$/)
    ship.finish()
    expect((await first).status).toBe(200)
  })

  it('answers a store that is down 503 STORE_UNAVAILABLE with a Retry-After, nothing run', async () => {
    const down = new MemoryStore()
    down.acquire = async () => {
      throw new IdempotencyError('STORE_UNAVAILABLE', 'connect ECONNREFUSED 127.0.0.1:5432')
    }
    const before = charges
    const yogaStoreDown = createYoga({
      schema,
      plugins: [useIdempotency({ ledger: new Ledger({ store: down }), scope: () => 'shop' })],
      logging: false,
    })
    const response = await yogaStoreDown.fetch('http://yoga/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': randomUUID() },
      body: JSON.stringify({ query: CHARGE, variables: { amount: 1 } }),
    })
    expect(response.status).toBe(503)
    expect(response.headers.get('retry-after')).toBe('1')
    expect(charges).toBe(before)
  })

  it('answers so in the Apollo plugin too, with the Retry-After header', async () => {
    const { ApolloServer, HeaderMap } = await import('@apollo/server')
    const ship = blockingShip()
    const apollo = new ApolloServer({
      typeDefs: ship.typeDefs,
      resolvers: ship.resolvers,
      plugins: [apolloIdempotency({ ledger: new Ledger({ store: new MemoryStore(), wait: '100ms' }), scope: () => 'shop' })],
    })
    await apollo.start()
    try {
      const key = randomUUID()
      const send = () =>
        apollo.executeOperation({
          query: 'mutation { ship }',
          extensions: { idempotencyKey: key },
          http: { method: 'POST', headers: new HeaderMap(), search: '', body: {} },
        })
      const first = send()
      await ship.running
      const duplicate = await send()
      expect(duplicate.http.status).toBe(409)
      expect(duplicate.http.headers.get('retry-after')).toMatch(/^[12]$/)
      ship.finish()
      await first
    } finally {
      await apollo.stop()
    }
  })
})

describe('idemkey/graphql: the Apollo Server plugin', async () => {
  const { ApolloServer } = await import('@apollo/server')
  const apolloLedger = new Ledger({ store: new MemoryStore() })
  const server = new ApolloServer({
    typeDefs: 'type Charge { id: ID!, amount: Int! } type Query { ok: Boolean } type Mutation { charge(amount: Int!): Charge! }',
    resolvers: { Mutation: { charge: (_: unknown, { amount }: { amount: number }) => ({ id: `ch_${++charges}`, amount }) } },
    plugins: [apolloIdempotency({ ledger: apolloLedger, scopeSecret: 'graphql-test-secret' })],
  })
  beforeAll(() => server.start())
  afterAll(() => server.stop())
  const { HeaderMap } = await import('@apollo/server')
  const execute = async (variables: Record<string, unknown>, idempotencyKey?: string, authorization?: string) => {
    const headers = new HeaderMap()
    if (authorization) headers.set('authorization', authorization)
    const response = await server.executeOperation({
      query: CHARGE,
      variables,
      ...(idempotencyKey ? { extensions: { idempotencyKey } } : {}),
      http: { method: 'POST', headers, search: '', body: {} },
    })
    return { status: response.http.status, result: response.body.kind === 'single' ? response.body.singleResult : undefined }
  }

  it('runs a keyed mutation once, replays it to the retry, and refuses the key with other variables (422)', async () => {
    const key = randomUUID()
    const before = charges
    const first = await execute({ amount: 9 }, key)
    const retry = await execute({ amount: 9 }, key)
    expect(retry.result?.data).toEqual(first.result?.data)
    expect(retry.result?.extensions).toEqual({ idempotency: { key, replayed: true } })
    expect(charges - before).toBe(1)
    const other = await execute({ amount: 10 }, key)
    expect(other.status).toBe(422)
    expect(other.result?.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_REUSED')
  })

  it('reads an RFC 8941 string in the Idempotency-Key header as its content, as the HTTP layer does', async () => {
    const key = randomUUID()
    const before = charges
    const viaHeader = async (value: string) => {
      const headers = new HeaderMap()
      headers.set('idempotency-key', value)
      const response = await server.executeOperation({
        query: CHARGE,
        variables: { amount: 11 },
        http: { method: 'POST', headers, search: '', body: {} },
      })
      return { status: response.http.status, result: response.body.kind === 'single' ? response.body.singleResult : undefined }
    }
    const first = await viaHeader(`"${key}"`)
    const retry = await viaHeader(key)
    expect(retry.result?.data).toEqual(first.result?.data)
    expect(charges - before).toBe(1)
    const refused = await viaHeader('"unterminated')
    expect(refused.status).toBe(400)
    expect(refused.result?.errors?.[0]?.extensions?.code).toBe('IDEMPOTENCY_KEY_INVALID')
  })

  it('keeps callers apart by default: another Authorization credential with the same key runs on its own', async () => {
    const key = randomUUID()
    const before = charges
    const alice = await execute({ amount: 9 }, key, 'Bearer alice')
    const bob = await execute({ amount: 9 }, key, 'Bearer bob')
    const aliceAgain = await execute({ amount: 9 }, key, 'Bearer alice')
    expect(charges - before).toBe(2)
    expect(bob.result?.extensions).toBeUndefined()
    expect(aliceAgain.result?.data).toEqual(alice.result?.data)
  })

  it('checks its durations when the plugin is made (a bad one failed every keyed mutation instead), and each plugin reads its own key per request', async () => {
    expect(() => apolloIdempotency({ ledger: apolloLedger, lease: 'soon' })).toThrow(
      expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining('lease') }),
    )
    expect(() => apolloIdempotency({ ledger: apolloLedger, ttl: -1 })).toThrow(expect.objectContaining({ code: 'INVALID_OPTION' }))
    expect(() => apolloIdempotency({ ledger: apolloLedger, ttl: 0 })).toThrow('ttl must be longer than 0')
    // One plugin serves every request: two keys sent at once stay two operations.
    const [a, b] = [randomUUID(), randomUUID()]
    const before = charges
    const [first, second] = await Promise.all([execute({ amount: 3 }, a), execute({ amount: 3 }, b)])
    expect(charges - before).toBe(2)
    expect(first.result?.data).not.toEqual(second.result?.data)
    expect((await execute({ amount: 3 }, b)).result?.data).toEqual(second.result?.data)
  })
})
