/**
 * The store side of a simulated deployment (sim/scenario.ts): the store server (the real MemoryStore, audited),
 * each app's connection to it over the faulty network, the downstream bank, and the history the checks read.
 */

import { deriveKey } from '../src/core/derive-key.js'
import { CAPTURE_PREFIX } from '../src/core/steps.js'
import type { AcquireResult, ListFilter, Outcome, SavepointCommand, StoredRecord, TransactionalStore } from '../src/core/store.js'
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
  /**
   * Holders in a store transaction (`transactionalHolder`) that have begun a step: the ledger stops their renewals before it records the step (or its
   * started marker) in the transaction, whose row lock keeps the record from then on. A renewal refused while it
   * stops is answered by the step's own fence (FENCED_OUT), not reported as `lease_lost`.
   */
  readonly renewalsStopping = new Set<string>()
  /**
   * Holders whose handler ended with a transient failure (it threw, or answered 5xx itself), with their process:
   * the ledger releases each, so that a retry runs at once rather than after the lease (SPEC: transient
   * failures released). `releaseAsked` holds those whose process called the store's release.
   */
  readonly transientEnd = new Map<string, Proc>()
  readonly releaseAsked = new Set<string>()
  /** The holder whose committed transaction wrote each intent's order row (tenant/key), in commit order. */
  readonly orders = new Map<string, string[]>()
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
  /** When each holder's last `complete` failed with a reset its process saw (true time). */
  readonly completeFailed = new Map<string, number>()
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

  /**
   * Whether `holder` (scope/key#token) runs in a store transaction (the HTTP engine's `transactional: true`,
   * sim/app.ts): its key is one of those served that way. The ledger stops renewing at its first step, whose
   * row lock keeps the record its own until the transaction ends.
   */
  transactionalHolder(holder: string): boolean {
    return throughTransaction(holder.slice(holder.lastIndexOf('/') + 1, holder.lastIndexOf('#')))
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

/**
 * The keys that end in 5 are served in a store transaction (the HTTP engine's `transactional: true`, sim/app.ts):
 * their charge is an order row in the store's own database, keyed by nothing, which commits with the record.
 */
export const throughTransaction = (key: string) => /^key-\d*5$/.test(key)

/** The driver's query timeout on a transaction's connection (the ledger times none of a transaction's calls). */
export const TX_QUERY_TIMEOUT_MS = STORE_TIMEOUT_MS

/** A write a transaction makes: a step or a completion of a record (fenced by token), or an order row of the app's. */
export type TxWrite =
  | { kind: 'step'; holder: string; scope: string; key: string; token: number; name: string; result: string | null }
  | { kind: 'complete'; holder: string; scope: string; key: string; token: number; outcome: Outcome; ttlMs: number }
  | { kind: 'order'; holder: string; intent: string }

/** A transaction on the store server (its database holds the ledger's table and the app's orders). */
export class SimTx {
  open = true
  /** Its connection closed or given up by the client: every further call fails, and the server rolls it back. */
  gone = false
  /** Its writes, in order, applied together at commit. */
  readonly writes: TxWrite[] = []
  /** The records whose row it has locked. */
  readonly locks = new Set<string>()
  savepoint: number | undefined
  constructor(
    readonly id: number,
    readonly proc: Proc,
  ) {}
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

  /** The open transaction holding each record's row lock (PostgreSQL's row lock: an UPDATE in a transaction takes it). */
  readonly #locks = new Map<string, SimTx>()
  /** Calls waiting for a record's row lock, woken when the transaction holding it ends. */
  readonly #lockWaiters = new Map<string, Array<() => void>>()
  #transactions = 0
  /** Each record's watchers (a waiting request's subscription): how often the store called each, and whether it ended. */
  readonly #watchers = new Map<string, Set<{ proc: Proc; calls: number; closed: boolean }>>()

  constructor(
    readonly inner: SimStore,
    readonly history: History,
    readonly defect: Defect | undefined,
  ) {}

  /** Each record the store was asked to hold (scope/key), with its status and token as the store's answers left them. */
  get states(): ReadonlyMap<string, { status: 'in_progress' | 'completed or failed'; token: number }> {
    return this.#states
  }

  /** Waits while another transaction than `tx` holds the row lock of record `id`: a write to the row waits for it. */
  async #unlocked(id: string, tx?: SimTx): Promise<void> {
    for (let holder = this.#locks.get(id); holder !== undefined && holder !== tx; holder = this.#locks.get(id)) {
      await new Promise<void>((resolve) => {
        const waiting = this.#lockWaiters.get(id) ?? []
        waiting.push(resolve)
        this.#lockWaiters.set(id, waiting)
      })
    }
  }

  #unlock(tx: SimTx): void {
    for (const id of tx.locks) {
      this.#locks.delete(id)
      const waiting = this.#lockWaiters.get(id)
      this.#lockWaiters.delete(id)
      // Each in an event of its own, in the order they came: one statement at a time gets the row.
      for (const wake of waiting ?? []) this.history.world.at(0, null, wake)
    }
    tx.locks.clear()
  }

  /**
   * A subscription of `proc` to changes of one record, audited: the store calls it whenever it completes or
   * releases the record (checked in {@link fenced}), and never once it was ended.
   */
  watch(proc: Proc, scope: string, key: string, onChange: () => void): () => void {
    const id = intentId(scope, key)
    const watcher = { proc, calls: 0, closed: false }
    const watchers = this.#watchers.get(id) ?? new Set()
    watchers.add(watcher)
    this.#watchers.set(id, watchers)
    const unsubscribe = this.inner.watch(scope, key, () => {
      if (watcher.closed) this.history.violation(`the store notified a watcher of ${id} on ${proc.id} that had unsubscribed`)
      watcher.calls++
      onChange()
    })
    return () => {
      watcher.closed = true
      watchers.delete(watcher)
      if (watchers.size === 0) this.#watchers.delete(id)
      unsubscribe()
    }
  }

  /** BEGIN on a connection of `proc`. */
  begin(proc: Proc): SimTx {
    return new SimTx(++this.#transactions, proc)
  }

  /**
   * A write inside `tx`. A step or a completion is an UPDATE of the record's row fenced by token, as the SQL
   * stores run it (src/backends/postgres/statements.ts): it waits for the row lock of any other transaction,
   * changes nothing when the token is not the record's current one in progress (`false`), and otherwise locks
   * the row until `tx` ends. An order row is an INSERT into the app's own table, keyed by nothing.
   */
  async write(tx: SimTx, write: TxWrite): Promise<boolean> {
    if (!tx.open) throw new NetworkError(`transaction ${tx.id} was rolled back: its connection closed`)
    if (write.kind === 'order') {
      tx.writes.push(write)
      return true
    }
    const id = intentId(write.scope, write.key)
    await this.#unlocked(id, tx)
    if (!tx.open) throw new NetworkError(`transaction ${tx.id} was rolled back: its connection closed`)
    const record = await this.inner.get(write.scope, write.key)
    if (record === null || record.status !== 'in_progress' || record.token !== write.token) return false
    this.#locks.set(id, tx)
    tx.locks.add(id)
    tx.writes.push(write)
    return true
  }

  /** SAVEPOINT, or ROLLBACK TO SAVEPOINT: the writes made since are undone (the row locks stay). */
  async savepoint(tx: SimTx, command: SavepointCommand): Promise<void> {
    if (!tx.open) throw new NetworkError(`transaction ${tx.id} was rolled back: its connection closed`)
    if (command === 'set') tx.savepoint = tx.writes.length
    else if (tx.savepoint === undefined) this.history.violation(`transaction ${tx.id} rolled back to a savepoint it never set`)
    else tx.writes.length = tx.savepoint
  }

  /** ROLLBACK, or the server ending a transaction whose connection closed: nothing of it was kept. */
  abort(tx: SimTx): void {
    if (!tx.open) return
    tx.open = false
    tx.writes.length = 0
    this.#unlock(tx)
  }

  /**
   * COMMIT: the transaction's writes take effect together, audited. What the ledger commits with a record is
   * its completion (docs/postgres.md): a transaction that changed a record completes it; order rows commit
   * only with their record completed (a failure the work returned keeps none of its writes: `failedWrites`
   * is 'rollback'); and a 5xx answer is never the outcome, a transient failure is rolled back and released.
   */
  async commit(tx: SimTx): Promise<void> {
    if (!tx.open) throw new NetworkError(`transaction ${tx.id} was rolled back: its connection closed`)
    tx.open = false
    const { history } = this
    const completes = tx.writes.filter((w) => w.kind === 'complete')
    for (const write of tx.writes) {
      if (write.kind === 'order') {
        const completion = completes.find((c) => c.holder === write.holder)
        if (completion?.outcome.status !== 'completed')
          history.violation(
            `transaction ${tx.id} of ${write.holder} committed an order row with its record ${completion ? `${completion.outcome.status}` : 'not completed'}`,
          )
        continue
      }
      if (write.kind === 'step' && !completes.some((c) => c.holder === write.holder))
        history.violation(`transaction ${tx.id} of ${write.holder} committed its step ${write.name} without completing the record`)
      if (write.kind === 'complete' && write.outcome.response && write.outcome.response.status >= 500)
        history.violation(
          `${write.holder} stored its ${write.outcome.response.status} answer as the outcome (${write.outcome.status}), a transient failure`,
        )
    }
    for (const write of tx.writes) {
      if (write.kind === 'order') {
        history.charges.set(write.intent, (history.charges.get(write.intent) ?? 0) + 1)
        history.orders.set(write.intent, [...(history.orders.get(write.intent) ?? []), write.holder])
        continue
      }
      const { scope, key, token } = write
      const applied =
        write.kind === 'step'
          ? await this.fenced(
              'recordStep',
              scope,
              key,
              token,
              async (t) => {
                const recorded = await this.inner.recordStep(scope, key, t, write.name, write.result)
                if (recorded) this.stepRecorded(scope, key, write.name, write.result)
                return recorded
              },
              tx,
            )
          : await this.fenced('complete', scope, key, token, (t) => this.inner.complete(scope, key, t, write.outcome, write.ttlMs), tx)
      // The row is locked by this transaction since the write was made: it cannot have changed hands.
      if (!applied)
        history.violation(`transaction ${tx.id} of ${write.holder} had its ${write.kind} refused at commit, under its own row lock`)
    }
    this.#unlock(tx)
  }

  async acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult> {
    const id = intentId(scope, key)
    if (this.#locks.has(id)) await this.#unlocked(id)
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
        // Inside a transaction the ledger renews no more once a step locked the row: the lock keeps the record.
        !history.transactionalHolder(previous) &&
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

  async fenced<R>(
    operation: string,
    scope: string,
    key: string,
    token: number,
    write: (token: number) => Promise<R>,
    tx?: SimTx,
  ): Promise<R> {
    const id = intentId(scope, key)
    const lock = this.#locks.get(id)
    // The ledger stops renewing before a step locks the row in its transaction (src/core/ledger.ts): a renewal, on
    // another connection, would wait for that lock until the commit, and the commit for the renewal.
    if (operation === 'renew' && lock !== undefined && lock.writes.some((w) => w.holder === holderId(scope, key, token)))
      this.history.violation(`${holderId(scope, key, token)} renewed its lease while its own transaction held the record's row lock`)
    // A write waits for the row lock of any other transaction that holds it (a commit holds its own).
    if (lock !== undefined) await this.#unlocked(id, tx)
    // Who watches the record now, and how often the store had called each: a completion or a release notifies all.
    const watchers = this.#watchers.get(id)
    const calls = watchers && new Map([...watchers].map((w) => [w, w.calls]))
    const before = this.#states.get(id)
    const current = before !== undefined && before.status === 'in_progress' && before.token === token
    // Defect: complete without its fence (the store takes the write whatever the token).
    const effective = this.defect === 'fence' && operation === 'complete' && before?.status === 'in_progress' ? before.token : token
    const result = await write(effective)
    if (typeof result !== 'boolean')
      this.history.violation(`the store answered ${operation} of ${holderId(scope, key, token)} with ${String(result)}`)
    if (result === true && operation === 'complete' && before) this.#states.set(id, { status: 'completed or failed', token: before.token })
    if (result === true && calls && (operation === 'complete' || operation === 'release'))
      for (const [watcher, count] of calls)
        if (!watcher.closed && watcher.calls === count)
          this.history.violation(
            `the store applied ${operation} of ${holderId(scope, key, token)} and did not notify its watcher on ${watcher.proc.id}`,
          )
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
export class NetworkStore implements TransactionalStore<SimTx> {
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

  /** Transactions open on this process's connections: the server rolls them back when the process dies. */
  readonly #open = new Set<SimTx>()

  /**
   * Whether an answer that reaches the process now, to a call sent at `sentAtMs` (true time) with the process
   * then `disturbances` times disturbed, reaches the ledger too: well inside its store timeout, the process
   * undisturbed meanwhile (past the timeout the ledger took the call for failed).
   */
  #heardInTime(sentAtMs: number, disturbances: number): boolean {
    return this.proc.world.now - sentAtMs < STORE_TIMEOUT_MS - 1 && this.proc.disturbances === disturbances
  }

  /** `reported`: the ledger makes this call through its store calls, and reports the failures it sees. */
  #call<R>(label: string, apply: () => Promise<R>, reported = true): Promise<R> {
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
          if (reported && this.#heardInTime(sentAtMs, disturbances)) this.history.reports.storeFailed(error, this.proc, label)
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
            // The store answers every well-formed call: a throw is the store's own code failing (a transaction
            // whose connection closed is the exception: the server rolled it back and says so).
            if (!(error instanceof NetworkError)) this.history.violation(`the store threw on ${label}: ${String(error)}`)
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
    const disturbances = this.proc.disturbances
    const renewed = this.defect === 'renew-errors' ? await call.catch(() => true) : await call
    // An answer that came past the ledger's store timeout (a renewal may wait for a transaction's row lock) is one
    // the ledger no longer heard: it took the call for failed.
    if (this.proc.disturbances === disturbances && !this.#heardInTime(sentAtMs, disturbances)) return renewed
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
    if (tries > 1) this.#checkBackoff(holder, tries)
    const sentAtMs = this.proc.world.now
    const disturbances = this.proc.disturbances
    return this.#call(`complete ${holder}`, () => {
      if (tries > 1) this.#checkRetryInLease(holder, tries)
      return this.server.fenced('complete', scope, key, token, (t) => this.server.inner.complete(scope, key, t, outcome, ttlMs))
    }).then(
      (stored) => {
        if (!stored) this.history.reports.refusedComplete.add(holder)
        if (this.#heardInTime(sentAtMs, disturbances))
          this.history.reports.outcomeLearnt.set(holder, { proc: this.proc, type: stored ? 'stored' : 'fenced_out' })
        return stored
      },
      (error: unknown) => {
        if (this.#heardInTime(sentAtMs, disturbances)) this.history.completeFailed.set(holder, this.proc.world.now)
        throw error
      },
    )
  }

  /**
   * The ledger retries a `complete` that failed after a backoff that doubles from 50 ms up to 1 s
   * (src/core/store-calls.ts), shortened only to give up in time (a tenth of a lease before it ends): a retry
   * sooner hammers a store in an outage, one later wastes the lease. Checked after a failure its process saw
   * at once (a reset; a timeout's moment is the ledger's own), the process undisturbed since.
   */
  #checkBackoff(holder: string, tries: number): void {
    const failed = this.history.completeFailed.get(holder)
    this.history.completeFailed.delete(holder)
    // Undisturbed since the lease was granted: a clock that jumped meanwhile moved the lease's end as the ledger reads it.
    const lease = this.history.leases.get(holder)
    if (failed === undefined || lease === undefined || lease.disturbances !== this.proc.disturbances) return
    const { world } = this.proc
    const waitedMs = world.now - failed
    const backoffMs = Math.min(50 * 2 ** (tries - 2), 1_000)
    if (waitedMs > backoffMs + 2)
      this.history.violation(
        `${holder} retried complete (try ${tries}) ${waitedMs.toFixed(0)}ms after it failed, past its backoff of ${backoffMs}ms`,
      )
    // The lease's end as the holder knows it (its last grant, or its run deadline), less the tenth it keeps back.
    const grant = this.history.lastGrant.get(holder)
    const deadlineMs = this.history.deadlines.get(holder)
    const endsAtMs = Math.min(
      grant?.endsAtMs ?? Number.POSITIVE_INFINITY,
      deadlineMs === undefined ? Number.POSITIVE_INFINITY : deadlineMs - (this.proc.clock.now() - world.now),
    )
    if (waitedMs < backoffMs - 2 && endsAtMs - LEASE_MS / 10 - failed > backoffMs + 50)
      this.history.violation(
        `${holder} retried complete (try ${tries}) ${waitedMs.toFixed(0)}ms after it failed, before its backoff of ${backoffMs}ms`,
      )
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
    const holder = holderId(scope, key, token)
    this.history.releaseAsked.add(holder)
    const sentAtMs = this.proc.world.now
    const disturbances = this.proc.disturbances
    if (this.history.finishing.has(holder)) this.history.violation(`${holder} released its record after handing finish() its final value`)
    return this.#call(`release ${holder}`, () =>
      this.server.fenced('release', scope, key, token, async (t) => {
        const released = await this.server.inner.release(scope, key, t)
        // Released, the lease ends now: another holder may take the record at once.
        const lease = this.history.leases.get(holder)
        if (released && lease) lease.endsAtMs = this.proc.world.now
        return released
      }),
    ).then((released) => {
      // The process learnt that the store released its record: the ledger may report `released`; and must, when
      // it learnt it well inside the ledger's store timeout (a release may wait for a transaction's row lock past it).
      if (released) {
        this.history.reports.releasedApplied.set(holder, this.proc)
        if (this.#heardInTime(sentAtMs, disturbances)) this.history.reports.releasedInTime.add(holder)
      }
      return released
    })
  }

  recordStep(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    const holder = holderId(scope, key, token)
    // Inside a transaction every step is recorded in it (docs/postgres.md): committed with the record, or rolled back with it.
    if (throughTransaction(key)) this.history.violation(`${holder} recorded step ${name} outside its transaction`)
    this.#noteStep(holder, scope, key, name, result)
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

  /**
   * Started markers (a round trip per step) are for a process that reconciles, and every step such a process
   * records has one in the store first (its own, or an earlier holder's), or was recorded by its reconcile.
   */
  #noteStep(holder: string, scope: string, key: string, name: string, result: string | null): void {
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
  }

  /**
   * A transaction on a connection of its own: BEGIN, the work, then COMMIT (or ROLLBACK when the work throws).
   * Its calls cross the same faulty network. One that fails or goes unanswered (the driver's query timeout)
   * closes the connection, and the server rolls the transaction back: at once when the connection was reset,
   * a lease later when its packets were lost (the server's keepalive). A paused process keeps its
   * transaction open, and with it the row locks: a record held that way waits for it.
   */
  async transaction<R>(fn: (tx: SimTx) => Promise<R>): Promise<R> {
    const tx = await this.#inTx(undefined, 'begin', async () => this.server.begin(this.proc))
    this.#open.add(tx)
    try {
      let value: R
      try {
        value = await fn(tx)
      } catch (error) {
        await this.#inTx(tx, `rollback tx ${tx.id}`, async () => this.server.abort(tx)).catch(() => {})
        throw error
      }
      const completes = tx.writes.filter((w) => w.kind === 'complete')
      await this.#inTx(tx, `commit tx ${tx.id}`, () => this.server.commit(tx))
      for (const { holder } of completes) this.history.reports.outcomeLearnt.set(holder, { proc: this.proc, type: 'stored' })
      return value
    } finally {
      this.#open.delete(tx)
    }
  }

  /**
   * Subscribes to changes of one record, as LISTEN/NOTIFY or a Redis channel does (the ledger's waiting requests
   * use it, and poll as well): each notification crosses the network, late, and is lost while the process is cut
   * off from the store.
   */
  watch(scope: string, key: string, onChange: () => void): () => void {
    const { world } = this.proc
    return this.server.watch(this.proc, scope, key, () => {
      if (this.cut === 'lost' || this.cut === 'reset') return
      const [min, max] = this.faults.latency
      world.at(world.rng.between(min, max), this.proc, onChange)
    })
  }

  /** The process died: the server sees its connections close and rolls their transactions back. */
  connectionsClosed(): void {
    const [min, max] = this.faults.latency
    for (const tx of this.#open) {
      tx.gone = true
      this.proc.world.at(this.proc.world.rng.between(min, max), null, () => this.server.abort(tx))
    }
    this.#open.clear()
  }

  #inTx<R>(tx: SimTx | undefined, label: string, apply: () => Promise<R>): Promise<R> {
    if (tx?.gone) return Promise.reject(new NetworkError(`${label}: the connection is closed`))
    const { world } = this.proc
    return new Promise<R>((resolve, reject) => {
      let settled = false
      const fail = (error: unknown, rollbackAfterMs: number) => {
        if (settled) return
        settled = true
        if (tx && !tx.gone) {
          tx.gone = true
          world.at(rollbackAfterMs, null, () => this.server.abort(tx))
        }
        reject(error)
      }
      const cancel = world.at(TX_QUERY_TIMEOUT_MS, this.proc, () => fail(new NetworkError(`${label}: query timeout`), LEASE_MS))
      this.#call(label, apply, false).then(
        (value) => {
          if (settled) return
          settled = true
          cancel()
          resolve(value)
        },
        (error: unknown) => {
          cancel()
          fail(error, 0)
        },
      )
    })
  }

  completeInTransaction(tx: SimTx, scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean> {
    const holder = holderId(scope, key, token)
    return this.#inTx(tx, `complete ${holder} in tx ${tx.id}`, () =>
      this.server.write(tx, { kind: 'complete', holder, scope, key, token, outcome, ttlMs }),
    ).then((written) => {
      if (!written) {
        this.history.reports.refusedComplete.add(holder)
        this.history.reports.outcomeLearnt.set(holder, { proc: this.proc, type: 'fenced_out' })
      }
      return written
    })
  }

  recordStepInTransaction(tx: SimTx, scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean> {
    const holder = holderId(scope, key, token)
    this.#noteStep(holder, scope, key, name, result)
    return this.#inTx(tx, `recordStep ${holder} ${name} in tx ${tx.id}`, () =>
      this.server.write(tx, { kind: 'step', holder, scope, key, token, name, result }),
    ).then((recorded) => {
      if (!recorded) this.history.stepRefused.add(holder)
      return recorded
    })
  }

  savepointInTransaction(tx: SimTx, command: SavepointCommand): Promise<void> {
    return this.#inTx(tx, `savepoint ${command} tx ${tx.id}`, () => this.server.savepoint(tx, command))
  }

  /** The app's own write in `tx`: an order row for `intent` (tenant/key), keyed by nothing. Its id is the transaction's. */
  async insertOrder(tx: SimTx, intent: string, holder: string): Promise<number> {
    await this.#inTx(tx, `insert order ${intent} in tx ${tx.id}`, () => this.server.write(tx, { kind: 'order', holder, intent }))
    return tx.id
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
