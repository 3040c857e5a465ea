/**
 * One worker process of the demo's payments API (`POST /charges`), forked by the demo. The same
 * handler runs bare (a charge for every request it gets) or behind idemkey's HTTP engine. Every
 * charge is a row in a SQLite file shared by all workers, so the demo's counts come from the data.
 *
 * Behind idemkey, the handler calls its "bank" with a key derived from the request's idempotency key
 * (`deriveKey`, docs/client.md), and the bank keeps one charge per key, as Stripe does. That closes
 * the one window the ledger alone cannot: a worker killed after the bank charged but before the
 * outcome was recorded. The request is taken over after its lease and runs again, and the bank
 * answers the repeat with the charge it already made. The bare API has no keys to pass on.
 *
 * A charge is a checkout of three steps: reserve the stock, charge the bank, email the receipt. Behind
 * idemkey each is a durable step (`ctx.step`, docs/steps.md): a request taken over after its worker was
 * killed resumes after the last recorded step. A step is not a transaction: a worker killed after a
 * step's effect and before its result was recorded (the request the crash fault aims at, or any other
 * the worker was serving at that moment) leaves the effect made and the step to run again. So each
 * downstream gets its step's derived key and keeps one effect per key: the bank one charge, the stock
 * one reservation, the mailer one email.
 *
 * Faults it obeys (the demo's fault injector sets `x-demo-fault` on the attempt it picks):
 * - `crash`: the process kills itself with SIGKILL, at a point fixed per intent: after the reservation
 *   was recorded, after the charge was recorded, or (half the intents) right after the bank charged,
 *   before anyone recorded it: the ambiguous case, where a retry must not charge again;
 * - `slow`: the bank answers late, after the client's timeout, and then the charge commits.
 */

import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { openNodeSqlite } from '../../backends/sqlite/driver.js'
import { sha256Hex } from '../../core/fingerprint.js'
import { Ledger } from '../../core/ledger.js'
import { createEngine } from '../../http/engine.js'
import { distinctHeaders, readNodeBody } from '../../http/node-body.js'
import type { HttpRequestLike, HttpResponseLike, IdempotencyContext } from '../../http/types.js'
import { quietSqliteWarning } from '../quiet-warnings.js'
import { openStore } from '../store-url.js'

/** What the demo passes a worker (as JSON in `IDEMKEY_DEMO_WORKER`). */
export interface WorkerConfig {
  mode: 'bare' | 'protected'
  /** SQLite file with the `charges` table. */
  chargesPath: string
  /** Ledger store URL (protected mode). */
  storeUrl: string
  /** Scope of this demo run's records, so reruns on one PostgreSQL never meet. */
  scope: string
  leaseMs: number
  waitMs: number
  /** How long a `slow` bank call takes: longer than the client's attempt timeout. */
  slowMs: number
}

/** Messages a worker sends the demo over IPC. */
export type WorkerMessage = { type: 'ready'; port: number } | { type: 'error'; message: string }

/** Creates the charges table (the demo calls it once before forking workers). */
export function createChargesTable(path: string): void {
  const db = openNodeSqlite(path)
  db.pragma('journal_mode = WAL')
  db.exec(`CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    api TEXT NOT NULL,
    intent TEXT NOT NULL,
    amount INTEGER NOT NULL,
    idempotency_key TEXT,
    bank_key TEXT UNIQUE,
    worker INTEGER NOT NULL,
    created_at INTEGER NOT NULL
  );
  CREATE TABLE IF NOT EXISTS bank_repeats (bank_key TEXT NOT NULL, worker INTEGER NOT NULL, created_at INTEGER NOT NULL);
  CREATE TABLE IF NOT EXISTS reservations (api TEXT NOT NULL, intent TEXT NOT NULL, step_key TEXT UNIQUE, worker INTEGER NOT NULL, created_at INTEGER NOT NULL);
  CREATE TABLE IF NOT EXISTS emails (api TEXT NOT NULL, intent TEXT NOT NULL, step_key TEXT UNIQUE, worker INTEGER NOT NULL, created_at INTEGER NOT NULL);
  CREATE TABLE IF NOT EXISTS step_repeats (step TEXT NOT NULL, step_key TEXT NOT NULL, worker INTEGER NOT NULL, created_at INTEGER NOT NULL);
  CREATE TABLE IF NOT EXISTS step_resumes (intent TEXT NOT NULL, step TEXT NOT NULL, worker INTEGER NOT NULL, created_at INTEGER NOT NULL)`)
  db.close()
}

