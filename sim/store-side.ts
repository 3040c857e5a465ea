/**
 * The store side of a simulated deployment (sim/scenario.ts): the store server (the real MemoryStore, audited),
 * each app's connection to it over the faulty network, the downstream bank, and the history the checks read.
 */

import { deriveKey } from '../src/core/derive-key.js'
import { CAPTURE_PREFIX } from '../src/core/steps.js'
import type { AcquireResult, IdempotencyStore, ListFilter, Outcome, StoredRecord } from '../src/core/store.js'
import type { Defect } from './scenario.js'
import type { SimStore } from './store-defects.js'
import { ReportAudit } from './telemetry.js'
import type { Proc, World } from './world.js'

export const LEASE_MS = 2_000
/** The ledger's store timeout in every app (a call unanswered this long fails). */
export const STORE_TIMEOUT_MS = 400
/** The run deadline of a request served with one (a Lambda invocation's), from its arrival. */
export const RUN_DEADLINE_MS = 1.5 * LEASE_MS
/**
 * Events per intent past which a run is stuck in a loop: a seed makes about 25 per intent (1,212 on average
 * for 48 intents over seeds 1 to 1,500, at most 1,724), so 250 is about seven times the most seen. A stuck
 * run (a mutant that retries without waiting) then fails as "no progress" in a tenth of a second.
 */
export const MAX_EVENTS_PER_INTENT = 250
export const TTL_MS = 3_600_000
export const encoder = new TextEncoder()
export const decoder = new TextDecoder()

/** A store error the ledger treats as the store being unavailable (a reset connection). */
export class NetworkError extends Error {
  constructor(what: string) {
    super(`sim network: ${what}`)
    this.name = 'NetworkError'
  }
}

export interface Faults {
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
export class History {
  readonly violations: string[] = []
  /** Bank charges applied, by intent. */
  readonly charges = new Map<string, number>()
  /** Bodies of the 2xx answers clients received, by intent. */
  readonly successes = new Map<string, Set<string>>()
  /** Step names recorded in the store when each holder (intent#token) acquired. */
  readonly recordedAtAcquire = new Map<string, Set<string>>()
  /** Steps started (a marker) but not recorded in the store when each holder acquired: what `reconcile` must get. */
  readonly pendingAtAcquire = new Map<string, Set<string>>()
  /** Steps with a started marker sent to the store, as `scope/key|name`. */
  readonly markers = new Set<string>()
  /** Holders whose `reconcile` was called. */
  readonly reconciling = new Set<string>()
  /** Steps each holder's `reconcile` recorded: they must not run in that holder. */
  readonly reconciled = new Map<string, Set<string>>()
  /** Holders whose renewal the store refused, as their own process learnt it. */
  readonly fencedHolders = new Set<string>()
  /**
   * Intents with an `unrecorded` outcome: the work ran, its outcome could not be stored within the
   * lease (the store unreachable, or the holder's clock jumped), and the handler's answer was sent
   * anyway, loudly (docs/ledger.md, "Store outages"). A later attempt may answer otherwise.
   */
  readonly unrecorded = new Set<string>()
  /**
   * Holders of the consumer that drives `ledger.begin` itself (sim/app.ts) that handed `finish` a final value:
   * the work ran, so from then on they never release the record (a retry would run the work again at once).
   */
  readonly finishing = new Set<string>()
  /** Those of them whose value JSON cannot hold (a BigInt): `finish` refuses it, and the record stays held. */
  readonly unstorable = new Set<string>()
  /** Holders whose process learnt that the store refused to record one of their steps (a stale token). */
  readonly stepRefused = new Set<string>()
  /** The status each holder's `unrecorded` event named. */
  readonly unrecordedStatus = new Map<string, string>()
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
  /**
   * Each holder's last grant as its own process can know it (true time): the acquire as the store granted it,
   * then each renewal whose grant reached the process, from when it was sent, and when that lease ends. A
   * renewal applied whose reply was lost extends the lease in the store, not here.
   */
  readonly lastGrant = new Map<string, { atMs: number; endsAtMs: number }>()
  /** Renewals each holder sent (a holder in it has asked to renew), and how many its process was told were granted. */
  readonly renewalsSent = new Map<string, number>()
  readonly renewalsGranted = new Map<string, number>()
  /** Processes that were ever cut off from the store: their holders may lose a lease while alive. */
  readonly everCut = new Set<Proc>()
  /** The payloads (amounts) sent with each tenant/key so far: a key sent with one payload only is never a reuse. */
  readonly sentAmounts = new Map<string, Set<number>>()
  /** The run deadline of each holder that has one, on its process's clock: no renewal past it. */
  readonly deadlines = new Map<string, number>()
  /** What the ledgers' telemetry and listeners were told, audited when the seed's run is over (sim/telemetry.ts). */
  readonly reports = new ReportAudit(this)
  requests = 0
  constructor(readonly world: World) {}

