/**
 * The operator page in a real browser: headless Chromium (Debian's `chromium` package) driven by
 * playwright-core, against the page mounted in Express and in Fastify over a real store's records.
 */
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { DatabaseSync } from 'node:sqlite'
import express from 'express'
import Fastify, { type FastifyInstance } from 'fastify'
import { type Browser, chromium, type Page } from 'playwright-core'
import { SqliteStore } from '../src/backends/sqlite/index.js'
import { Ledger } from '../src/core/ledger.js'
import { operatorPagePlugin } from '../src/http/fastify/index.js'
import { SqliteInbox } from '../src/messaging/inbox/index.js'
import type { PgCdcRelayHealth } from '../src/messaging/outbox/index.js'
import {
  Activity,
  isLoopback,
  type OperatorPage,
  type OperatorPageRelay,
  type OperatorSummary,
  operatorPage,
} from '../src/observability/index.js'
import { keyHash } from '../src/observability/recorder.js'
import { toolPath } from './helpers/services.js'

/** Where Debian's chromium package puts the browser; CHROMIUM_PATH overrides. */
const executablePath = toolPath({
  name: 'chromium',
  suite: 'operator page browser test',
  paths: [process.env.CHROMIUM_PATH, '/usr/bin/chromium', '/usr/bin/chromium-browser'],
  install: 'apt-get install -y chromium, or set CHROMIUM_PATH',
})

const TOKEN = 'operator-token-0123456789abcdef'

/** A stand-in for PgCdcRelay's health(): the page only renders what it answers. */
function fakeRelay(slot: string, health: Partial<PgCdcRelayHealth> | Error, maxLagBytes?: number): OperatorPageRelay {
  return {
    slot,
    maxLagBytes,
    health: async () => {
      if (health instanceof Error) throw health
      return {
        slot,
        exists: true,
        active: true,
        streaming: true,
        confirmedLsn: '0/1000',
        currentLsn: '0/1000',
        lagBytes: 0,
        walStatus: 'reserved',
        ...health,
      }
    },
  }
}

