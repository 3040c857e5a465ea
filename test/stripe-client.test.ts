/**
 * The official Stripe client (stripe 23) pointed at an API behind idemkey with `errorFormat: 'stripe'`:
 * the layer's own answers reach it as Stripe errors (a reused key raises `StripeIdempotencyError`, a key
 * in progress, a bad key and a store that is down raise Stripe errors too), never as the resource the
 * call asked for. Stripe decides an error by the JSON's `error` member and the status (src of
 * stripe-node 23: RequestSender and Error.generateV1Error), so both are checked through it, not by hand.
 */
import { randomUUID } from 'node:crypto'
import type { AddressInfo } from 'node:net'
import { serve } from '@hono/node-server'
import express from 'express'
import { Hono } from 'hono'
import Stripe from 'stripe'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { Ledger } from '../src/core/ledger.js'
import { idempotency as expressIdempotency } from '../src/http/express/index.js'
import { idempotency as honoIdempotency } from '../src/http/hono/index.js'
import type { EngineOptions } from '../src/http/types.js'

interface Api {
  url: string
  /** Charges created, by idempotency key. */
  created: Map<string, number>
  /** Holds the charge with this key until `release` is called. */
  hold(key: string): { started: Promise<void>; release: () => void }
  close(): Promise<void>
}

type Options = Partial<EngineOptions<unknown>>

/** A tiny charges API: POST /v1/charges creates a charge from its form fields (Stripe's wire format). */
function chargesApi() {
  const created = new Map<string, number>()
  const gates = new Map<string, { started: () => void; gate: Promise<void> }>()
  const hold = (key: string) => {
    let started: () => void = () => {}
    let release: () => void = () => {}
    const entered = new Promise<void>((resolve) => {
      started = resolve
    })
    gates.set(key, { started, gate: new Promise<void>((resolve) => (release = resolve)) })
    return { started: entered, release }
  }
  const charge = async (key: string, fields: Record<string, unknown>) => {
    const held = gates.get(key)
    held?.started()
    await held?.gate
    const n = (created.get(key) ?? 0) + 1
    created.set(key, n)
    return { id: `ch_${randomUUID().slice(0, 8)}`, object: 'charge', amount: Number(fields.amount), currency: fields.currency }
  }
  return { created, hold, charge }
}

const apis: Record<string, (options: Options) => Promise<Api>> = {
  async express(options) {
    const { created, hold, charge } = chargesApi()
    const app = express()
    // As docs/http.md recommends: the raw bytes kept for the fingerprint.
    app.use(express.urlencoded({ extended: true, verify: (req, _res, buf) => Object.assign(req, { rawBody: buf }) }))
    app.use(expressIdempotency({ ledger: new Ledger({ store: new MemoryStore() }), ...options }))
    app.post('/v1/charges', async (req, res) => {
      res.status(200).json(await charge(String(req.headers['idempotency-key']), req.body))
    })
    const server = app.listen(0, '127.0.0.1')
    await new Promise((resolve) => server.once('listening', resolve))
    return {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      created,
      hold,
      close: () => new Promise((resolve) => server.close(() => resolve())),
    }
  },
  async hono(options) {
    const { created, hold, charge } = chargesApi()
    const app = new Hono()
    app.use(honoIdempotency({ ledger: new Ledger({ store: new MemoryStore() }), ...options }))
    app.post('/v1/charges', async (c) => c.json(await charge(c.req.header('idempotency-key') ?? '', await c.req.parseBody())))
    const server = serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' })
    await new Promise((resolve) => server.once('listening', resolve))
    return {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      created,
      hold,
      close: () => new Promise((resolve) => server.close(() => resolve())),
    }
  },
}

/** The official client, pointed at `url`, without retries of its own unless asked. */
function stripeAt(url: string, maxNetworkRetries = 0): Stripe {
  const { hostname, port } = new URL(url)
  return new Stripe('sk_test_idemkey', { host: hostname, port: Number(port), protocol: 'http', maxNetworkRetries })
}

/** A store whose every call fails, as an unreachable server's would. */
function downStore(): MemoryStore {
  const store = new MemoryStore()
  const fail = async () => {
    throw new Error('connect ECONNREFUSED 10.1.2.3:5432')
  }
  Object.assign(store, { acquire: fail, renew: fail, complete: fail, release: fail })
  return store
}

describe.each(Object.entries(apis))("the Stripe client against %s behind idemkey with errorFormat: 'stripe'", (_name, start) => {
  let api: Api
  const others: Api[] = []
  beforeAll(async () => {
    api = await start({ errorFormat: 'stripe', wait: '200ms' })
  })
  afterAll(async () => {
    await api.close()
    for (const other of others) await other.close()
  })

  it('gets the charge, and the same charge again on a retry with the same key', async () => {
    const stripe = stripeAt(api.url)
    const key = randomUUID()
    const first = await stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: key })
    const again = await stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: key })
    expect(first).toMatchObject({ object: 'charge', amount: 100 })
    expect(again.id).toBe(first.id)
    expect(api.created.get(key)).toBe(1)
  })

  it('raises StripeIdempotencyError for a key reused with another body, and creates nothing', async () => {
    const stripe = stripeAt(api.url)
    const key = randomUUID()
    await stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: key })
    const reused = stripe.charges.create({ amount: 999, currency: 'usd' }, { idempotencyKey: key })
    await expect(reused).rejects.toBeInstanceOf(Stripe.errors.StripeIdempotencyError)
    await expect(reused).rejects.toMatchObject({ statusCode: 400, rawType: 'idempotency_error', message: expect.stringContaining(key) })
    expect(api.created.get(key)).toBe(1)
  })

  it('raises a Stripe error (409, idempotency_key_in_use) for a key still in progress, not a result', async () => {
    const stripe = stripeAt(api.url)
    const key = randomUUID()
    const held = api.hold(key)
    const first = stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: key })
    await held.started
    const duplicate = stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: key })
    await expect(duplicate).rejects.toBeInstanceOf(Stripe.errors.StripeError)
    await expect(duplicate).rejects.toMatchObject({ statusCode: 409, code: 'idempotency_key_in_use' })
    held.release()
    expect(await first).toMatchObject({ object: 'charge' })
  })

  it('raises StripeInvalidRequestError for a key the layer refuses (longer than 255 characters)', async () => {
    const stripe = stripeAt(api.url)
    const refused = stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: 'k'.repeat(300) })
    await expect(refused).rejects.toBeInstanceOf(Stripe.errors.StripeInvalidRequestError)
    await expect(refused).rejects.toMatchObject({ statusCode: 400, code: 'key_invalid' })
  })

  it('raises StripeAPIError (503) when the store is down, after the retries Stripe makes of it', async () => {
    const down = await start({ errorFormat: 'stripe', ledger: new Ledger({ store: downStore() }) })
    others.push(down)
    const stripe = new Stripe('sk_test_idemkey', {
      ...{ host: '127.0.0.1', port: Number(new URL(down.url).port), protocol: 'http' as const },
      maxNetworkRetries: 1,
    })
    const key = randomUUID()
    const failed = stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: key })
    await expect(failed).rejects.toBeInstanceOf(Stripe.errors.StripeAPIError)
    await expect(failed).rejects.toMatchObject({ statusCode: 503 })
    expect(down.created.get(key)).toBeUndefined()
  })
})