  readonly #derivedKeys = new Map<string, string>()
  /** `deriveKey(key, step)`, computed once per key and step (an HMAC: a cost every step would pay again). */
  derivedKey(key: string, step: string): string {
    const id = `${key}\n${step}`
    let derived = this.#derivedKeys.get(id)
    if (derived === undefined) {
      derived = deriveKey(key, step)
      this.#derivedKeys.set(id, derived)
    }
    return derived
  }

  /** The first token before `token` the store granted this record to (an earlier attempt), if any. */
  earlierGrant(scope: string, key: string, token: number): number | undefined {
    for (let earlier = 1; earlier < token; earlier++) if (this.leases.has(holderId(scope, key, earlier))) return earlier
    return undefined
  }

  violation(text: string): void {
    this.world.log(() => `VIOLATION ${text}`)
    if (this.violations.length < 20) this.violations.push(`t=${this.world.now.toFixed(1)}ms ${text}`)
  }
}

export const intentId = (scope: string, key: string) => `${scope}/${key}`
/** The engine stores a tenant's keys under this scope prefix (its `scope` function's value: src/http/scope.ts). */
export const SCOPE_PREFIX = 'fn:'
/** A client's intent (tenant/key) as the store names its record (scope/key). */
export const storeIntent = (id: string) => `${SCOPE_PREFIX}${id}`
/** The tenant whose record a store scope names (the inverse of the engine's prefix). */
export const tenantOf = (scope: string) => (scope.startsWith(SCOPE_PREFIX) ? scope.slice(SCOPE_PREFIX.length) : scope)
export const holderId = (scope: string, key: string, token: number) => `${scope}/${key}#${token}`
/** True time as the store server's clock reads it (whole ms): leases end on its ticks. */
export const storeTime = (ms: number) => Math.round(ms)

/**
 * The store server: the real MemoryStore on true time, audited. Every write by a holder whose token
 * is not the record's current one must change nothing; the steps a holder acquires with are noted.
 */
export class StoreServer {
  /**
   * Each record's status and token as the store's own answers left them: what `get` would say of them, kept
   * here so that the audit of every write does not copy the record (a released record stays in progress
   * under its token, as the store keeps it; the store refuses that token's writes once its lease is over).
   */
  readonly #states = new Map<string, { status: 'in_progress' | 'completed or failed'; token: number }>()
  /** Each record's steps as the store's answers to `recordStep` left them (a result is never turned back into a marker). */
  readonly #steps = new Map<string, Map<string, string | null>>()

