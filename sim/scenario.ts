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
import { deriveKey } from '../src/core/derive-key.js'
import { Ledger } from '../src/core/ledger.js'
import { Renewal } from '../src/core/renewal.js'
import { StepLog } from '../src/core/steps.js'
import type { AcquireResult, IdempotencyStore, ListFilter, Outcome, StoredRecord } from '../src/core/store.js'
import { StoreCalls } from '../src/core/store-calls.js'
import { createEngine } from '../src/http/engine.js'
import type { HttpRequestLike, HttpResponseLike, IdempotencyContext } from '../src/http/types.js'
import { defectiveStore, type SimStore, STORE_DEFECTS, type StoreClockAhead, type StoreDefect } from './store-defects.js'
import { Proc, type Rng, type Settle, World } from './world.js'

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
  ...STORE_DEFECTS,
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

const LEASE_MS = 2_000
/** The ledger's store timeout in every app (a call unanswered this long fails). */
const STORE_TIMEOUT_MS = 400
/** The run deadline of a request served with one (a Lambda invocation's), from its arrival. */
const RUN_DEADLINE_MS = 1.5 * LEASE_MS
/**
 * Events per intent past which a run is stuck in a loop: a seed makes about 25 per intent (1,212 on average
 * for 48 intents over seeds 1 to 1,500, at most 1,724), so 250 is about seven times the most seen. A stuck
 * run (a mutant that retries without waiting) then fails as "no progress" in a tenth of a second.
 */
const MAX_EVENTS_PER_INTENT = 250
const TTL_MS = 3_600_000
const encoder = new TextEncoder()
const decoder = new TextDecoder()

/** A store error the ledger treats as the store being unavailable (a reset connection). */
class NetworkError extends Error {
  constructor(what: string) {
    super(`sim network: ${what}`)
    this.name = 'NetworkError'
  }
}

interface Faults {
  /** Probability that a request never arrives. */
  dropRequest: number
  /** Probability that the reply is lost after the server applied the request. */
  dropReply: number
  /** Probability of an immediate transient failure (connection reset). */
  transient: number
  /** One-way latency range, ms; a wide range reorders requests. */
  latency: [number, number]
}

/** What happened, as the checks need it. */
class History {
  readonly violations: string[] = []
  /** Bank charges applied, by intent. */
  readonly charges = new Map<string, number>()
  /** Bodies of the 2xx answers clients received, by intent. */
  readonly successes = new Map<string, Set<string>>()
  /** Step names recorded in the store when each holder (intent#token) acquired. */
  readonly recordedAtAcquire = new Map<string, Set<string>>()
  /** Holders whose renewal the store refused, as their own process learnt it. */
  readonly fencedHolders = new Set<string>()
  /**
   * Intents with an `unrecorded` outcome: the work ran, its outcome could not be stored within the
   * lease (the store unreachable, or the holder's clock jumped), and the handler's answer was sent
   * anyway, loudly (docs/ledger.md, "Store outages"). A later attempt may answer otherwise.
   */
  readonly unrecorded = new Set<string>()
  /** Each holder's lease as the store server granted it (true time), and its process as it was then. */
  readonly leases = new Map<string, { endsAtMs: number; proc: Proc; disturbances: number }>()
  /** The amount of the request each holder ran (its payload, as the handler read it). */
  readonly holderAmounts = new Map<string, number>()
  /**
   * What each payload of a record left that the store knows of, as `scope/key|amount`: a recorded step
   * or an outcome. A key reused with another payload may run while the first left nothing (docs/ledger.md:
   * an attempt that stored nothing protects nothing), and must be refused once it left something.
   */
  readonly traces = new Set<string>()
  /** How many times each holder has sent `complete` so far. */
  readonly completeTries = new Map<string, number>()
  /** Steps running now, by record (scope/key): the holder running each, so two at once are seen. */
  readonly running = new Map<string, Map<string, string>>()
  /** Holders that have sent at least one renewal. */
  readonly renewing = new Set<string>()
  /** Processes that were ever cut off from the store: their holders may lose a lease while alive. */
  readonly everCut = new Set<Proc>()
  /** The payloads (amounts) sent with each tenant/key so far: a key sent with one payload only is never a reuse. */
  readonly sentAmounts = new Map<string, Set<number>>()
  /** The run deadline of each holder that has one, on its process's clock: no renewal past it. */
  readonly deadlines = new Map<string, number>()
  requests = 0
  constructor(readonly world: World) {}

