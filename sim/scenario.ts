/**
 * One simulated deployment, run from one seed: clients retrying through the real `idempotentFetch`, a
 * load balancer, several app processes each with the real `Ledger` and HTTP engine, a payments handler
 * with durable steps and a downstream bank, and one store server (the real MemoryStore) behind a
 * network that delays, reorders, drops requests, drops replies after the store applied them, and
 * fails transiently. App processes crash (and are replaced) and pause past their leases (zombies);
 * their clocks are skewed and jump. Every answer, effect and store write is recorded, and the
 * invariants of docs/testing.md ("Deterministic simulation") are checked against that history.
 */

import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { createIdempotentFetch } from '../src/client/idempotent-fetch.js'
import type { Clock } from '../src/core/clock.js'
import type { ListFilter, StoredRecord } from '../src/core/store.js'
import type { HttpRequestLike } from '../src/http/types.js'
import {
  App,
  completeRetryPastTheLease,
  eventDropped,
  freshCaptures,
  headerRecord,
  noRenewal,
  phantomFence,
  SimResponse,
  settleTwice,
  stepsOutsideTransaction,
  throughBegin,
  throughRun,
  transientStored,
  unreleased,
  unstorableReleased,
  untoldEnd,
} from './app.js'
import { MISUSE_DEFECTS, Misuse, misuseDefect } from './misuse.js'
import { defectiveStore, STORE_DEFECTS, type StoreClockAhead, type StoreDefect } from './store-defects.js'
import {
  Bank,
  decoder,
  type Faults,
  History,
  holderId,
  intentId,
  LEASE_MS,
  MAX_EVENTS_PER_INTENT,
  SCOPE_PREFIX,
  StoreServer,
  storeIntent,
  throughTransaction,
} from './store-side.js'
import { Proc, Rng, type Settle, World } from './world.js'

/** Longer than every record's retention (a completed one's TTL, an hour; an abandoned attempt's, a day). */
const RETENTION_MS = 25 * 3_600_000
/** Misuse cases a seed (sim/misuse.ts): over mutate:sim's 250 seeds, every wrong input of each family many times over. */
const MISUSE_CASES = 4

/** Deliberate defects the simulator must catch (docs/testing.md); none in a normal run. */
export const DEFECTS = [
  'fence',
  'renew',
  'reencode',
  'new-key',
  'late-complete',
  'no-renew',
  'renew-errors',
  'fresh-capture',
  'transient-stored',
  'untold-end',
  'lost-unreported',
  'unstorable-released',
  'settle-twice',
  'tx-steps-outside',
  'stored-unreported',
  'phantom-fence',
  'unreleased',
  ...STORE_DEFECTS,
  ...MISUSE_DEFECTS,
] as const
export type Defect = (typeof DEFECTS)[number]

export interface ScenarioOptions {
  seed: number
  clients?: number
  intentsPerClient?: number
  apps?: number
  defect?: Defect
  trace?: boolean
  /** How the scheduler settles between events (sim/world.ts); the same runs either way. */
  settle?: Settle
}

export interface ScenarioResult {
  seed: number
  /** HTTP attempts that reached the load balancer. */
  requests: number
  intents: number
  events: number
  simulatedMs: number
  violations: string[]
  trace: string[]
}

export async function runScenario(options: ScenarioOptions): Promise<ScenarioResult> {
  const inject: Partial<Record<Defect, () => () => void>> = {
    'late-complete': completeRetryPastTheLease,
    'no-renew': noRenewal,
    'fresh-capture': freshCaptures,
    'transient-stored': transientStored,
    'untold-end': untoldEnd,
    'lost-unreported': () => eventDropped('lease_lost'),
    'unstorable-released': unstorableReleased,
    'settle-twice': settleTwice,
    'tx-steps-outside': stepsOutsideTransaction,
    'stored-unreported': () => eventDropped('stored'),
    'phantom-fence': phantomFence,
    unreleased,
    'retry-hint': () => misuseDefect('retry-hint'),
    overwait: () => misuseDefect('overwait'),
    'vague-errors': () => misuseDefect('vague-errors'),
    'all-unavailable': () => misuseDefect('all-unavailable'),
    'transient-thrown': () => misuseDefect('transient-thrown'),
  }
  const undo = options.defect ? inject[options.defect]?.() : undefined
  try {
    return await simulate(options)
  } finally {
    undo?.()
  }
}