  constructor(
    readonly inner: SimStore,
    readonly history: History,
    readonly defect: Defect | undefined,
  ) {}

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    const id = intentId(scope, key)
    const before = this.#states.get(id)
    const result = await this.inner.acquire(scope, key, fingerprint, leaseMs)
    if (result.kind === 'acquired') this.#states.set(id, { status: 'in_progress', token: result.token })
    const { history } = this
    this.#auditAnswer(scope, key, before, result)
    if (result.kind === 'acquired' && before?.status === 'in_progress') {
      // A takeover: allowed only once the previous holder's lease, as the store granted (or renewed, or
      // released) it, has ended in the store's own time.
      const previous = holderId(scope, key, before.token)
      const lease = history.leases.get(previous)
      // A live holder keeps its record: one still inside a step, its process up, never paused, its clock never
      // jumped and never cut off from the store, has asked to renew before its lease could end.
      const working = history.running.get(intentId(scope, key))?.has(previous) ?? false
      const deadlineMs = history.deadlines.get(previous)
      if (
        lease !== undefined &&
        working &&
        !history.renewalsSent.has(previous) &&
        lease.proc.state === 'up' &&
        lease.proc.disturbances === lease.disturbances &&
        !history.everCut.has(lease.proc) &&
        // A holder past its run deadline renews no more: its lease ends there (it may have started past it).
        !(deadlineMs !== undefined && lease.proc.clock.now() >= deadlineMs)
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
      const pending = new Set((result.steps ?? []).filter((s) => s.result === null).map((s) => s.name))
      this.history.pendingAtAcquire.set(holderId(scope, key, result.token), pending)
    }
    if (result.kind === 'replay' && this.defect === 'reencode' && result.record.response) {
      // Defect: the replay re-encodes the stored body instead of returning its bytes.
      const body = encoder.encode(JSON.stringify(JSON.parse(decoder.decode(result.record.response.body))))
      return { kind: 'replay', record: { ...result.record, response: { ...result.record.response, body } } }
    }
    return result
  }