  violation(text: string): void {
    this.world.log(() => `VIOLATION ${text}`)
    if (this.violations.length < 20) this.violations.push(`t=${this.world.now.toFixed(1)}ms ${text}`)
  }
}

const intentId = (scope: string, key: string) => `${scope}/${key}`
/** The engine stores a tenant's keys under this scope prefix (its `scope` function's value: src/http/scope.ts). */
const SCOPE_PREFIX = 'fn:'
/** A client's intent (tenant/key) as the store names its record (scope/key). */
const storeIntent = (id: string) => `${SCOPE_PREFIX}${id}`
const holderId = (scope: string, key: string, token: number) => `${scope}/${key}#${token}`
/** True time as the store server's clock reads it (whole ms): leases end on its ticks. */
const storeTime = (ms: number) => Math.round(ms)

/**
 * The store server: the real MemoryStore on true time, audited. Every write by a holder whose token
 * is not the record's current one must change nothing; the steps a holder acquires with are noted.
 */
class StoreServer {
  constructor(
    readonly inner: SimStore,
    readonly history: History,
    readonly defect: Defect | undefined,
  ) {}

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    const before = await this.inner.get(scope, key)
    const result = await this.inner.acquire(scope, key, fingerprint, leaseMs)
    const { history } = this
    if (result.kind === 'acquired' && before?.status === 'in_progress') {
      // A takeover: allowed only once the previous holder's lease, as the store granted (or renewed, or
      // released) it, has ended in the store's own time.
      const previous = holderId(scope, key, before.token)
      const lease = history.leases.get(previous)
      // A live holder keeps its record: one still inside a step, its process up, never paused, its clock never
      // jumped and never cut off from the store, has asked to renew before its lease could end.
      const working = history.running.get(intentId(scope, key))?.has(previous) ?? false
      if (
        lease !== undefined &&
        working &&
        !history.renewing.has(previous) &&
        lease.proc.state === 'up' &&
        lease.proc.disturbances === lease.disturbances &&
        !history.everCut.has(lease.proc)
      )
        history.violation(`${previous} lost its record while alive and working: it never asked to renew its lease`)
      if (lease !== undefined && storeTime(history.world.now) < storeTime(lease.endsAtMs))
        history.violation(
          `${holderId(scope, key, result.token)} took over from ${previous} ${(lease.endsAtMs - history.world.now).toFixed(0)}ms before its lease ended in the store`,
        )
    }
    if (result.kind === 'replay' && (result.record.scope !== scope || result.record.key !== key))
      history.violation(`the store answered ${scope}/${key} with the record of ${result.record.scope}/${result.record.key}`)
    if (result.kind === 'acquired') {
      const recorded = new Set((result.steps ?? []).filter((s) => s.result !== null).map((s) => s.name))
      this.history.recordedAtAcquire.set(holderId(scope, key, result.token), recorded)
    }
    if (result.kind === 'replay' && this.defect === 'reencode' && result.record.response) {
      // Defect: the replay re-encodes the stored body instead of returning its bytes.
      const body = encoder.encode(JSON.stringify(JSON.parse(decoder.decode(result.record.response.body))))
      return { kind: 'replay', record: { ...result.record, response: { ...result.record.response, body } } }
    }
    return result
  }

  async fenced<R>(operation: string, scope: string, key: string, token: number, write: (token: number) => Promise<R>): Promise<R> {
    const before = await this.inner.get(scope, key)
    const current = before !== null && before.status === 'in_progress' && before.token === token
    // Defect: complete without its fence (the store takes the write whatever the token).
    const effective = this.defect === 'fence' && operation === 'complete' && before?.status === 'in_progress' ? before.token : token
    const result = await write(effective)
    if (result === true && (operation === 'complete' || operation === 'recordStep')) {
      const amount = this.history.holderAmounts.get(holderId(scope, key, token))
      if (amount !== undefined) this.history.traces.add(`${intentId(scope, key)}|${amount}`)
    }
    if (result === true && !current) {
      this.history.violation(
        `fenced-out holder ${holderId(scope, key, token)} changed the record with ${operation} (current: ${before?.status} #${before?.token})`,
      )
    }
    return result
  }
}