async function simulate(options: ScenarioOptions): Promise<ScenarioResult> {
  const world = new World(options.seed, { trace: options.trace ?? false, ...(options.settle ? { settle: options.settle } : {}) })
  const rng = world.rng
  const history = new History(world)
  const defect = options.defect
  const ahead: StoreClockAhead = { ms: 0 }
  const serverClock: Clock = {
    now: () => Math.round(world.now + ahead.ms),
    timer: (ms, callback) => world.at(ms, null, callback),
    sleep: (ms) => new Promise((resolve) => world.at(ms, null, resolve)),
  }
  const memory = new MemoryStore({ clock: serverClock })
  const storeDefect = STORE_DEFECTS.includes(defect as StoreDefect) ? (defect as StoreDefect) : undefined
  const server = new StoreServer(storeDefect ? defectiveStore(memory, storeDefect, ahead, LEASE_MS) : memory, history, defect)
  const bank = new Bank(history)
  const faults: Faults = {
    dropRequest: rng.between(0, 0.03),
    dropReply: rng.between(0, 0.03),
    transient: rng.between(0, 0.02),
    latency: [0.2, rng.between(2, 40)],
  }
  const appCount = options.apps ?? 3
  const apps: App[] = Array.from({ length: appCount }, (_, i) => new App(world, `app${i}`, server, bank, faults, history, defect))
  let restarts = 0

  // Chaos: pause an app past its lease (it wakes as a zombie), crash one (a new one takes its place), jump a clock.
  const chaos = () => {
    // Once the clients are done the run only lets every lease end (four leases): a pause begun then could outlast that.
    if (finished()) return
    const app = rng.pick(apps)
    const roll = rng.next()
    if (roll < 0.4 && app.proc.state === 'up') {
      const forMs = rng.between(LEASE_MS * 0.5, LEASE_MS * 3)
      world.log(() => `CHAOS pause ${app.proc.id} for ${forMs.toFixed(0)}ms`)
      app.proc.pause()
      world.at(forMs, null, () => {
        world.log(() => `CHAOS resume ${app.proc.id}`)
        app.proc.resume()
      })
    } else if (roll < 0.7 && app.proc.state === 'up') {
      world.log(() => `CHAOS crash ${app.proc.id}`)
      app.proc.crash()
      app.store.connectionsClosed()
      world.at(rng.between(50, 500), null, () => {
        const index = apps.indexOf(app)
        apps[index] = new App(world, `app${index}.${++restarts}`, server, bank, faults, history, defect)
        world.log(() => `CHAOS restart as ${apps[index]?.proc.id}`)
      })
    } else if (roll < 0.85 && app.proc.state === 'up') {
      const jump = rng.between(-500, 1_500)
      world.log(() => `CHAOS clock of ${app.proc.id} jumps ${jump.toFixed(0)}ms`)
      app.proc.jump(jump)
    } else if (app.store.cut === null) {
      // Cut off from the store for up to two leases: a holder's outcome waits out the outage or is given up before its lease ends.
      // Or only its renewals refused, for a while (one and a half to two and a half leases, so that a holder working
      // through it sees its renewals fail for a whole lease): its signal must be aborted.
      const mode = rng.pick(['reset', 'lost', 'renewals'] as const)
      const forMs = mode === 'renewals' ? rng.between(LEASE_MS * 1.5, LEASE_MS * 2.5) : rng.between(LEASE_MS * 0.25, LEASE_MS * 2)
      world.log(() => `CHAOS ${app.proc.id} cut off from the store (${mode}) for ${forMs.toFixed(0)}ms`)
      app.store.cut = mode
      history.everCut.add(app.proc)
      world.at(forMs, null, () => {
        world.log(() => `CHAOS ${app.proc.id} reaches the store again`)
        app.store.cut = null
      })
    }
    if (!finished()) world.at(rng.between(200, 2_000), null, chaos)
  }

  const clientCount = options.clients ?? 6
  const intentsPerClient = options.intentsPerClient ?? 8
  let running = clientCount
  const finished = () => running === 0
  const keyCounters = new Map<string, number>()
  const tenants = ['acme', 'globex']

  const client = async (index: number) => {
    const proc = new Proc(world, `client${index}`, rng.between(-200, 200))
    const tenant = tenants[index % tenants.length] as string
    // Keys from a counter per tenant: both tenants use the same key strings, which must stay apart.
    const nextKey = () => {
      const n = (keyCounters.get(tenant) ?? 0) + 1
      keyCounters.set(tenant, n)
      return `key-${n}`
    }
    const attempts = new Map<string, number>()
    const send = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
      const url = String(input)
      history.requests++
      // The client's own Headers, read only (a copy only where the defect changes them).
      let headers = init?.headers as Headers
      const key = headers.get('idempotency-key') as string
      const attempt = (attempts.get(key) ?? 0) + 1
      attempts.set(key, attempt)
      // Defect: a client that makes a new key for each retry.
      if (defect === 'new-key' && attempt > 1) {
        headers = new Headers(headers)
        headers.set('idempotency-key', `${key}.retry${attempt}`)
      }
      const raw = init?.body
      const body = raw instanceof Uint8Array ? raw : new Uint8Array(await new Response(raw).arrayBuffer())
      if (world.tracing)
        world.log(() => `client${index} sends ${tenant}/${headers.get('idempotency-key')} attempt ${attempt}: ${decoder.decode(body)}`)
      const signal = init?.signal
      return new Promise<Response>((resolve, reject) => {
        const abort = () => reject(signal?.reason)
        if (signal?.aborted) return abort()
        signal?.addEventListener('abort', abort, { once: true })
        const [min, max] = faults.latency
        if (rng.chance(faults.dropRequest)) return // lost: the attempt timeout ends it
        world.at(rng.between(min, max), null, () => {
          const up = apps.filter((a) => a.proc.state !== 'crashed')
          if (up.length === 0) return
          const app = rng.pick(up)
          const req: HttpRequestLike = {
            method: 'POST',
            url,
            headers: headerRecord(headers),
            body: async () => body,
          }
          // The request runs on the app's process: paused, it waits; crashed, it never answers.
          world.at(0, app.proc, () => {
            void app.handle(req).then((response) => {
              if (rng.chance(faults.dropReply)) return // answered, reply lost
              world.at(rng.between(min, max), proc, () => {
                signal?.removeEventListener('abort', abort)
                resolve(new SimResponse(response) as unknown as Response)
              })
            })
          })
        })
      })
    }
    const fetch = createIdempotentFetch({
      fetch: send,
      generateKey: nextKey,
      now: proc.clock.now,
      sleep: proc.clock.sleep,
      timer: proc.clock.timer,
      random: () => rng.next(),
      attemptTimeout: 2_500,
      maxAttempts: 8,
      // The simulated fleet's own budget, not the library's default (500 ms since round 4): short waits
      // put retries inside a holder's lease, where the interleavings the invariants look for happen.
      baseDelay: '100ms',
      maxElapsed: 30_000,
      throwOnError: false,
    })
    const post = async (key: string, payload: { intent: string; amount: number }): Promise<Response | undefined> => {
      const startedAt = proc.clock.now()
      const sent = history.sentAmounts.get(intentId(tenant, key)) ?? new Set<number>()
      sent.add(payload.amount)
      history.sentAmounts.set(intentId(tenant, key), sent)
      try {
        return await fetch('http://app/charges', {
          method: 'POST',
          // One intent in five is served like a Lambda invocation: with a run deadline (the app's clock, 1.5 leases on).
          // One in six is sent as text (a webhook relayed as it came), the engine fingerprinting its raw bytes; mostly
          // so is its reuse with the next amount, which must be told apart by those bytes alone.
          headers: {
            'content-type': Math.floor(payload.amount / 10) % 6 === 0 ? 'text/plain' : 'application/json',
            'x-tenant': tenant,
            ...(payload.amount % 5 === 1 ? { 'x-deadline': '1' } : {}),
          },
          body: JSON.stringify(payload),
          idempotencyKey: key,
        })
      } catch (error) {
        world.log(() => `client${index} ${tenant}/${key} gave up: ${(error as Error).message}`)
        return undefined
      } finally {
        const tookMs = proc.clock.now() - startedAt
        // maxElapsed bounds the call; an attempt in flight at that moment may add its timeout.
        if (tookMs > 30_000 + 2_500 + 1_000)
          history.violation(`client${index} waited ${tookMs}ms for ${tenant}/${key}, past maxElapsed + attemptTimeout`)
      }
    }
    type Payload = { intent: string; amount: number }
    /** Checks an answer to `payload`; `first` is the payload the key was first sent with, when this is a reuse. */
    const check = async (key: string, payload: Payload, response: Response | undefined, first?: Payload) => {
      const id = intentId(tenant, key)
      // A key sent in this tenant with this payload only is never refused as reused with another request,
      // whoever else (another tenant, another client) chose the same key.
      if (response?.status === 422 && (history.sentAmounts.get(id)?.size ?? 0) <= 1)
        history.violation(`${id} refused as a key reused with another request, though it was only ever sent with this one`)
      if (!response || response.status >= 300) return
      const text = await response.text()
      let answer: { tenant?: string; intent?: string; amount?: number; token?: number; charge?: { captured?: unknown }; captured?: unknown }
      try {
        answer = JSON.parse(text) as typeof answer
      } catch {
        history.violation(`${id} answered ${response.status} with a body that is not the handler's: ${text.slice(0, 60)}`)
        return
      }
      // A reuse may run only where the first request left nothing (no answer, no step, no outcome), and
      // never gets the first's answer.
      if (
        first &&
        (history.successes.has(id) ||
          history.traces.has(`${storeIntent(id)}|${first.amount}`) ||
          history.holderAmounts.get(holderId(`${SCOPE_PREFIX}${tenant}`, key, answer.token ?? 0)) !== payload.amount)
      )
        history.violation(`${id} answered ${response.status} to a reused key with another payload`)
      // An answer reaches only the caller it belongs to: its tenant, its payload.
      if (answer.tenant !== tenant || answer.intent !== payload.intent || answer.amount !== payload.amount)
        history.violation(`${id} got another intent's answer: ${text.slice(0, 80)}`)
      // Captured values are the first attempt's on every attempt: those the answer's holder captured are the ones
      // its charge was made with, even when another holder made the charge (a takeover replays both).
      if (answer.captured !== undefined && JSON.stringify(answer.captured) !== JSON.stringify(answer.charge?.captured))
        history.violation(
          `${id}: captured values ${JSON.stringify(answer.captured)} are not those the charge recorded, ${JSON.stringify(answer.charge?.captured)}`,
        )
      const seen = history.successes.get(id) ?? new Set<string>()
      seen.add(text)
      history.successes.set(id, seen)
    }

    for (let i = 0; i < intentsPerClient; i++) {
      // Most keys are fresh; some the caller chooses itself (an order number): a few shared by every client
      // of both tenants, each always sent with the same payload, which names no tenant. Within a tenant they
      // are one intent (answered once, the same bytes to all); across tenants, two that must stay apart.
      const chosen = rng.chance(0.2)
      const key = chosen ? `order-${rng.int(4)}` : nextKey()
      const payload = chosen
        ? { intent: key, amount: 500 + Number(key.slice(6)) }
        : { intent: intentId(tenant, key), amount: 100 + rng.int(900) }
      const roll = chosen ? rng.between(0, 0.85) : rng.next()
      if (roll < 0.15) {
        // A double submit: the same request twice at once.
        const [a, b] = await Promise.all([post(key, payload), post(key, payload)])
        await check(key, payload, a)
        await check(key, payload, b)
      } else {
        await check(key, payload, await post(key, payload))
      }
      // Whatever became of the first request (answered, given up, unrecorded), the key reused with another
      // payload: refused once the first left anything (an answer, a step, an outcome), never answered with
      // the first's result (check).
      if (roll > 0.85) {
        const other = { ...payload, amount: payload.amount + 1 }
        await check(key, other, await post(key, other), payload)
      }
      await proc.clock.sleep(rng.between(0, 300))
    }
    running--
  }

  world.at(rng.between(100, 1_000), null, chaos)

  /**
   * The fleet's retention job (`idemkey gc`, a store's gc loop), one batch of `limit` at a time, audited: it
   * removes records whose retention has ended and no other, as many as it says, up to its limit (fewer only
   * when fewer had ended). It runs beside the traffic, where nothing has ended yet (the TTL is an hour, an
   * abandoned attempt is kept a day), and once more when the run is over and the retention has passed.
   */
  const purge = async (limit: number): Promise<number> => {
    const everything = async () => server.inner.list({ includeExpired: true, limit: 100_000 })
    const nowMs = serverClock.now()
    const before = await everything()
    const purged = await server.inner.purgeExpired(limit)
    const left = new Set((await everything()).map((r) => intentId(r.scope, r.key)))
    const removed = before.filter((r) => !left.has(intentId(r.scope, r.key)))
    const ended = before.filter((r) => r.expiresAtMs <= nowMs).length
    if (removed.length !== purged) history.violation(`the retention job said it purged ${purged} records, and ${removed.length} went`)
    for (const r of removed)
      if (r.expiresAtMs > nowMs)
        history.violation(`the retention job purged ${r.scope}/${r.key} ${(r.expiresAtMs - nowMs).toFixed(0)}ms before its retention ended`)
    if (purged !== Math.min(limit, ended))
      history.violation(`the retention job purged ${purged} records in a batch of ${limit}, where ${ended} had ended`)
    return purged
  }
  /**
   * An operator's view (`idemkey list`, the operator page), audited beside the retention job: every record the
   * store was asked to hold is listed, as its answers left it (in progress or settled), oldest first; and a
   * filtered list (a tenant's scope, a status, a creation bound, a limit) is exactly the records of the whole
   * list that match it, in the same order, up to the limit.
   */
  const operator = async () => {
    const all = await server.inner.list({ limit: 100_000 })
    const listed = new Map(all.map((r) => [intentId(r.scope, r.key), r]))
    for (const [id, state] of server.states) {
      const record = listed.get(id)
      if (record === undefined) history.violation(`the store's list left out ${id}`)
      else if ((record.status === 'in_progress') !== (state.status === 'in_progress') || record.token !== state.token)
        history.violation(`the store's list shows ${id} ${record.status} #${record.token}, its record is ${state.status} #${state.token}`)
      // Tokens count up by one from 1 with each grant, so a record granted n times (none expired in a run) shows n attempts.
      else if (record.attempts !== state.token)
        history.violation(`the store's list shows ${id} with ${record.attempts} attempts, granted ${state.token} times`)
    }
    if (listed.size !== server.states.size)
      history.violation(`the store's list holds ${listed.size} records, ${server.states.size} were made`)
    for (const [i, record] of all.entries())
      if (i > 0 && (all[i - 1] as StoredRecord).createdAtMs > record.createdAtMs)
        history.violation(`the store's list is not oldest first at ${intentId(record.scope, record.key)}`)
    const middle = all[Math.floor(all.length / 2)]?.createdAtMs
    const filter: ListFilter = {
      ...gcRng.pick([{}, { scope: `${SCOPE_PREFIX}acme` }, { scope: `${SCOPE_PREFIX}globex` }, { scope: 'nobody' }]),
      ...gcRng.pick([{}, { status: 'in_progress' as const }, { status: 'completed' as const }, { status: 'failed' as const }]),
      ...(middle !== undefined && gcRng.chance(0.3) ? { createdBeforeMs: middle } : {}),
      limit: gcRng.pick([1, 3, 100_000]),
    }
    // The filter's rule (src/backends/records.ts, matchesFilter) written again on purpose: the audit must not share
    // the code it audits.
    const expected = all
      .filter(
        (r) =>
          (filter.scope === undefined || r.scope === filter.scope) &&
          (filter.status === undefined || r.status === filter.status) &&
          (filter.createdBeforeMs === undefined || r.createdAtMs <= filter.createdBeforeMs),
      )
      .slice(0, filter.limit)
      .map((r) => intentId(r.scope, r.key))
    const got = (await server.inner.list(filter)).map((r) => intentId(r.scope, r.key))
    if (got.join(' ') !== expected.join(' '))
      history.violation(`the store listed [${got.join(', ')}] for ${JSON.stringify(filter)}, where [${expected.join(', ')}] match`)
  }
  // Its own stream of choices, so that how often it runs leaves the rest of the schedule as it is.
  const gcRng = new Rng(options.seed ^ 0x5bd1e995)
  const retention = () => {
    void purge(gcRng.pick([1, 2, 1_000])).then(async () => {
      await operator()
      if (!finished()) world.at(gcRng.between(2_000, 8_000), null, retention)
    })
  }
  world.at(gcRng.between(500, 3_000), null, retention)
  const clients = Array.from({ length: clientCount }, (_, i) => client(i))
  // A run that makes seven times the events a seed ever needs is going nowhere (a retry loop that never
  // waits, a record that never settles): it stops and says so, rather than spinning until a timeout.
  const maxEvents = MAX_EVENTS_PER_INTENT * clientCount * intentsPerClient
  await world.run(() => finished() || world.fired > maxEvents, 10 * 60_000)
  if (world.fired > maxEvents) history.violation(`${world.fired} events and the clients are not done: no progress`)
  // Let every paused app wake and every lease run out, then read what the store holds.
  for (const app of apps) app.proc.resume()
  const firedBefore = world.fired
  await world.run(() => world.fired - firedBefore > maxEvents, world.now + 4 * LEASE_MS)
  if (world.fired - firedBefore > maxEvents)
    history.violation(`${world.fired - firedBefore} events after the clients finished: no progress`)
  void clients

  if (!finished()) history.violation(`clients still waiting after ${world.now.toFixed(0)}ms of simulated time (a wait that never ends)`)
  const intents = [...keyCounters.values()].reduce((a, b) => a + b, 0)
  // Progress: faults delay and lose work, but with eight tries in 30 s most intents are answered. A run
  // where fewer than a quarter are is one where the ledger stopped finishing work.
  if (history.successes.size < (clientCount * intentsPerClient) / 4)
    history.violation(`only ${history.successes.size} of ${clientCount * intentsPerClient} requests answered 2xx: no progress`)
  for (const [intent, count] of history.charges) {
    if (count > 1) history.violation(`${intent} charged ${count} times`)
  }
  for (const [intent, bodies] of history.successes) {
    if (bodies.size > 1 && !history.unrecorded.has(intent))
      history.violation(
        `${intent} answered with ${bodies.size} different bodies: ${[...bodies].map((b) => b.replace(/\s+/g, '')).join(' | ')}`,
      )
    if ((history.charges.get(intent) ?? 0) !== 1)
      history.violation(`${intent} answered 2xx but charged ${history.charges.get(intent) ?? 0} times`)
    const [tenant, key] = intent.split('/') as [string, string]
    const record = await server.inner.get(`${SCOPE_PREFIX}${tenant}`, key)
    // A 2xx is sent once its outcome is stored (or loudly unrecorded): the record says completed.
    if (record?.status !== 'completed' && !history.unrecorded.has(intent))
      history.violation(`${intent} answered 2xx but its record is ${record?.status ?? 'gone'}`)
    // A run through ledger.run stores what its work created with the record: the intent.
    if (
      throughRun(key) &&
      record?.status === 'completed' &&
      !history.unrecorded.has(intent) &&
      record.response &&
      record.resourceId !== (JSON.parse(decoder.decode(record.response.body)) as { intent: string }).intent
    )
      history.violation(`${intent}: its record's resourceId is ${record.resourceId}, not the intent the run created`)
    if (
      record?.status === 'completed' &&
      record.response &&
      !history.unrecorded.has(intent) &&
      !bodies.has(answerStored(key, decoder.decode(record.response.body)))
    ) {
      history.violation(`${intent}: the stored answer is not the one clients got`)
    }
  }
  // In a transaction the order row and the record commit together: an intent has one order, by the holder whose
  // outcome the store holds, when its record is completed, and none otherwise (declined, released, never done).
  for (const [tenant, count] of keyCounters) {
    for (let n = 1; n <= count; n++) {
      const key = `key-${n}`
      if (!throughTransaction(key)) continue
      const intent = intentId(tenant, key)
      const record = await server.inner.get(`${SCOPE_PREFIX}${tenant}`, key)
      const orders = history.orders.get(intent) ?? []
      const completed = record?.status === 'completed'
      if (orders.length !== (completed ? 1 : 0) || (completed && orders[0] !== holderId(record.scope, key, record.token)))
        history.violation(
          `${intent} has ${orders.length} order rows (${orders.join(', ')}), its record ${record ? `${record.status} #${record.token}` : 'gone'}`,
        )
    }
  }
  // What the ledgers reported (telemetry, events) is what happened (sim/telemetry.ts).
  await history.reports.check((scope, key) => server.inner.get(scope, key))
  // Every record belongs to the scope it was written under: a tenant's, never another's or none.
  const scopes = new Set(tenants.map((t) => `${SCOPE_PREFIX}${t}`))
  for (const record of await server.inner.list({ limit: 100_000 })) {
    if (!scopes.has(record.scope)) history.violation(`${record.scope}/${record.key} is in no tenant's scope`)
  }
  for (const record of await server.inner.list({ status: 'in_progress', limit: 100_000 })) {
    if ((record.lockedUntilMs ?? 0) > world.now)
      history.violation(`${record.scope}/${record.key} still in progress past its holders (locked until ${record.lockedUntilMs})`)
  }
  // The operator evicts a few records (`idemkey evict`), once the fleet is done: each is gone at once (`get`, `list`),
  // a second evict finds nothing, and neither does one of a record that never was.
  const records = await server.inner.list({ limit: 100_000 })
  for (let i = 0; i < 3 && records.length > 0; i++) {
    const { scope, key } = records.splice(gcRng.int(records.length), 1)[0] as StoredRecord
    const id = intentId(scope, key)
    if (!(await server.inner.evict(scope, key))) history.violation(`the store's evict of ${id} found nothing`)
    if ((await server.inner.get(scope, key)) !== null) history.violation(`${id} is still read after its evict`)
    if ((await server.inner.list({ scope, limit: 100_000 })).some((r) => r.key === key))
      history.violation(`${id} is still listed after its evict`)
    if (await server.inner.evict(scope, key)) history.violation(`the store evicted ${id} twice`)
  }
  if (await server.inner.evict(`${SCOPE_PREFIX}acme`, 'never-sent')) history.violation(`the store evicted a record that never was`)
  // A day on, every record's retention has ended: the retention job, in batches, leaves the store empty.
  const firedBeforeRetention = world.fired
  await world.run(() => world.fired - firedBeforeRetention > maxEvents, world.now + RETENTION_MS)
  // Once its retention has ended a record counts as absent, purged or not (docs/ledger.md, "Retention and purging").
  const ended = await server.inner.list({ includeExpired: true, limit: 100_000 })
  for (const record of ended)
    if ((await server.inner.get(record.scope, record.key)) !== null)
      history.violation(`${record.scope}/${record.key} is still read a day on, its retention ended`)
  // In batches, each as many as its limit while that many are left: the count goes down to nothing. (Not with
  // purge() above: its audit lists the store twice a batch, which a batch of one would pay for every record.)
  const batch = gcRng.pick([1, 7, 1_000])
  let left = ended.length
  for (let purged = batch; purged === batch && left > 0; ) {
    purged = await server.inner.purgeExpired(batch)
    if (purged !== Math.min(batch, left))
      history.violation(`the retention job purged ${purged} records in a batch of ${batch}, where ${left} had ended`)
    left -= purged
  }
  const kept = await server.inner.list({ includeExpired: true, limit: 100_000 })
  if (kept.length > 0) history.violation(`the retention job left ${kept.length} records whose retention had ended`)
  // The callers that get the API wrong, and the store at the exact edges of its time (sim/misuse.ts): a few cases a
  // seed, from a stream of choices of their own.
  await new Misuse(options.seed, (text) => history.violation(text), defect).run(MISUSE_CASES)
  return {
    seed: options.seed,
    requests: history.requests,
    intents,
    events: world.fired,
    simulatedMs: world.now,
    violations: history.violations,
    trace: world.trace(),
  }
}

/** The answer a record's stored response holds: the consumer that drives `ledger.begin` (sim/app.ts) stores it as JSON. */
const answerStored = (key: string, body: string) => (throughBegin(key) ? (JSON.parse(body) as { text: string }).text : body)

export type { Rng }