describe.skipIf(!executablePath)('operator page in headless Chromium', () => {
  let browser: Browser
  let store: SqliteStore
  let ledger: Ledger
  let page: OperatorPage
  let guarded: OperatorPage
  let expressServer: Server
  let fastify: FastifyInstance
  const mounts: Record<string, string> = {}

  beforeAll(async () => {
    browser = await chromium.launch({ executablePath, args: ['--no-sandbox', '--disable-gpu'] })
    store = new SqliteStore({ path: ':memory:' })
    // An inbox whose oldest kept ID is 2 hours old, and one that keeps none yet.
    const inboxDb = new DatabaseSync(':memory:')
    const billing = new SqliteInbox({ database: inboxDb, consumer: 'billing', retention: '7d', now: () => Date.now() - 2 * 3_600_000 })
    billing.migrate()
    await billing.handle({ id: 'msg-1', payload: '{}' }, () => undefined)
    // A message that failed twice (its attempts recorded two hours ago, by billing's clock).
    for (let i = 0; i < 2; i++) await billing.recordFailure({ id: 'msg-9', payload: '{}' })
    const shipping = new SqliteInbox({ database: inboxDb, consumer: 'shipping', retention: '1d' })
    page = operatorPage({
      store,
      inboxes: [billing, shipping],
      relays: [
        fakeRelay('orders_cdc', { lagBytes: 2_048 }),
        fakeRelay('payments_cdc', { lagBytes: 3 * 1_048_576, active: false }, 1_048_576),
        fakeRelay('audit_cdc', new Error('connection refused')),
      ],
    })
    guarded = operatorPage({ store, token: TOKEN, activity: page.activity })
    ledger = new Ledger({ store, onEvent: page.onEvent })
    // Traffic: 3 executed (2 completed, 1 failed), 2 replays, 1 mismatch, 1 holder gone past its lease.
    await ledger.run({ key: 'order-1', payload: 1 }, () => ({ charged: 'order-1-secret-body' }))
    await ledger.run({ key: 'order-2', payload: 2 }, () => ({ charged: 2 }))
    await ledger.run({ key: 'order-3', payload: 3 }, () => 'declined', {
      encode: () => ({ status: 402, headers: {}, body: new TextEncoder().encode('declined') }),
    })
    await ledger.run({ key: 'order-1', payload: 1 }, () => 'never')
    await ledger.run({ key: 'order-2', payload: 2 }, () => 'never')
    await ledger.run({ key: 'order-2', scope: 'default', payload: 'another body' }, () => 'never')
    await store.acquire('tenant-9', 'crashed-holder', 'f'.repeat(64), 1)
    await new Promise((resolve) => setTimeout(resolve, 20))

    const app = express()
    app.use('/ops', page.handler)
    app.use('/guarded', guarded.handler)
    expressServer = await new Promise<Server>((resolve) => {
      const server = app.listen(0, '127.0.0.1', () => resolve(server))
    })
    mounts.express = `http://127.0.0.1:${(expressServer.address() as AddressInfo).port}/ops`
    fastify = Fastify()
    await fastify.register(operatorPagePlugin(page), { prefix: '/ops' })
    await fastify.listen({ port: 0, host: '127.0.0.1' })
    mounts.fastify = `http://127.0.0.1:${(fastify.server.address() as AddressInfo).port}/ops`
  }, 60_000)

  afterAll(async () => {
    await browser?.close()
    expressServer?.closeAllConnections()
    await new Promise((resolve) => expressServer?.close(resolve))
    await fastify?.close()
    await store?.close()
  })

  async function open(url: string): Promise<{ tab: Page; requests: string[] }> {
    const tab = await browser.newPage()
    const requests: string[] = []
    tab.on('request', (request) => requests.push(request.url()))
    await tab.goto(url)
    return { tab, requests }
  }

  const cells = (tab: Page, table: string) =>
    tab.$$eval(`#${table} tbody tr`, (rows) => rows.map((row) => [...row.querySelectorAll('td')].map((td) => td.textContent ?? '')))

  for (const framework of ['express', 'fastify']) {
    it(`shows records by state, stuck holders, mismatches and rates, mounted in ${framework}`, async () => {
      const base = mounts[framework] as string
      const { tab, requests } = await open(base)
      expect(new URL(tab.url()).pathname).toBe('/ops/')
      await tab.waitForSelector('body[data-loaded="true"]')
      expect(Object.fromEntries((await cells(tab, 'counts')).map(([state, count]) => [state, count]))).toEqual({
        in_progress: '1',
        completed: '2',
        failed: '1',
      })
      const stuck = await cells(tab, 'stuck')
      expect(stuck).toHaveLength(1)
      expect(stuck[0]?.slice(0, 4)).toEqual(['tenant-9', 'crashed-holder', keyHash('tenant-9', 'crashed-holder'), '1'])
      expect((await cells(tab, 'mismatches')).map((row) => row[1])).toEqual([keyHash('default', 'order-2')])
      const inboxes = await cells(tab, 'inboxes')
      expect(inboxes.map((row) => [row[0], row[1], row[3], row[4]])).toEqual([
        ['billing', '7.0 d', '2.0 h', 'msg-1'],
        ['shipping', '1.0 d', '-', '-'],
      ])
      expect(inboxes[1]?.[2]).toBe('none kept')
      expect((await cells(tab, 'failing')).map((row) => [row[0], row[1], row[3], row[4]])).toEqual([['billing', '2', '2.0 h', 'msg-9']])
      // CDC relay slots: the one past its maxLagBytes and the one that failed to answer are marked.
      expect(await cells(tab, 'relays')).toEqual([
        ['orders_cdc', 'ok', '2.0 KiB', '256.0 MiB', 'yes', 'reserved'],
        ['payments_cdc', 'lagging', '3.0 MiB', '1.0 MiB', 'no', 'reserved'],
        ['audit_cdc', 'unavailable: connection refused', '-', '256.0 MiB', '-', '-'],
      ])
      const marks = await tab.$$eval('#relays tbody tr td:nth-child(2) .pill', (pills) => pills.map((p) => p.className))
      expect(marks).toEqual(['pill up', 'pill down', 'pill down'])
      expect(await tab.isVisible('#relay-section')).toBe(true)
      // One chart per series, each a line over the last 5 minutes; totals as the traffic made them.
      const charts = await tab.$$eval('#charts .chart', (nodes) =>
        nodes.map((n) => ({
          series: (n as HTMLElement).dataset.series,
          total: /total (\d+)/.exec(n.querySelector('.rate')?.textContent ?? '')?.[1],
          points: n.querySelector('polyline')?.getAttribute('points')?.split(' ').length,
        })),
      )
      expect(Object.fromEntries(charts.map((c) => [c.series, c.total]))).toEqual({
        executed: '3',
        replayed: '2',
        in_progress: '0',
        mismatch: '1',
        store_error: '0',
        unrecorded: '0',
      })
      expect(charts.every((c) => c.points === 30)).toBe(true)
      // Nothing left the page's own origin: no CDN, no font, no analytics.
      expect(requests.every((url) => url.startsWith(new URL(base).origin))).toBe(true)
      await tab.close()
    })
  }

  it('looks up one record with its stored body hidden unless asked for', async () => {
    const { tab } = await open(`${mounts.express}/`)
    await tab.waitForSelector('body[data-loaded="true"]')
    await tab.fill('#lookup-key', 'order-1')
    await tab.click('#lookup button')
    await tab.waitForFunction(() => document.querySelector('#record')?.textContent?.includes('"status"'))
    const hidden = JSON.parse((await tab.textContent('#record')) ?? '{}')
    expect(hidden).toMatchObject({ key: 'order-1', status: 'completed', response: { status: 200 } })
    expect(hidden.response.body).toBeUndefined()
    expect(hidden.response.bodyBytes).toBeGreaterThan(0)
    await tab.check('#lookup-bodies')
    await tab.click('#lookup button')
    await tab.waitForFunction(() => document.querySelector('#record')?.textContent?.includes('order-1-secret-body'))
    await tab.fill('#lookup-key', 'no-such-key')
    await tab.click('#lookup button')
    await tab.waitForFunction(() => document.querySelector('#record')?.textContent?.includes('No record'))
    await tab.close()
  })

  it('asks for the bearer token when one is set, and shows nothing without it', async () => {
    const base = mounts.express?.replace('/ops', '/guarded') as string
    expect((await fetch(`${base}/api/summary`)).status).toBe(401)
    expect((await fetch(`${base}/api/summary`, { headers: { authorization: 'Bearer wrong-token-0123456789' } })).status).toBe(401)
    const { tab } = await open(`${base}/`)
    await tab.waitForSelector('#login:not([hidden])')
    expect(await tab.isVisible('#main')).toBe(false)
    await tab.fill('#token', TOKEN)
    await tab.click('#login button')
    await tab.waitForSelector('body[data-loaded="true"]')
    expect((await cells(tab, 'counts')).length).toBe(3)
    // No relays given: no slot table.
    expect(await tab.isVisible('#relay-section')).toBe(false)
    await tab.close()
  })

  it('answers loopback clients only, unless a token or allowRemote is set', async () => {
    expect(isLoopback('127.0.0.1')).toBe(true)
    expect(isLoopback('::ffff:127.0.0.1')).toBe(true)
    expect(isLoopback('::1')).toBe(true)
    expect(isLoopback('10.1.2.3')).toBe(false)
    expect(isLoopback('::ffff:192.168.1.4')).toBe(false)
    expect(() => operatorPage({ store, token: 'short' })).toThrow(/at least 16 characters/)
  })
})