/** An app process's connection to the store server, through the simulated network. */
class NetworkStore implements IdempotencyStore {
  readonly name = 'sim'
  // A remote store: the ledger times each call (on the process's clock) and trusts the server's time.
  readonly serverClock = true
  /**
   * While set, this process is cut off from the store server (a partition or an outage as it sees it):
   * every call fails fast (`reset`, a refused connection) or is never answered (`lost`, a timeout); or
   * only its renewals fail (`renewals`: the store refuses them for a while, every other call passes).
   */
  cut: 'reset' | 'lost' | 'renewals' | null = null

  constructor(
    readonly proc: Proc,
    readonly server: StoreServer,
    readonly faults: Faults,
    readonly history: History,
    readonly defect: Defect | undefined,
  ) {}

  #call<R>(label: string, apply: () => Promise<R>): Promise<R> {
    const { world } = this.proc
    const rng = world.rng
    return new Promise<R>((resolve, reject) => {
      const [min, max] = this.faults.latency
      if (this.cut === 'lost') {
        world.log(() => `${this.proc.id} store ${label}: lost (cut off from the store)`)
        return
      }
      if (this.cut === 'reset' || (this.cut === 'renewals' && label.startsWith('renew ')) || rng.chance(this.faults.transient)) {
        world.log(() => `${this.proc.id} store ${label}: connection reset`)
        world.at(rng.between(min, max), this.proc, () => reject(new NetworkError(`${label}: connection reset`)))
        return
      }
      if (rng.chance(this.faults.dropRequest)) {
        world.log(() => `${this.proc.id} store ${label}: request lost`)
        return
      }
      world.at(rng.between(min, max), null, () => {
        apply().then(
          (value) => {
            if (rng.chance(this.faults.dropReply)) {
              world.log(() => `${this.proc.id} store ${label}: applied, reply lost`)
              return
            }
            world.log(() => `${this.proc.id} store ${label} -> ${JSON.stringify(value)?.slice(0, 80)}`)
            world.at(rng.between(min, max), this.proc, () => resolve(value))
          },
          (error: unknown) => world.at(rng.between(min, max), this.proc, () => reject(error)),
        )
      })
    })
  }

  /** Notes, at the store, when the lease of `holder` ends: granted now for `leaseMs`. */
  #leased(holder: string, leaseMs: number, disturbances: number): void {
    const { proc } = this
    const endsAtMs = proc.world.now + leaseMs
    const lease = this.history.leases.get(holder)
    if (lease) lease.endsAtMs = endsAtMs
    else this.history.leases.set(holder, { endsAtMs, proc, disturbances })
  }

  acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    // The holder's view of its lease starts when it asks: a pause from then on makes it a zombie.
    const disturbances = this.proc.disturbances
    return this.#call(`acquire ${scope}/${key}`, async () => {
      const result = await this.server.acquire(scope, key, fingerprint, leaseMs)
      if (result.kind === 'acquired') this.#leased(holderId(scope, key, result.token), leaseMs, disturbances)
      return result
    })
  }

  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    const holder = holderId(scope, key, token)
    this.history.renewing.add(holder)
    // Past the run's deadline no renewal is made (src/core/renewal.ts): the lease ends there.
    const deadlineMs = this.history.deadlines.get(holder)
    if (deadlineMs !== undefined && this.proc.clock.now() >= deadlineMs)
      this.history.violation(`${holder} renewed its lease ${(this.proc.clock.now() - deadlineMs).toFixed(0)}ms past its run deadline`)
    const call = this.#call(`renew ${holder}`, async () => {
      const applied = await this.server.fenced('renew', scope, key, token, (t) => this.server.inner.renew(scope, key, t, leaseMs))
      if (applied) this.#leased(holder, leaseMs, this.proc.disturbances)
      return applied
    })
    // Defect renew-errors: a renewal that failed (an error) is taken for a success, so failures never add up to a lost lease.
    const renewed = this.defect === 'renew-errors' ? await call.catch(() => true) : await call
    if (!renewed) this.history.fencedHolders.add(holderId(scope, key, token))
    // Defect: the ledger is told a refused renewal succeeded, so the holder keeps working.
    return this.defect === 'renew' ? true : renewed
  }

  complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    const holder = holderId(scope, key, token)
    const tries = (this.history.completeTries.get(holder) ?? 0) + 1
    this.history.completeTries.set(holder, tries)
    return this.#call(`complete ${holder}`, () => {
      if (tries > 1) this.#checkRetryInLease(holder, tries)
      return this.server.fenced('complete', scope, key, token, (t) => this.server.inner.complete(scope, key, t, outcome, ttlMs))
    })
  }

  /**
   * The ledger retries `complete` only while its lease protects the record, so that every retry
   * reaches the store before the lease ends (docs/ledger.md, "Store outages"): past it, another
   * holder may run the intent again while this one still means to store its outcome. A holder whose
   * process paused or whose clock jumped meanwhile is exempt: it is a zombie and the fence stops it.
   * The first try is always made, so only retries are held to it.
   */
  #checkRetryInLease(holder: string, tries: number): void {
    const lease = this.history.leases.get(holder)
    const nowMs = this.proc.world.now
    if (lease === undefined || nowMs <= lease.endsAtMs || lease.proc.disturbances !== lease.disturbances) return
    this.history.violation(`${holder} retried complete (try ${tries}) ${(nowMs - lease.endsAtMs).toFixed(0)}ms after its lease ended`)
  }

  release(scope: string, key: string, token: number): Promise<boolean> {
    return this.#call(`release ${holderId(scope, key, token)}`, () =>
      this.server.fenced('release', scope, key, token, async (t) => {
        const released = await this.server.inner.release(scope, key, t)
        // Released, the lease ends now: another holder may take the record at once.
        const lease = this.history.leases.get(holderId(scope, key, token))
        if (released && lease) lease.endsAtMs = this.proc.world.now
        return released
      }),
    )
  }

  recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    return this.#call(`recordStep ${holderId(scope, key, token)} ${name}`, () =>
      this.server.fenced('recordStep', scope, key, token, (t) => this.server.inner.recordStep(scope, key, t, name, result)),
    )
  }

  get(scope: string, key: string): Promise<StoredRecord | null> {
    return this.#call(`get ${scope}/${key}`, () => this.server.inner.get(scope, key))
  }

  list(filter?: ListFilter): Promise<StoredRecord[]> {
    return this.#call('list', () => this.server.inner.list(filter))
  }

  purgeExpired(limit: number): Promise<number> {
    return this.#call('purge', () => this.server.inner.purgeExpired(limit))
  }

  evict(scope: string, key: string): Promise<boolean> {
    return this.#call(`evict ${scope}/${key}`, () => this.server.inner.evict(scope, key))
  }

  async close(): Promise<void> {}
}