  /**
   * The store answers an acquire as the record stands (docs/ledger.md; the store contract): a replay only of a
   * completed or failed record; `in_progress` only while a holder's lease lasts, in the store's own time; and a
   * record acquired again comes with the steps recorded under it, each as it was last recorded (a new record
   * with none).
   */
  #auditAnswer(scope: string, key: string, before: { status: string; token: number } | undefined, result: AcquireResult): void {
    const { history } = this
    const id = intentId(scope, key)
    if (result.kind === 'replay' && before?.status !== 'completed or failed')
      history.violation(`the store replayed ${id}, whose record is ${before ? `${before.status} #${before.token}` : 'not there'}`)
    if (result.kind === 'in_progress') {
      const lease = before?.status === 'in_progress' ? history.leases.get(holderId(scope, key, before.token)) : undefined
      if (before?.status !== 'in_progress' || (lease !== undefined && storeTime(history.world.now) > storeTime(lease.endsAtMs) + 1))
        history.violation(
          `the store answered ${id} in progress, ${lease ? `${(history.world.now - lease.endsAtMs).toFixed(0)}ms after its lease ended` : `its record ${before?.status ?? 'not there'}`}`,
        )
    }
    if (result.kind !== 'acquired') return
    if (before === undefined) this.#steps.delete(id)
    const expected = [...(this.#steps.get(id) ?? new Map<string, string | null>())].map(([name, r]) => `${name}=${r}`).sort()
    const given = (result.steps ?? []).map((step) => `${step.name}=${step.result}`).sort()
    if (expected.join('|') !== given.join('|'))
      history.violation(
        `the store handed ${holderId(scope, key, result.token)} the steps [${given.join(', ')}], where [${expected.join(', ')}] were recorded`,
      )
  }

  /**
   * Notes a step the store took from a holder (`recordStep` answered true). The rule is `applyStep`'s
   * (src/core/steps.ts), written again here on purpose: the audit must not share the code it audits.
   */
  stepRecorded(scope: string, key: string, name: string, result: string | null): void {
    const id = intentId(scope, key)
    const steps = this.#steps.get(id) ?? new Map<string, string | null>()
    this.#steps.set(id, steps)
    if (result === null && typeof steps.get(name) === 'string') return
    steps.set(name, result)
  }

  async fenced<R>(operation: string, scope: string, key: string, token: number, write: (token: number) => Promise<R>): Promise<R> {
    const id = intentId(scope, key)
    const before = this.#states.get(id)
    const current = before !== undefined && before.status === 'in_progress' && before.token === token
    // Defect: complete without its fence (the store takes the write whatever the token).
    const effective = this.defect === 'fence' && operation === 'complete' && before?.status === 'in_progress' ? before.token : token
    const result = await write(effective)
    if (typeof result !== 'boolean')
      this.history.violation(`the store answered ${operation} of ${holderId(scope, key, token)} with ${String(result)}`)
    if (result === true && operation === 'complete' && before) this.#states.set(id, { status: 'completed or failed', token: before.token })
    if (result === true && (operation === 'complete' || operation === 'recordStep')) {
      const amount = this.history.holderAmounts.get(holderId(scope, key, token))
      if (amount !== undefined) this.history.traces.add(`${intentId(scope, key)}|${amount}`)
    }
    // The converse: the current holder's write, inside its lease in the store's own time, is applied.
    const lease = this.history.leases.get(holderId(scope, key, token))
    if (result === false && current && lease !== undefined && storeTime(this.history.world.now) < storeTime(lease.endsAtMs) - 1)
      this.history.violation(
        `the store refused ${operation} of ${holderId(scope, key, token)}, the current holder, ${(lease.endsAtMs - this.history.world.now).toFixed(0)}ms before its lease ended`,
      )
    if (result === true && !current) {
      this.history.violation(
        `fenced-out holder ${holderId(scope, key, token)} changed the record with ${operation} (current: ${before?.status} #${before?.token})`,
      )
    }
    return result
  }
}

/** An app process's connection to the store server, through the simulated network. */
export class NetworkStore implements IdempotencyStore {
  readonly name = 'sim'
  // A remote store: the ledger times each call (on the process's clock) and trusts the server's time.
  readonly serverClock = true
  /**
   * While set, this process is cut off from the store server (a partition or an outage as it sees it):
   * every call fails fast (`reset`, a refused connection) or is never answered (`lost`, a timeout); or
   * only its renewals fail (`renewals`: the store refuses them for a while, every other call passes).
   */
  cut: 'reset' | 'lost' | 'renewals' | null = null
  /** Whether this process's ledger reconciles (sim/app.ts): its steps leave started markers. */
  reconciles = false

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
        const sentAtMs = world.now
        const disturbances = this.proc.disturbances
        world.at(rng.between(min, max), this.proc, () => {
          const error = new NetworkError(`${label}: connection reset`)
          // Failed well inside the ledger's store timeout, its process undisturbed: the ledger sees this error.
          if (world.now - sentAtMs < STORE_TIMEOUT_MS - 1 && this.proc.disturbances === disturbances)
            this.history.reports.storeFailed(error, this.proc, label)
          reject(error)
        })
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
          (error: unknown) => {
            // The store answers every well-formed call: a throw is the store's own code failing.
            this.history.violation(`the store threw on ${label}: ${String(error)}`)
            world.at(rng.between(min, max), this.proc, () => reject(error))
          },
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
      if (result.kind === 'acquired') {
        this.#leased(holderId(scope, key, result.token), leaseMs, disturbances)
        this.history.lastGrant.set(holderId(scope, key, result.token), {
          atMs: this.proc.world.now,
          endsAtMs: this.proc.world.now + leaseMs,
        })
      }
      return result
    })
  }

  async renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean> {
    const holder = holderId(scope, key, token)
    this.history.renewalsSent.set(holder, (this.history.renewalsSent.get(holder) ?? 0) + 1)
    const sentAtMs = this.proc.world.now
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
    if (!renewed) this.history.fencedHolders.add(holder)
    // Defect: the ledger is told a refused renewal succeeded, so the holder keeps working.
    const told = this.defect === 'renew' ? true : renewed
    if (told) {
      this.history.renewalsGranted.set(holder, (this.history.renewalsGranted.get(holder) ?? 0) + 1)
      // One renewal is in flight at a time, so each grant is later than the last (and ends no sooner).
      this.history.lastGrant.set(holder, { atMs: sentAtMs, endsAtMs: sentAtMs + leaseMs })
    } else this.history.reports.refused(holder)
    return told
  }

  complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    const holder = holderId(scope, key, token)
    // A 5xx answer is transient (the HTTP engine's default classify): released for a retry, never the outcome.
    if (outcome.response && outcome.response.status >= 500)
      this.history.violation(
        `${holder} stored its ${outcome.response.status} answer as the outcome (${outcome.status}), a transient failure`,
      )
    const tries = (this.history.completeTries.get(holder) ?? 0) + 1
    this.history.completeTries.set(holder, tries)
    // A run with a deadline holds its lease only until then (no renewal past it, src/core/renewal.ts), on its
    // own clock: its outcome is retried only before it, however long the last renewal granted. (A zombie, its
    // process paused or its clock jumped since, is exempt: the fence stops it.)
    const deadlineMs = this.history.deadlines.get(holder)
    const lease = this.history.leases.get(holder)
    if (
      tries > 1 &&
      deadlineMs !== undefined &&
      this.proc.clock.now() >= deadlineMs &&
      lease !== undefined &&
      this.proc.disturbances === lease.disturbances
    )
      this.history.violation(
        `${holder} retried complete (try ${tries}) ${(this.proc.clock.now() - deadlineMs).toFixed(0)}ms past its run deadline`,
      )
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
    if (this.history.finishing.has(holderId(scope, key, token)))
      this.history.violation(`${holderId(scope, key, token)} released its record after handing finish() its final value`)
    return this.#call(`release ${holderId(scope, key, token)}`, () =>
      this.server.fenced('release', scope, key, token, async (t) => {
        const released = await this.server.inner.release(scope, key, t)
        // Released, the lease ends now: another holder may take the record at once.
        const lease = this.history.leases.get(holderId(scope, key, token))
        if (released && lease) lease.endsAtMs = this.proc.world.now
        return released
      }),
    ).then((released) => {
      // The process learnt that the store released its record: the ledger reports `released`.
      if (released) this.history.reports.releasedApplied.set(holderId(scope, key, token), this.proc)
      return released
    })
  }

  recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    // Started markers (a round trip per step) are for a process that reconciles, and every step such a process
    // records has one in the store first (its own, or an earlier holder's), or was recorded by its reconcile.
    const holder = holderId(scope, key, token)
    const marker = `${intentId(scope, key)}|${name}`
    if (!name.startsWith(CAPTURE_PREFIX)) {
      if (result === null) {
        if (!this.reconciles)
          this.history.violation(`${holder} on ${this.proc.id}, which does not reconcile, recorded a started marker for ${name}`)
        this.history.markers.add(marker)
      } else if (this.reconciles && !this.history.markers.has(marker) && !this.history.reconciled.get(holder)?.has(name)) {
        this.history.violation(`${holder} recorded step ${name} with no started marker, though its process reconciles`)
      }
    }
    return this.#call(`recordStep ${holder} ${name}`, () =>
      this.server.fenced('recordStep', scope, key, token, async (t) => {
        const recorded = await this.server.inner.recordStep(scope, key, t, name, result)
        if (recorded) this.server.stepRecorded(scope, key, name, result)
        return recorded
      }),
    ).then((recorded) => {
      if (!recorded) this.history.stepRefused.add(holder)
      return recorded
    })
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
export class Bank {
  readonly #byKey = new Map<string, number>()
  #next = 1
  constructor(readonly history: History) {}

  /** The charge made under `bankKey`, if any: what a reconcile asks the bank. */
  lookup(bankKey: string): number | undefined {
    return this.#byKey.get(bankKey)
  }

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