describe('operator page options (no browser)', () => {
  it('refuses, when made, a short token, a count limit that is no positive integer, a store without list() and get(), and a now that is no function', () => {
    const store = new SqliteStore({ path: ':memory:' })
    const invalid = (message: string) => expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(message) })
    expect(() => operatorPage({ store, token: 'short' })).toThrow(invalid('at least 16 characters'))
    expect(() => operatorPage({ store, token: 1234567890123456 as never })).toThrow(invalid('at least 16 characters'))
    expect(() => operatorPage({ store, countLimit: 0 })).toThrow(invalid('operatorPage() countLimit must be a positive integer'))
    expect(() => operatorPage({ store: { name: 'x' } as never })).toThrow(
      invalid('operatorPage(): store must be an object with list(), get()'),
    )
    expect(() => operatorPage({} as never)).toThrow(invalid('operatorPage(): store must be an object with list(), get(); got null.'))
    expect(() => operatorPage({ store, now: 5 as never })).toThrow(invalid('operatorPage(): now must be a function'))
    expect(() => operatorPage({ store, token: 'a'.repeat(16), countLimit: 10 })).not.toThrow()
    // The activity ring: a bucket of 0 ms divided by 0, a fractional count broke the ring.
    expect(() => new Activity({ bucketMs: 0 })).toThrow(invalid('new Activity() bucketMs must be a positive integer, got 0.'))
    expect(() => new Activity({ buckets: 1.5 })).toThrow(invalid('new Activity() buckets must be a positive integer, got 1.5.'))
    expect(() => new Activity({ bucketMs: 1_000, buckets: 60 })).not.toThrow()
  })
})