/** The downstream bank: one charge per derived key, whatever the retries; counts charges per intent. */
class Bank {
  readonly #byKey = new Map<string, number>()
  #next = 1
  constructor(readonly history: History) {}

  charge(bankKey: string, intent: string): number {
    const existing = this.#byKey.get(bankKey)
    if (existing !== undefined) return existing
    const id = this.#next++
    this.#byKey.set(bankKey, id)
    this.history.charges.set(intent, (this.history.charges.get(intent) ?? 0) + 1)
    return id
  }
}

/** An app instance: the real Ledger and HTTP engine on the process's clock, with the payments handler. */
class App {
  readonly proc: Proc
  readonly store: NetworkStore
  readonly handle: (req: HttpRequestLike) => Promise<HttpResponseLike>

  constructor(world: World, id: string, server: StoreServer, bank: Bank, faults: Faults, history: History, defect: Defect | undefined) {
    const rng = world.rng
    this.proc = new Proc(world, id, rng.between(-300, 300))
    const proc = this.proc
    const store = new NetworkStore(proc, server, faults, history, defect)
    this.store = store
    const ledger = new Ledger({
      store,
      clock: proc.clock,
      storeTimeoutClock: proc.clock,
      lease: LEASE_MS,
      wait: 1_000,
      ttl: TTL_MS,
      storeTimeout: STORE_TIMEOUT_MS,
      onEvent: (event) => {
        if (event.type === 'unrecorded') history.unrecorded.add(intentId(event.scope.replace(/^fn:/, ''), event.key))
      },
    })
    // The run deadline of each request that has one, by request: the handler notes it under its holder.
    const deadlines = new WeakMap<HttpRequestLike, number>()
    const engine = createEngine(
      { ledger, scope: (req) => String(req.headers['x-tenant']) },
      {
        runOptionsOf: (req) => {
          if (req.headers['x-deadline'] === undefined) return {}
          const deadlineMs = proc.clock.now() + RUN_DEADLINE_MS
          deadlines.set(req, deadlineMs)
          return { deadlineMs }
        },
      },
    )
    const network = (ms: number) => new Promise<void>((resolve) => world.at(ms, proc, resolve))

    /** The payments handler: reserve, charge at the bank (keyed by a derived key), email; each a durable step. */
    const pay = async (req: HttpRequestLike, ctx: IdempotencyContext | undefined): Promise<HttpResponseLike> => {
      const scope = String(req.headers['x-tenant'])
      const input = JSON.parse(decoder.decode(await req.body(1_024))) as { intent: string; amount: number }
      if (!ctx) return { status: 400, headers: {}, body: new Uint8Array(0) }
      const holder = holderId(ctx.scope, ctx.key, ctx.token)
      history.holderAmounts.set(holder, input.amount)
      const deadlineMs = deadlines.get(req)
      if (deadlineMs !== undefined) history.deadlines.set(holder, deadlineMs)
      const record = intentId(ctx.scope, ctx.key)
      // A holder whose lease ended in the store a while ago (renewals every third of a lease, each failing
      // within two store timeouts) while its process ran undisturbed has seen its renewals fail for a whole
      // lease: its signal is aborted before it starts or goes on from a step (src/core/renewal.ts).
      const signal = ctx.signal
      if (!(signal instanceof AbortSignal)) history.violation(`${holder} was handed no abort signal`)
      const lostSignal = (when: string) => {
        const lease = history.leases.get(holder)
        if (
          lease !== undefined &&
          storeTime(world.now) > storeTime(lease.endsAtMs) + LEASE_MS / 3 + 2 * STORE_TIMEOUT_MS + 100 &&
          proc.state === 'up' &&
          proc.disturbances === lease.disturbances &&
          !signal.aborted
        )
          history.violation(
            `${holder} ${when}, ${(world.now - lease.endsAtMs).toFixed(0)}ms after its lease ended in the store, and its signal is not aborted`,
          )
      }
      const run = async <T>(name: string, fn: () => Promise<T> | T): Promise<T> =>
        ctx.step(name, async (step) => {
          lostSignal(`started step ${name}`)
          if (step.signal !== signal) history.violation(`step ${name} of ${holder} sees another signal than its attempt's`)
          if (history.recordedAtAcquire.get(holder)?.has(name))
            history.violation(`step ${name} of ${holder} ran again after it was recorded`)
          if (history.fencedHolders.has(holder)) history.violation(`${holder} ran step ${name} after the store refused its renewal`)
          world.log(() => `${proc.id} ${holder} runs step ${name}`)
          // The work of one intent never runs twice at once: no two holders of the record inside a step
          // while both their leases last in the store (a zombie's has ended: the fence stops its writes).
          const running = history.running.get(record) ?? new Map<string, string>()
          history.running.set(record, running)
          const own = history.leases.get(holder)
          for (const [other, step] of running) {
            const lease = history.leases.get(other)
            if (
              other !== holder &&
              lease !== undefined &&
              own !== undefined &&
              storeTime(world.now) < storeTime(Math.min(lease.endsAtMs, own.endsAtMs))
            )
              history.violation(
                `the work of ${record} ran twice at once: ${holder} started ${name} while ${other} ran ${step} in its lease`,
              )
          }
          running.set(holder, name)
          try {
            return await fn()
          } finally {
            running.delete(holder)
            lostSignal(`ran step ${name} to its end`)
          }
        })
      await run('reserve', async () => {
        // Now and then a slow reservation, alive: longer than a lease, so the holder must renew to keep it.
        await network(rng.chance(0.05) ? rng.between(LEASE_MS * 0.5, LEASE_MS * 2.5) : rng.between(1, 30))
        return { reserved: input.amount }
      })
      // One intent in three captures values (durable: every attempt gets the first attempt's) and charges with
      // them: the answer carries both what this attempt captured and what the charge step recorded, which
      // must be the same (checked by the client). uuid() and random() are not seeded: they are only compared.
      const captured =
        input.amount % 3 === 0
          ? {
              at: await ctx.now(),
              ref: await ctx.uuid(),
              luck: await ctx.random(),
              mark: await ctx.capture('mark', () => `${holder}@${world.now}`),
            }
          : undefined
      if (
        captured &&
        (typeof captured.at !== 'number' ||
          !/^[0-9a-f-]{36}$/.test(String(captured.ref)) ||
          !(typeof captured.luck === 'number' && captured.luck >= 0 && captured.luck < 1) ||
          !String(captured.mark).startsWith(`${record}#`))
      )
        history.violation(
          `${holder} captured values that are not a time, a uuid, a random number and its mark: ${JSON.stringify(captured)}`,
        )
      const charge = await run('charge', async () => {
        await network(rng.between(1, 30))
        if (rng.chance(0.03)) throw new NetworkError('bank unavailable') // transient: released, retried
        // The bank is shared by the tenants: its key is the tenant's account and the key derived from the request's.
        const id = bank.charge(`${scope}|${deriveKey(ctx.key, 'charge')}`, intentId(scope, ctx.key))
        return captured ? { id, captured } : id
      })
      await run('email', async () => {
        await network(rng.between(1, 20))
        return true
      })
      // Pretty-printed on purpose: a replay that re-encodes the JSON changes these bytes.
      const body = encoder.encode(
        JSON.stringify(
          { intent: input.intent, amount: input.amount, tenant: scope, charge, captured, by: proc.id, token: ctx.token },
          null,
          1,
        ),
      )
      return { status: 201, headers: { 'content-type': 'application/json' }, body }
    }

    this.handle = async (req) => {
      try {
        return await engine.handle(req, (ctx) => pay(req, ctx))
      } catch (error) {
        return { status: 500, headers: {}, body: encoder.encode(String(error)) }
      }
    }
  }
}