const encoder = new TextEncoder()
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

function json(status: number, value: unknown, headers: Record<string, string> = {}): HttpResponseLike {
  return { status, headers: { 'content-type': 'application/json', ...headers }, body: encoder.encode(JSON.stringify(value)) }
}

async function main(): Promise<void> {
  const config = JSON.parse(process.env.IDEMKEY_DEMO_WORKER ?? '{}') as WorkerConfig
  const db = openNodeSqlite(config.chargesPath)
  db.pragma('busy_timeout = 5000')
  db.pragma('synchronous = NORMAL')
  const insert = db.prepare(
    `INSERT INTO charges (api, intent, amount, idempotency_key, bank_key, worker, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)
     ON CONFLICT (bank_key) DO NOTHING RETURNING id`,
  )
  const existing = db.prepare('SELECT id FROM charges WHERE bank_key = ?')
  const repeat = db.prepare('INSERT INTO bank_repeats (bank_key, worker, created_at) VALUES (?, ?, ?)')
  const stepRepeat = db.prepare('INSERT INTO step_repeats (step, step_key, worker, created_at) VALUES (?, ?, ?, ?)')
  /**
   * The stock service and the mailer: like the bank, one effect per key (the step's derived key); a
   * repeat of a key makes none and is counted. The bare API has no key, so each call makes one.
   */
  const keyedDownstream = (table: 'reservations' | 'emails') => {
    const make = db.prepare(
      `INSERT INTO ${table} (api, intent, step_key, worker, created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (step_key) DO NOTHING RETURNING rowid`,
    )
    return (api: string, intent: string, stepKey: string | null) =>
      db.immediate(() => {
        if (make.get(api, intent, stepKey, process.pid, Date.now())) return true
        stepRepeat.run(table, stepKey, process.pid, Date.now())
        return false
      })
  }
  const reserve = keyedDownstream('reservations')
  const email = keyedDownstream('emails')
  const resumed = db.prepare('INSERT INTO step_resumes (intent, step, worker, created_at) VALUES (?, ?, ?, ?)')
  /** The bank: one charge per bank key; a repeat of a key gets the charge it already made. */
  const bankCharge = (api: string, intent: string, amount: number, key: string | null, bankKey: string | null) =>
    db.immediate(() => {
      const made = insert.get(api, intent, amount, key, bankKey, process.pid, Date.now()) as { id: number } | undefined
      if (made) return made.id
      repeat.run(bankKey, process.pid, Date.now())
      return (existing.get(bankKey) as { id: number }).id
    })

  /** The payments handler: the same code for both APIs; `ctx` is there behind idemkey. */
  async function charge(req: HttpRequestLike, body: Uint8Array, ctx?: IdempotencyContext): Promise<HttpResponseLike> {
    if (req.method !== 'POST' || req.url.split('?')[0] !== '/charges') return json(404, { error: 'not found' })
    let input: { intent?: unknown; amount?: unknown; currency?: unknown }
    try {
      input = JSON.parse(new TextDecoder().decode(body)) as typeof input
    } catch {
      return json(400, { error: 'body must be JSON' })
    }
    if (typeof input.intent !== 'string' || !Number.isInteger(input.amount) || (input.amount as number) <= 0) {
      return json(400, { error: 'intent (string) and amount (positive integer, cents) are required' })
    }
    const intent = input.intent
    const fault = req.headers['x-demo-fault']
    const hash = Number.parseInt(sha256Hex(intent).slice(0, 8), 16)
    // Where a crash fault kills this intent's worker (fixed per intent, so a seeded run repeats).
    const crashAt = fault !== 'crash' ? undefined : (['after-reserve', 'after-charge', 'in-charge', 'in-charge'] as const)[hash % 4]
    const die = async (): Promise<never> => {
      process.kill(process.pid, 'SIGKILL')
      return (await sleep(60_000)) as never
    }
    /** One step of the checkout: durable behind idemkey (counted when a takeover skips it), plain when bare. */
    const step = async <R>(name: string, fn: (stepKey: string | null) => R | Promise<R>): Promise<R> => {
      if (!ctx) return fn(null)
      let ran = false
      const value = await ctx.step(name, (s) => {
        ran = true
        return fn(s.key)
      })
      if (!ran) resumed.run(intent, name, process.pid, Date.now())
      return value
    }
    /** A step's key for a downstream, scoped to this demo run (null when bare: no key to pass). */
    const downstreamKey = (stepKey: string | null) => (stepKey && ctx ? `${stepKey}:${ctx.scope}` : null)
    await step('reserve', (stepKey) => reserve(config.mode, intent, downstreamKey(stepKey)))
    if (crashAt === 'after-reserve') await die()
    const key = req.headers['idempotency-key']
    const id = await step('charge', async (stepKey) => {
      // The bank call: 1 to 3 ms (fixed per intent), or late (after the client's timeout).
      await sleep(fault === 'slow' ? config.slowMs : 1 + (hash % 3))
      // The bank keeps one charge per key: the charge step's derived key (scoped to this demo run).
      const made = bankCharge(config.mode, intent, input.amount as number, typeof key === 'string' ? key : null, downstreamKey(stepKey))
      // The money moved; the process dies before anyone hears of it.
      if (crashAt === 'in-charge') await die()
      return made
    })
    if (crashAt === 'after-charge') await die()
    await step('email', (stepKey) => email(config.mode, intent, downstreamKey(stepKey)))
    return json(
      201,
      { id: `ch_${id}`, intent: input.intent, amount: input.amount, currency: input.currency ?? 'eur', status: 'succeeded' },
      { location: `/charges/ch_${id}` },
    )
  }

  let handle: (req: HttpRequestLike) => Promise<HttpResponseLike>
  if (config.mode === 'protected') {
    const { store } = await openStore(config.storeUrl)
    const ledger = new Ledger({ store, lease: config.leaseMs, wait: config.waitMs, ttl: '1h' })
    const engine = createEngine({ ledger, scope: () => config.scope })
    handle = (req) => engine.handle(req, async (ctx) => charge(req, await req.body(1024 * 1024), ctx))
  } else {
    handle = async (req) => charge(req, await req.body(1024 * 1024))
  }

  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let read: Promise<Uint8Array> | undefined
    const neutral: HttpRequestLike = {
      method: req.method ?? 'GET',
      url: req.url ?? '/',
      headers: distinctHeaders(req),
      body: (limit) => {
        read ??= readNodeBody(req, limit)
        return read
      },
    }
    handle(neutral).then(
      (response) => {
        res.writeHead(response.status, response.headers)
        res.end(response.body)
      },
      (error: unknown) => {
        res.writeHead(500, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: (error as Error).message }))
      },
    )
  })
  server.keepAliveTimeout = 30_000
  server.listen(0, '127.0.0.1', () => {
    const address = server.address()
    const port = typeof address === 'object' && address ? address.port : 0
    process.send?.({ type: 'ready', port } satisfies WorkerMessage)
  })
}

if (process.env.IDEMKEY_DEMO_WORKER) {
  quietSqliteWarning()
  // The demo that forked this worker is gone (killed, or its output pipe closed): so is the demo. An
  // orphan would keep its port and the demo's files for ever.
  process.once('disconnect', () => process.exit(0))
  main().catch((error: unknown) => {
    process.send?.({ type: 'error', message: (error as Error).message } satisfies WorkerMessage)
    process.exit(1)
  })
}