describe('operator page summary of inboxes (no browser)', () => {
  it("answers each inbox's retention and oldest kept ID, and an inbox that fails as unavailable, not the whole page", async () => {
    const store = new SqliteStore({ path: ':memory:' })
    const db = new DatabaseSync(':memory:')
    const processedAt = Date.now() - 3_600_000
    const billing = new SqliteInbox({ database: db, consumer: 'billing', retention: '2h', now: () => processedAt })
    billing.migrate()
    await billing.handle({ id: 'msg-old', payload: '{}' }, () => undefined)
    await billing.recordFailure({ id: 'msg-bad', payload: '{}' })
    const broken = {
      consumer: 'broken',
      retentionMs: 60_000,
      oldest: () => Promise.reject(new Error('connection refused')),
    }
    const page = operatorPage({ store, inboxes: [billing, broken, { consumer: 'custom' }] })
    const server = createServer((req, res) => page.handler(req, res))
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const response = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/api/summary`)
      expect(response.status).toBe(200)
      const summary = (await response.json()) as OperatorSummary
      expect(summary.inboxes).toEqual([
        {
          consumer: 'billing',
          retentionMs: 7_200_000,
          oldest: { messageId: 'msg-old', processedAtMs: processedAt },
          failing: [{ messageId: 'msg-bad', attempts: 1, lastAttemptAtMs: processedAt }],
        },
        { consumer: 'broken', retentionMs: 60_000, oldest: null, failing: [], error: 'connection refused' },
        { consumer: 'custom', retentionMs: null, oldest: null, failing: [] },
      ])
      expect(summary.store.up).toBe(true)
    } finally {
      server.close()
      await store.close()
      db.close()
    }
  })
})

/** GET api/summary of a page served on a loopback port. */
async function summaryOf(page: OperatorPage): Promise<OperatorSummary> {
  const server = createServer((req, res) => page.handler(req, res))
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  try {
    const response = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/api/summary`)
    expect(response.status).toBe(200)
    return (await response.json()) as OperatorSummary
  } finally {
    server.close()
  }
}

describe('operator page summary of CDC relay slots (no browser)', () => {
  it("answers each relay slot's lag and marks a slot missing, lost or past maxLagBytes, and a failing relay as unavailable", async () => {
    const store = new SqliteStore({ path: ':memory:' })
    const relays = [
      fakeRelay('healthy', { lagBytes: 100 }),
      fakeRelay('behind', { lagBytes: 5_000, active: false }, 4_096),
      fakeRelay('at_limit', { lagBytes: 4_096 }, 4_096),
      fakeRelay('cut_off', { walStatus: 'lost', lagBytes: 0 }),
      fakeRelay('dropped', { exists: false, active: false, walStatus: null, confirmedLsn: null }),
      fakeRelay('unreachable', new Error('connect ECONNREFUSED 127.0.0.1:5432')),
      { health: () => Promise.reject('not an Error') },
    ]
    try {
      const summary = await summaryOf(operatorPage({ store, relays }))
      const row = (slot: string | null, rest: Partial<OperatorSummary['relays'][number]>) => ({
        slot,
        exists: true,
        active: true,
        lagBytes: 0,
        maxLagBytes: 268_435_456,
        walStatus: 'reserved',
        problem: null,
        ...rest,
      })
      const unknown = { exists: null, active: null, lagBytes: null, walStatus: null, problem: 'unavailable' as const }
      expect(summary.relays).toEqual([
        row('healthy', { lagBytes: 100 }),
        row('behind', { lagBytes: 5_000, active: false, maxLagBytes: 4_096, problem: 'lagging' }),
        row('at_limit', { lagBytes: 4_096, maxLagBytes: 4_096 }),
        row('cut_off', { walStatus: 'lost', problem: 'lost' }),
        row('dropped', { exists: false, active: false, walStatus: null, problem: 'missing' }),
        row('unreachable', { ...unknown, error: 'connect ECONNREFUSED 127.0.0.1:5432' }),
        row(null, { ...unknown, error: 'not an Error' }),
      ])
      expect(summary.store.up).toBe(true)
      expect((await summaryOf(operatorPage({ store }))).relays).toEqual([])
    } finally {
      await store.close()
    }
  })
})