function headerRecord(headers: Headers): Record<string, string> {
  const record: Record<string, string> = {}
  headers.forEach((value, name) => {
    record[name] = value
  })
  return record
}

/** What the client reads of a response's headers: `get`, by any case. */
class SimHeaders {
  readonly #byName = new Map<string, string>()
  constructor(headers: HttpResponseLike['headers']) {
    for (const name in headers) {
      const value = headers[name] as string | string[]
      // As a fetch Headers reads a repeated header: its values joined.
      this.#byName.set(name.toLowerCase(), Array.isArray(value) ? value.join(', ') : value)
    }
  }
  get(name: string): string | null {
    return this.#byName.get(name.toLowerCase()) ?? null
  }
  has(name: string): boolean {
    return this.#byName.has(name.toLowerCase())
  }
}

/**
 * The response a client receives through the simulated network: what the client and the checks read
 * of a fetch `Response` (status, headers, the body as text, JSON or bytes, a clone), without the
 * streams a real one builds, which cost more than the rest of a simulated request.
 */
class SimResponse {
  readonly status: number
  readonly ok: boolean
  readonly headers: SimHeaders
  readonly #bytes: Uint8Array
  readonly body: { cancel: () => Promise<void> } | null

  constructor(response: HttpResponseLike) {
    this.status = response.status
    this.ok = response.status >= 200 && response.status < 300
    this.headers = new SimHeaders(response.headers)
    this.#bytes = response.body
    this.body = response.body.byteLength ? { cancel: async () => {} } : null
  }

  async arrayBuffer(): Promise<ArrayBuffer> {
    return this.#bytes.slice().buffer as ArrayBuffer
  }

  async text(): Promise<string> {
    return decoder.decode(this.#bytes)
  }

  async json(): Promise<unknown> {
    return JSON.parse(decoder.decode(this.#bytes))
  }

  clone(): SimResponse {
    return this
  }
}

/**
 * Defect late-complete: the ledger's real complete retry, counting to one lease past the lease's end
 * instead of to shortly before it (src/core/store-calls.ts). Undone by the function returned.
 */
function completeRetryPastTheLease(): () => void {
  const complete = StoreCalls.prototype.complete
  StoreCalls.prototype.complete = function (this: StoreCalls, scope, key, token, outcome, plan, leaseEndsAtMs) {
    return complete.call(this, scope, key, token, outcome, plan, leaseEndsAtMs + plan.leaseMs)
  }
  return () => {
    StoreCalls.prototype.complete = complete
  }
}

/**
 * Defect fresh-capture: the real step log's now(), uuid(), random() and capture() (src/core/steps.ts) compute
 * anew on every attempt instead of returning the first attempt's values. Undone by the function returned.
 */
function freshCaptures(): () => void {
  const proto = StepLog.prototype
  const { now, uuid, random, capture } = proto
  // A fresh value on every call, deterministic (a counter): no attempt ever sees another's.
  let fresh = 0
  proto.now = async () => ++fresh
  proto.uuid = async () => `00000000-0000-4000-8000-${String(++fresh).padStart(12, '0')}`
  proto.random = async () => ++fresh / 1e9
  proto.capture = async (_name, fn) => fn()
  return () => Object.assign(proto, { now, uuid, random, capture })
}

/** Defect no-renew: the ledger's renewal never fires (src/core/renewal.ts), so a slow holder loses its lease. */
function noRenewal(): () => void {
  const fire = Renewal.prototype.fire
  Renewal.prototype.fire = () => {}
  return () => {
    Renewal.prototype.fire = fire
  }
}

export async function runScenario(options: ScenarioOptions): Promise<ScenarioResult> {
  const undo =
    options.defect === 'late-complete'
      ? completeRetryPastTheLease()
      : options.defect === 'no-renew'
        ? noRenewal()
        : options.defect === 'fresh-capture'
          ? freshCaptures()
          : undefined
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
      const forMs = rng.between(LEASE_MS * 0.25, LEASE_MS * 2)
      // Or only its renewals refused, for a while: a holder whose renewals fail for a whole lease must see its signal aborted.
      const mode = rng.pick(['reset', 'lost', 'renewals'] as const)
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
          headers: { 'content-type': 'application/json', 'x-tenant': tenant, ...(payload.amount % 5 === 1 ? { 'x-deadline': '1' } : {}) },
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
    if (
      record?.status === 'completed' &&
      record.response &&
      !history.unrecorded.has(intent) &&
      !bodies.has(decoder.decode(record.response.body))
    ) {
      history.violation(`${intent}: the stored answer is not the one clients got`)
    }
  }
  // Every record belongs to the scope it was written under: a tenant's, never another's or none.
  const scopes = new Set(tenants.map((t) => `${SCOPE_PREFIX}${t}`))
  for (const record of await server.inner.list({ limit: 100_000 })) {
    if (!scopes.has(record.scope)) history.violation(`${record.scope}/${record.key} is in no tenant's scope`)
  }
  for (const record of await server.inner.list({ status: 'in_progress', limit: 100_000 })) {
    if ((record.lockedUntilMs ?? 0) > world.now)
      history.violation(`${record.scope}/${record.key} still in progress past its holders (locked until ${record.lockedUntilMs})`)
  }
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

export type { Rng }
