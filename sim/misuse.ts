/**
 * The callers a fleet also has (issue 57): the ones that get the API wrong, and the store's promises at the exact
 * edges of its own time. A deploy whose options came from an environment variable ("30 s", "0"), a handler
 * whose step name is built from user data, a step that returns a BigInt or a 100 KiB document, a caller that
 * passes a payload and a fingerprint, a queue consumer that asks for a transaction from a store that has none.
 *
 * What the library promises them (docs/ledger.md, docs/steps.md, docs/testing.md "Misuse and the store's
 * edges"): a mistake is refused with a typed error that names what is wrong (the option, the argument, the
 * step), before any store call and with nothing written; a correct input at the edge of a rule (a 64-character
 * step name, a 255-character key, a 64 KiB result, the 256th step, a wait of 0) is taken, and does what it
 * says (the lease and the retention the store is given, the scope and the fingerprint the record holds). And
 * the store, walked through one record's life at the exact millisecond its lease and its retention end: a
 * takeover is allowed from that millisecond and not one before, a reuse with another request is refused
 * while the record lives.
 *
 * The rules are written here again from the docs, not imported: the audit must not share the code it audits.
 * Each seed draws a few cases from its own stream of choices (the rest of the run is unchanged by them), on
 * the real MemoryStore and the real Ledger, with a clock that moves only when the case moves it.
 */
import { createHash } from 'node:crypto'
import { MemoryStore } from '../src/backends/memory/memory-store.js'
import { type Clock, ManualClock, systemClock } from '../src/core/clock.js'
import type { Duration } from '../src/core/duration.js'
import { fingerprintOf } from '../src/core/fingerprint.js'
import { Ledger } from '../src/core/ledger.js'
import type { IntentContext, LedgerEvent, LedgerOptions, LedgerTelemetry, RunOptions } from '../src/core/ledger-types.js'
import type { Reconcile } from '../src/core/steps.js'
import type { IdempotencyStore, StoredRecord } from '../src/core/store.js'
import { StoreCalls } from '../src/core/store-calls.js'
import { Waiter } from '../src/core/waiter.js'
import { IdempotencyError } from '../src/errors.js'
import { requestFingerprint } from '../src/http/stored.js'
import { keyHash } from '../src/observability/recorder.js'
import { Rng } from './world.js'

/** The documented defaults (docs/ledger.md): a lease of 30 s, outcomes replayed for 24 h, a duplicate waiting 10 s. */
const DEFAULT_LEASE_MS = 30_000
const DEFAULT_TTL_MS = 86_400_000
const DEFAULT_WAIT_MS = 10_000
/** How long a record whose lease ended is kept (MemoryStore's `abandonedRetention`), by default. */
const DEFAULT_RETENTION_MS = 86_400_000
/** docs/steps.md: a step name is 1–64 of these; a step keeps at most 64 KiB of JSON; a record at most 256 steps. */
const STEP_NAME_CHARS = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-'
const MAX_STEP_BYTES = 65_536
const MAX_STEPS = 256
/** The `Retry-After` of an `in_progress` answer: whole seconds, 1 s or 2 s, never past a lease end 1 s or more away. */
const retryAfterModel = (leftMs: number) => (leftMs >= 2_000 ? 2_000 : 1_000)

/**
 * A clock that moves only when a case moves it, or when the ledger sleeps (a duplicate polling the store): times
 * are exact. Timers never fire (no case waits on a renewal).
 */
class StillClock implements Clock {
  t: number
  /** What each sleep asked for, in order. */
  readonly sleeps: number[] = []
  constructor(t: number) {
    this.t = t
  }
  now = () => this.t
  sleep = (ms: number) => {
    this.sleeps.push(ms)
    this.t += ms
    return Promise.resolve()
  }
  timer = () => () => {}
}

/**
 * How a duplicate waits `waitMs` for a holder that does not finish (docs/ledger.md, "polls as a fallback (20 ms,
 * doubling to 250 ms)"): the sleeps between its tries, the last cut to the wait's end.
 */
function pollsModel(waitMs: number): number[] {
  const sleeps: number[] = []
  for (let waited = 0, poll = 20; waited < waitMs; poll = Math.min(poll * 2, 250)) {
    sleeps.push(Math.min(poll, waitMs - waited))
    waited += sleeps[sleeps.length - 1] as number
  }
  return sleeps
}

/** A store that counts every call (and keeps the lease each acquire asked for); `hide` takes a method away. */
function counted<S extends IdempotencyStore>(inner: S, calls: string[], leases: number[], hide?: string): S {
  return new Proxy(inner, {
    get(target, prop) {
      if (prop === hide) return undefined
      const value = Reflect.get(target, prop, target) as unknown
      if (typeof value !== 'function') return value
      return (...args: unknown[]) => {
        if (prop !== 'renew') calls.push(String(prop))
        if (prop === 'acquire') leases.push(args[3] as number)
        return (value as (...a: unknown[]) => unknown).apply(target, args)
      }
    },
  })
}

/** `store` with some of its methods replaced by `overrides`; every other property read through as it is. */
function overriding<S extends object>(store: S, overrides: Record<string, unknown>): S {
  return new Proxy(store, {
    get: (target, prop) => (typeof prop === 'string' && Object.hasOwn(overrides, prop) ? overrides[prop] : Reflect.get(target, prop)),
  })
}

/** A telemetry that passes each store call and the work through, and notes each run it is told of, its events and its end. */
function recordingTelemetry(): { telemetry: LedgerTelemetry; runs: unknown[][]; events: string[]; ends: string[] } {
  const runs: unknown[][] = []
  const events: string[] = []
  const ends: string[] = []
  const telemetry: LedgerTelemetry = {
    startRun: (...args) => {
      runs.push(args)
      return {
        storeCall: (_operation, call) => call(),
        work: (fn) => fn(),
        event: (event) => void events.push(event.type),
        end: (kind) => void ends.push(String(kind)),
      }
    },
  }
  return { telemetry, runs, events, ends }
}

/** What a call came to: its value, or what it threw (synchronously or by rejecting). */
type Settled = { ok: true; value: unknown } | { ok: false; error: unknown }
async function settle(call: () => unknown): Promise<Settled> {
  try {
    return { ok: true, value: await call() }
  } catch (error) {
    return { ok: false, error }
  }
}

const json = (value: unknown) => JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? `${v}n` : v))
const describe = (settled: Settled) =>
  settled.ok ? `took it (${json(settled.value)?.slice(0, 80)})` : `threw ${(settled.error as Error)?.message ?? String(settled.error)}`

/** The canonical JSON of a flat object of strings and integers (RFC 8785 for these): keys sorted. */
const canonical = (payload: Record<string, unknown>) =>
  `{${Object.keys(payload)
    .sort()
    .map((k) => `${JSON.stringify(k)}:${JSON.stringify(payload[k])}`)
    .join(',')}}`
const sha256 = (data: string | Uint8Array) => createHash('sha256').update(data).digest('hex')

/**
 * Deliberate defects these cases must catch (test/sim.test.ts):
 * - `lease-edge`: the store decides an acquire one millisecond late (a lease and a retention end a tick late);
 * - `retry-hint`: an in-progress answer tells the caller to come back at the lease's end, not in a second or two;
 * - `overwait`: a duplicate sleeps at least the poll cap between tries, past the wait it was given;
 * - `vague-errors`: a refusal that keeps its code and loses what it said (which option, which step);
 * - `all-unavailable`: every error of a store call taken for an outage (a missing schema retried for the lease);
 * - `transient-thrown`: a transactional run whose value is a transient failure throws the rollback at its caller
 *   instead of answering it `released` (the record is released all the same).
 */
export const MISUSE_DEFECTS = ['lease-edge', 'retry-hint', 'overwait', 'vague-errors', 'all-unavailable', 'transient-thrown'] as const
export type MisuseDefect = (typeof MISUSE_DEFECTS)[number]

/** Patches the real code for one of {@link MISUSE_DEFECTS} (but `lease-edge`, which the store case applies); returns the undo. */
export function misuseDefect(defect: MisuseDefect): () => void {
  const run = Ledger.prototype.run
  const wait = Waiter.prototype.wait
  const call = StoreCalls.prototype.call
  const runInTransaction = Ledger.prototype.runInTransaction
  if (defect === 'retry-hint') {
    Ledger.prototype.run = async function (this: Ledger, ...args: Parameters<typeof run>) {
      const result = await run.apply(this, args)
      return result.kind === 'in_progress' ? { ...result, retryAfterMs: Math.max(1_000, result.lockedUntilMs - this.clock.now()) } : result
    } as typeof run
  }
  if (defect === 'vague-errors') {
    Ledger.prototype.run = function (this: Ledger, ...args: Parameters<typeof run>) {
      return run.apply(this, args).catch((error: unknown) => {
        throw error instanceof IdempotencyError ? new IdempotencyError(error.code, 'The request is not valid.') : error
      })
    } as typeof run
  }
  if (defect === 'overwait') {
    Waiter.prototype.wait = function (this: Waiter, clock: Clock, ms: number) {
      return wait.call(this, clock, Math.max(ms, 250))
    }
  }
  if (defect === 'all-unavailable') {
    StoreCalls.prototype.call = function <R>(this: StoreCalls, ...args: Parameters<StoreCalls['call']>) {
      return (call.apply(this, args) as Promise<R>).catch((error: unknown) => {
        throw error instanceof IdempotencyError && error.code !== 'STORE_UNAVAILABLE'
          ? new IdempotencyError('STORE_UNAVAILABLE', error.message, { cause: error })
          : error
      })
    }
  }
  if (defect === 'transient-thrown') {
    Ledger.prototype.runInTransaction = async function (this: Ledger, ...args: Parameters<typeof runInTransaction>) {
      const result = await runInTransaction.apply(this, args)
      if (result.kind === 'executed' && result.outcome === 'released') throw new Error('the transaction was rolled back')
      return result
    } as typeof runInTransaction
  }
  return () => {
    Ledger.prototype.runInTransaction = runInTransaction
    Ledger.prototype.run = run
    Waiter.prototype.wait = wait
    StoreCalls.prototype.call = call
  }
}

export class Misuse {
  readonly #rng: Rng
  readonly #violation: (text: string) => void
  #cases = 0

  readonly #defect: MisuseDefect | undefined

  constructor(seed: number, violation: (text: string) => void, defect?: string) {
    this.#rng = new Rng(seed ^ 0x2545f491)
    this.#violation = violation
    this.#defect = MISUSE_DEFECTS.find((d) => d === defect)
  }

  /** Runs `count` cases, each of a family drawn at random. */
  async run(count: number): Promise<void> {
    const families = [
      this.#deploy,
      this.#intent,
      this.#duplicate,
      this.#steps,
      this.#transaction,
      this.#storeEdges,
      this.#fingerprints,
      this.#failingStore,
      this.#renewals,
    ] as const
    for (let i = 0; i < count; i++) {
      const family = this.#rng.pick(families)
      try {
        await family.call(this)
      } catch (error) {
        // A correct call the library or the store threw on, where it should have answered.
        this.#violation(`misuse: ${family.name} threw ${(error as Error)?.stack ?? String(error)}`)
      }
    }
  }

  // ---- how a case is judged ----

  /** Refused with `code`, naming each of `names`, with no store call (when `calls` is given). */
  #refused(what: string, settled: Settled, code: string, names: readonly string[], calls?: readonly string[]): void {
    if (settled.ok || !(settled.error instanceof IdempotencyError) || settled.error.code !== code) {
      this.#violation(`misuse: ${what} must be refused with ${code}, and ${describe(settled)}`)
      return
    }
    const message = settled.error.message
    for (const name of names)
      if (!message.includes(name)) this.#violation(`misuse: ${what} was refused without naming ${name}: "${message}"`)
    if (calls && calls.length > 0) this.#violation(`misuse: ${what} was refused after calling the store (${calls.join(', ')})`)
  }

  /** Taken: the value, or undefined after a violation. */
  #taken(what: string, settled: Settled): unknown {
    if (!settled.ok) {
      this.#violation(`misuse: ${what} is correct and was refused: ${describe(settled)}`)
      return undefined
    }
    return settled.value
  }

  #expect(what: string, got: unknown, expected: unknown): void {
    if (json(got) !== json(expected)) this.#violation(`misuse: ${what} is ${json(got)}, expected ${json(expected)}`)
  }

  #fresh(): { clock: StillClock; memory: MemoryStore; calls: string[]; leases: number[]; key: string } {
    const clock = new StillClock(1_800_000_000_000 + this.#rng.int(1_000_000))
    return { clock, memory: new MemoryStore({ clock }), calls: [], leases: [], key: `probe-${++this.#cases}` }
  }

  /** A duration a deploy may write, and what it means in ms. */
  #duration(zeroAllowed: boolean): [Duration, number] {
    const n = 1 + this.#rng.int(120)
    if (zeroAllowed && this.#rng.chance(0.2)) return this.#rng.pick([[0, 0] as [Duration, number], ['0s', 0]])
    return this.#rng.pick<[Duration, number]>([
      [n * 1_000, n * 1_000],
      [`${n}s`, n * 1_000],
      [`${n}m`, n * 60_000],
      [String(n * 10), n * 10],
      [`1h${n}m`, 3_600_000 + n * 60_000],
    ])
  }

  /** A duration no deploy may write (`zeroAllowed`: `wait`, which may be 0). */
  #badDuration(zeroAllowed: boolean): unknown {
    // Not null: a deploy's null is taken as the option left out (its default), as undefined is.
    return this.#rng.pick([-1, 'soon', '', Number.NaN, '30 parsecs', ...(zeroAllowed ? [] : [0, '0s', '0ms'])])
  }

  // ---- the families ----

  /** A deploy's options (`new Ledger`): one wrong, or none, the others given or left to their defaults. */
  async #deploy(): Promise<void> {
    const rng = this.#rng
    const { clock, memory, calls, leases, key } = this.#fresh()
    const store = counted(memory, calls, leases)
    const wrong = rng.pick([
      undefined,
      undefined,
      'store',
      'onEvent',
      'clock',
      'storeTimeoutClock',
      'telemetry',
      'lease',
      'ttl',
      'wait',
      'storeTimeout',
    ] as const)
    const options: Record<string, unknown> = { store }
    const events: LedgerEvent[] = []
    const recorded = recordingTelemetry()
    const expected = { lease: DEFAULT_LEASE_MS, ttl: DEFAULT_TTL_MS, wait: DEFAULT_WAIT_MS }
    if (wrong === 'store') options.store = rng.pick([undefined, {}, { acquire: 'yes' }, null])
    if (wrong === 'onEvent') options.onEvent = rng.pick(['log', 1, {}])
    else if (rng.chance(0.5)) options.onEvent = (event: LedgerEvent) => events.push(event)
    for (const name of ['clock', 'storeTimeoutClock'] as const) {
      if (wrong === name)
        options[name] = rng.pick<unknown>([
          { now: (): number => 1 },
          'utc',
          null,
          { now: (): number => 1, sleep: (): undefined => undefined },
        ])
      else if (name === 'storeTimeoutClock' || rng.chance(0.7)) options[name] = clock
    }
    if (wrong === 'telemetry') options.telemetry = rng.pick([{}, 'otel', { startRun: 1 }])
    else if (rng.chance(0.4)) options.telemetry = recorded.telemetry
    for (const name of ['lease', 'ttl', 'wait', 'storeTimeout'] as const) {
      if (wrong === name) options[name] = this.#badDuration(name === 'wait')
      else if (rng.chance(0.5)) {
        const [duration, ms] = this.#duration(name === 'wait')
        // A lease or a TTL of 0 is refused; storeTimeout too.
        options[name] = duration
        if (name !== 'storeTimeout') expected[name] = ms
      }
    }
    const configured = this.#rng.chance(0.1) && wrong === 'store' ? undefined : options
    const what = `new Ledger(${json(configured)?.slice(0, 120)})`
    const made = await settle(() => new Ledger(configured as unknown as LedgerOptions))
    if (wrong !== undefined) {
      const names =
        wrong === 'store'
          ? ['new Ledger', 'store']
          : ['lease', 'ttl', 'wait', 'storeTimeout'].includes(wrong)
            ? [wrong]
            : ['new Ledger()', wrong, ...(wrong === 'telemetry' ? ['startRun'] : [])]
      this.#refused(what, made, 'INVALID_OPTION', names)
      return
    }
    const ledger = this.#taken(what, made) as Ledger | undefined
    if (!ledger) return
    this.#expect(`${what}: its lease`, ledger.leaseMs, expected.lease)
    this.#expect(`${what}: its ttl`, ledger.ttlMs, expected.ttl)
    this.#expect(`${what}: its wait`, ledger.waitMs, expected.wait)
    if (ledger.clock !== (options.clock ?? systemClock)) this.#violation(`misuse: ${what} does not run on the clock it was given`)
    if (ledger.store !== store) this.#violation(`misuse: ${what} does not run on the store it was given`)
    // The deploy's first intent: the store is asked for its lease, and keeps its outcome for its ttl.
    const scope = rng.pick(['acme', 'Zürich', 'tenant 7'])
    const result = this.#taken(`${what}: a first run`, await settle(() => ledger.run({ scope, key, payload: { n: 1 } }, () => 'done')))
    if (!result) return
    this.#expect(`${what}: a first run`, (result as { kind: string }).kind, 'executed')
    this.#expect(`${what}: the lease its acquire asked for`, leases, [expected.lease])
    const record = await memory.get(scope, key)
    this.#expect(`${what}: the kept outcome's retention`, record && record.expiresAtMs - record.updatedAtMs, expected.ttl)
    if (options.telemetry) this.#expect(`${what}: the run its telemetry was told of`, recorded.runs, [[scope, key, 'memory']])
    // A run whose value cannot be kept (a BigInt) fails, and its telemetry hears its end once, as every run's.
    await settle(() => ledger.run({ scope, key: `${key}-big` }, () => 10n))
    if (options.telemetry) this.#expect(`${what}: the ends its telemetry heard`, recorded.ends, ['executed', 'undefined'])
    // Closing the ledger closes its store, and says when it has.
    const closing = ledger.close()
    if (!(closing instanceof Promise)) this.#violation(`misuse: ${what}: close() returned ${String(closing)}, not a promise`)
    await closing
    if (!calls.includes('close')) this.#violation(`misuse: ${what}: close() did not close its store`)
    if (options.onEvent)
      this.#expect(
        `${what}: the events its listener heard`,
        events.map((e) => `${e.type}:${'token' in e ? e.token : ''}`),
        // The value that cannot be kept is reported unrecorded at once (the record stays held to its lease's end).
        ['acquired:1', 'stored:1', 'acquired:1', 'unrecorded:1'],
      )
  }

  /** A ledger that runs (a lease of 0.5-5 s, an hour's ttl) over a store that counts its calls. */
  #ledger(store: IdempotencyStore, clock: Clock, leaseMs: number): Ledger {
    return new Ledger({ store, clock, storeTimeoutClock: clock, lease: leaseMs, ttl: '1h', wait: 0 })
  }

  /** An intent as a caller makes it (`run` or `begin`): one part wrong, or none. */
  async #intent(): Promise<void> {
    const rng = this.#rng
    const { clock, memory, calls, leases, key: fresh } = this.#fresh()
    const leaseMs = 500 + rng.int(4_500)
    const ledger = this.#ledger(counted(memory, calls, leases), clock, leaseMs)
    const wrong = rng.pick([
      undefined,
      undefined,
      'key',
      'scope',
      'both',
      'fingerprint',
      'lease',
      'ttl',
      'wait',
      'deadline',
      'intent',
    ] as const)
    const intent: Record<string, unknown> = {}
    const options: Record<string, unknown> = {}
    // The key: a fresh one, or an edge of the rule (255 printable ASCII characters); or a wrong one.
    intent.key =
      wrong === 'key'
        ? rng.pick(['', 'k'.repeat(256), 'clé', 'a\nb', 42, undefined])
        : rng.chance(0.2)
          ? `${fresh}~${' !~'.repeat(100)}`.slice(0, 255)
          : fresh
    // The scope: left out (the default scope), a tenant's name in any script, up to 255 characters; or a wrong one.
    if (wrong === 'scope') intent.scope = rng.pick(['', 'a\u0000b', 'tab\there', 's'.repeat(256)])
    else if (rng.chance(0.7)) intent.scope = rng.pick(['acme', 'Zürich', '東京', `t${'x'.repeat(254)}`])
    const payload = { amount: 1 + rng.int(1_000), currency: rng.pick(['eur', 'usd']), note: rng.pick(['', 'für Max', '☕']) }
    const ordered = rng.chance(0.5) ? payload : { note: payload.note, currency: payload.currency, amount: payload.amount }
    const bytes = new TextEncoder().encode(`raw ${payload.amount}`)
    const given = Array.from({ length: 64 }, () => '0123456789abcdef'[rng.int(16)]).join('')
    const form =
      wrong === 'both' ? 'both' : wrong === 'fingerprint' ? 'bad' : rng.pick(['payload', 'bytes', 'fingerprint', 'none'] as const)
    if (form === 'payload' || form === 'both') intent.payload = ordered
    if (form === 'bytes') intent.payload = bytes
    if (form === 'fingerprint' || form === 'both') intent.fingerprint = given
    if (form === 'bad') intent.fingerprint = rng.pick([given.toUpperCase(), given.slice(1), `${given}0`, 7])
    const fingerprint =
      form === 'payload' ? sha256(canonical(payload)) : form === 'bytes' ? sha256(bytes) : form === 'fingerprint' ? given : sha256('null')
    let expectedLease = leaseMs
    let expectedTtl = 3_600_000
    if (wrong === 'lease' || wrong === 'ttl' || wrong === 'wait') options[wrong] = this.#badDuration(wrong === 'wait')
    else {
      const given = rng.pick(['lease', 'ttl', undefined, undefined] as const)
      if (given === 'lease') [options.lease, expectedLease] = this.#duration(false)
      if (given === 'ttl') [options.ttl, expectedTtl] = this.#duration(false)
    }
    if (wrong === 'deadline') options.deadlineMs = rng.pick([Number.NaN, Number.POSITIVE_INFINITY, '2030-01-01'])
    else if (rng.chance(0.3)) {
      const leftMs = 1 + rng.int(2 * expectedLease)
      options.deadlineMs = clock.now() + leftMs
      expectedLease = Math.max(1, Math.min(expectedLease, leftMs))
    }
    if (rng.chance(0.3)) options.resourceId = (value: { id: string }) => value.id
    const how = rng.pick(['run', 'begin'] as const)
    const what = `ledger.${how}(${json(intent)?.slice(0, 100)}, ${json(options)})`
    // The work's value; undefined (a work that returns nothing) is kept as null.
    const value = options.resourceId || rng.chance(0.8) ? { id: `order-${this.#cases}` } : undefined
    const kept = value ?? null
    const go = (i: Record<string, unknown> | null | undefined) =>
      how === 'run'
        ? ledger.run(i as never, () => value, options as RunOptions<typeof value>)
        : ledger
            .begin(i as never, options as RunOptions<typeof value>)
            .then((begun) => (begun.kind === 'acquired' ? begun.finish(value) : begun))
    const settled = await settle(() => go(wrong === 'intent' ? rng.pick([undefined, null]) : intent))
    if (wrong !== undefined) {
      const [code, names] = {
        key: ['KEY_INVALID', ['key']],
        scope: ['SCOPE_INVALID', ['Scope']],
        both: ['INVALID_ARGUMENT', ['payload', 'fingerprint']],
        fingerprint: ['FINGERPRINT_INVALID', ['Fingerprint']],
        lease: ['INVALID_OPTION', ['lease']],
        ttl: ['INVALID_OPTION', ['ttl']],
        wait: ['INVALID_OPTION', ['wait']],
        deadline: ['INVALID_OPTION', ['deadlineMs']],
        intent: ['KEY_INVALID', ['key']],
      }[wrong] as [string, string[]]
      this.#refused(what, settled, code, names, calls)
      return
    }
    const result = this.#taken(what, settled) as { kind: string; value?: unknown } | undefined
    if (!result) return
    this.#expect(`${what}: its result`, [result.kind, result.value], ['executed', value])
    this.#expect(`${what}: the lease its acquire asked for`, leases, [expectedLease])
    const scope = (intent.scope as string | undefined) ?? 'default'
    const record = (await memory.get(scope, intent.key as string)) as StoredRecord | null
    if (!record) {
      this.#violation(`misuse: ${what} left no record in ${scope}`)
      return
    }
    this.#expect(`${what}: its record's fingerprint`, record.fingerprint, fingerprint)
    this.#expect(`${what}: its record's retention`, record.expiresAtMs - record.updatedAtMs, expectedTtl)
    this.#expect(`${what}: its record's resourceId`, record.resourceId, options.resourceId ? value?.id : null)
    // Kept as JSON: its type said, its bytes the value's (null for nothing).
    this.#expect(
      `${what}: its kept answer`,
      [record.response?.status, record.response?.headers, new TextDecoder().decode(record.response?.body)],
      [200, { 'content-type': 'application/json' }, JSON.stringify(kept)],
    )
    // The same intent again is a replay of that value; the key with another request is refused (a mismatch).
    calls.length = 0
    // Within the outcome's retention (a ttl may be as short as 10 ms).
    clock.t += rng.int(Math.min(1_000, expectedTtl))
    const again = rng.chance(0.5)
    const reuse = again ? intent : { ...intent, payload: { other: true }, fingerprint: undefined }
    const replayed = this.#taken(`${what}, again`, await settle(() => go(reuse))) as Record<string, unknown> | undefined
    if (replayed)
      this.#expect(
        `${what}, ${again ? 'again' : 'reused with another request'}`,
        again ? [replayed.kind, replayed.value] : [replayed.kind, replayed.scope, replayed.key],
        again ? ['replayed', kept] : ['mismatch', scope, intent.key],
      )
  }

  /**
   * A duplicate of an intent another holder runs: it waits (polling, as a store whose notification was lost makes
   * it), then is told when to come back and when the lease ends; what it waited is what its events say.
   */
  async #duplicate(): Promise<void> {
    const rng = this.#rng
    const { clock, memory, calls, leases, key: fresh } = this.#fresh()
    const leaseMs = 500 + rng.int(4_500)
    // With telemetry, the run's own listener hears each event after it (docs/telemetry.md).
    const recorded = rng.chance(0.5) ? recordingTelemetry() : undefined
    const telemetry = recorded?.telemetry
    // The watches the duplicate opens on the record, and closes.
    const watching = { open: 0 }
    const counting = counted(memory, calls, leases)
    const store = overriding(counting, {
      watch: (scope: string, key: string, onChange: () => void) => {
        watching.open++
        const unsubscribe = memory.watch(scope, key, onChange)
        return () => {
          watching.open--
          unsubscribe()
        }
      },
    })
    const ledger = new Ledger({
      store,
      clock,
      storeTimeoutClock: clock,
      lease: leaseMs,
      wait: 0,
      ...(telemetry ? { telemetry } : {}),
    })
    const what = `ledger.run of ${fresh}${telemetry ? ', with telemetry' : ''}`
    const value = { id: fresh }
    // Held by another: a duplicate waits (polling, as a store that lost its notification makes it), then is told
    // when to come back and when the lease ends.
    const other = { scope: rng.pick(['acme', undefined]), key: fresh, payload: { n: rng.int(3) } }
    const waitMs = rng.pick([0, 0, 1, 19, 20, 21, 60, 61, 300, 555, 1_000])
    // A lease that outlasts the wait; or, without a wait, at each edge of the hint: 2 s or more left, 1 s or more, less.
    const heldMs = waitMs > 0 ? 10_000 : leaseMs
    const begun = await ledger.begin(other as never, { lease: heldMs })
    const heldAt = clock.t
    if (waitMs === 0) clock.t += Math.max(0, heldMs - rng.pick([heldMs, 2_000, 1_999, 1_000, 999, 1, rng.int(heldMs)]))
    const into = clock.t - heldAt
    const events: LedgerEvent[] = []
    calls.length = 0
    clock.sleeps.length = 0
    const dup = (await ledger.run(other as never, () => value, { wait: waitMs, onEvent: (e) => events.push(e) })) as unknown as Record<
      string,
      unknown
    >
    const polls = pollsModel(waitMs)
    const dupWhat = `a duplicate of a held ${what}, ${into}ms into a ${heldMs}ms lease, waiting ${waitMs}ms`
    this.#expect(
      dupWhat,
      [dup.kind, dup.lockedUntilMs, dup.retryAfterMs],
      ['in_progress', heldAt + heldMs, retryAfterModel(heldAt + heldMs - clock.t)],
    )
    this.#expect(`${dupWhat}: its sleeps`, clock.sleeps, polls)
    this.#expect(`${dupWhat}: its tries`, calls.filter((c) => c === 'acquire').length, polls.length + 1)
    const last = events[events.length - 1] as Partial<Record<string, unknown>> | undefined
    this.#expect(
      `${dupWhat}: its events`,
      [events.map((e) => e.type).join(' '), last?.waitedMs, last?.durationMs],
      [[...polls.map(() => 'waiting'), 'in_progress'].join(' '), waitMs, waitMs],
    )
    // Each waiting event says how long the duplicate had waited when it tried.
    this.#expect(
      `${dupWhat}: when it said it was waiting`,
      events.filter((e) => e.type === 'waiting').map((e) => e.durationMs),
      polls.map((_, i) => polls.slice(0, i).reduce((a, b) => a + b, 0)),
    )
    // And it stopped watching the record once it was answered.
    if (watching.open !== 0) this.#violation(`misuse: ${dupWhat}: it left ${watching.open} watch(es) of the record open`)
    if (telemetry)
      this.#expect(
        `${dupWhat}: what its telemetry heard`,
        recorded?.events.slice(-events.length),
        events.map((e) => e.type),
      )
    if (begun.kind === 'acquired') await begun.finish(value)
    // Once the holder has finished, the duplicate is its replay, and its own listener hears so.
    const heard: string[] = []
    const replay = await ledger.run(other as never, () => value, { onEvent: (e) => heard.push(e.type) })
    this.#expect(`${dupWhat}, once the holder finished`, [replay.kind, heard], ['replayed', ['replayed']])
  }

  /**
   * A store that fails (docs/ledger.md, "When the store fails"): a connection reset (retried), a missing schema or a
   * refusal of its own (not retried), slow or at once, on the acquire, the outcome's complete or a release. The
   * caller gets the store's error, named by the store and the operation; every store error is reported
   * (`store_error`, with how long the failed call took), a refusal of the store's own is not; an outcome whose
   * complete failed is retried after 50 ms, doubling to 1 s, until a tenth of the lease (at most 1 s) before its
   * end, then given up as `unrecorded` with the number of tries; a release that failed leaves the record to its
   * lease.
   */
  async #failingStore(): Promise<void> {
    const rng = this.#rng
    const { clock, memory, calls, leases, key } = this.#fresh()
    const operation = rng.pick(['acquire', 'complete', 'complete', 'release'] as const)
    const kind = rng.pick(['reset', 'reset', 'schema', 'its own'] as const)
    const failures = rng.pick([1, 2, 3, 1_000])
    const slowMs = rng.pick([0, 1, 37, 400])
    const leaseMs = 500 + rng.int(9_500)
    const workMs = rng.pick([0, rng.int(leaseMs)])
    let failed = 0
    const counting = counted(memory, calls, leases)
    const store = overriding(counting, {
      [operation]: (...args: unknown[]) => {
        if (failed >= failures) return (counting[operation] as (...a: unknown[]) => unknown)(...args)
        failed++
        clock.t += slowMs
        return Promise.reject(
          kind === 'reset'
            ? new Error('read ECONNRESET')
            : new IdempotencyError(kind === 'schema' ? 'STORE_SCHEMA' : 'INVALID_ARGUMENT', `the store refused ${operation}`),
        )
      },
    })
    const events: LedgerEvent[] = []
    const ledger = new Ledger({
      store,
      clock,
      storeTimeoutClock: clock,
      lease: leaseMs,
      ttl: '1h',
      wait: 0,
      onEvent: (e) => events.push(e),
    })
    const t0 = clock.t
    const what = `a run on a store whose ${operation} fails ${failures === 1_000 ? 'every time' : `${failures} time(s)`} (${kind}, after ${slowMs}ms), work of ${workMs}ms in a ${leaseMs}ms lease`
    const settled = await settle(() =>
      ledger.run({ scope: 'acme', key }, () => {
        clock.t += workMs
        if (operation === 'release') throw new Error('bank unavailable')
        return 'paid'
      }),
    )
    const reported = kind !== 'its own'
    const errorEvents = (n: number) => Array.from({ length: reported ? n : 0 }, () => `store_error:${operation}:${slowMs}`)
    const seen = events.map((e) =>
      e.type === 'store_error'
        ? `store_error:${e.operation}:${e.durationMs}`
        : e.type === 'unrecorded'
          ? `unrecorded:${e.attempts}:${e.durationMs}`
          : e.type === 'stored'
            ? `stored:${e.durationMs}`
            : e.type,
    )
    if (operation === 'acquire') {
      const code = kind === 'reset' ? 'STORE_UNAVAILABLE' : kind === 'schema' ? 'STORE_SCHEMA' : 'INVALID_ARGUMENT'
      this.#refused(what, settled, code, kind === 'reset' ? ['memory', 'acquire', 'ECONNRESET'] : ['acquire'])
      this.#expect(`${what}: its events`, seen, errorEvents(1))
      return
    }
    if (operation === 'release') {
      if (settled.ok || (settled.error as Error).message !== 'bank unavailable')
        this.#violation(`misuse: ${what} must fail with the work's own error, and ${describe(settled)}`)
      this.#expect(`${what}: its events`, seen, ['acquired', ...errorEvents(1)])
      const record = await memory.get('acme', key)
      this.#expect(`${what}: its record`, [record?.status, record?.lockedUntilMs], ['in_progress', t0 + leaseMs])
      return
    }
    // The complete's tries, as docs/ledger.md has them.
    const giveUpAtMs = t0 + leaseMs - Math.min(1_000, Math.floor(leaseMs / 10))
    const sleeps: number[] = []
    let outcome = 'completed'
    let tries = 0
    let t = t0 + workMs
    for (let backoff = 50; ; backoff = Math.min(backoff * 2, 1_000)) {
      tries++
      if (tries > failures) break
      t += slowMs
      const leftMs = giveUpAtMs - t
      if (kind !== 'reset' || leftMs <= 0) {
        outcome = 'unrecorded'
        break
      }
      sleeps.push(Math.min(backoff, leftMs))
      t += Math.min(backoff, leftMs)
    }
    const result = this.#taken(what, settled) as { kind: string; outcome: string } | undefined
    if (!result) return
    this.#expect(`${what}: its result`, [result.kind, result.outcome], ['executed', outcome])
    this.#expect(`${what}: its waits between tries`, clock.sleeps, sleeps)
    this.#expect(`${what}: its events`, seen, [
      'acquired',
      ...errorEvents(outcome === 'completed' ? tries - 1 : tries),
      outcome === 'completed' ? `stored:${t - t0}` : `unrecorded:${tries}:${t - t0}`,
    ])
  }

  /**
   * A holder's renewals (docs/ledger.md, "Leases"), every third of its lease, on a store that grants them or fails
   * them all (a reset), with a run deadline or none, each at an exact millisecond: a renewal that failed keeps the
   * lease while less than a lease has passed since the last one granted, and loses it (`lease_lost`, the signal
   * aborted) the moment a whole lease has; no renewal is asked for from the run deadline on, where the lease ends;
   * a renewal asks for the lease, cut to the deadline.
   */
  async #renewals(): Promise<void> {
    const rng = this.#rng
    const clock = new ManualClock(1_800_000_000_000 + rng.int(1_000_000))
    const memory = new MemoryStore({ clock })
    const calls: string[] = []
    const every = 100 + rng.int(900)
    const leaseMs = 3 * every + rng.int(3)
    const failing = rng.chance(0.5)
    const t0 = clock.now()
    const deadlineAt = rng.pick([undefined, 1, 2, 3, 4].map((n) => (n === undefined ? undefined : n * every + rng.pick([0, 0, -1, 1]))))
    const counting = counted(memory, calls, [])
    const store = overriding(counting, {
      renew: (...args: Parameters<MemoryStore['renew']>) => {
        calls.push(`renew:${args[3]}`)
        return failing ? Promise.reject(new Error('read ECONNRESET')) : counting.renew(...args)
      },
    })
    const events: LedgerEvent[] = []
    const ledger = new Ledger({ store, clock, storeTimeoutClock: clock, lease: leaseMs, onEvent: (e) => events.push(e) })
    const what = `a holder of a ${leaseMs}ms lease on a store that ${failing ? 'fails' : 'grants'} its renewals${deadlineAt === undefined ? '' : `, with a run deadline ${deadlineAt}ms on`}`
    const begun = await ledger.begin(
      { scope: 'acme', key: `renew-${++this.#cases}` },
      deadlineAt === undefined ? {} : { deadlineMs: t0 + deadlineAt },
    )
    if (begun.kind !== 'acquired') return this.#violation(`misuse: ${what} was not granted its record: ${begun.kind}`)
    // The model: a renewal every third of the lease, from the grant.
    const renewals: string[] = []
    let lostAt: number | undefined
    let renewedAt = 0
    for (let at = every; lostAt === undefined && at <= 5 * every; at += every) {
      if (deadlineAt !== undefined && at >= deadlineAt) lostAt = at
      else {
        renewals.push(`renew:${deadlineAt === undefined ? leaseMs : Math.max(1, Math.min(leaseMs, deadlineAt - at))}`)
        if (!failing) renewedAt = at
        else if (at - renewedAt >= leaseMs) lostAt = at
      }
    }
    let abortedAt: number | undefined
    begun.context.signal.addEventListener('abort', () => {
      abortedAt = clock.now() - t0
    })
    for (let step = 0; step < 5; step++) {
      clock.advance(every)
      for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve))
    }
    const lost = events.find((e) => e.type === 'lease_lost')
    this.#expect(
      `${what}: its renewals`,
      calls.filter((c) => c.startsWith('renew')),
      renewals,
    )
    this.#expect(`${what}: when it lost its lease, and its signal was aborted`, [lost?.durationMs, abortedAt], [lostAt, lostAt])
    await begun.fail(new Error('done'))
  }

  /**
   * Fingerprints stay what they were: a record written by the last version must match the same request sent again
   * by this one (a rolling deploy's retries), so the bytes hashed are fixed (docs/http.md, "Fingerprints"): the
   * method, the path with its query, and the body, canonical JSON (`json`), or as it came (`bytes`). Computed here
   * with node:crypto over the bytes spelt out, beside the engine's and the ledger's own.
   */
  async #fingerprints(): Promise<void> {
    const rng = this.#rng
    const method = rng.pick(['POST', 'put', 'PATCH'])
    const url = rng.pick(['/charges', '/orders/7?expand=items', '/ünï'])
    const n = rng.int(1_000)
    const text = rng.pick([`amount=${n}`, `☕ ${n}`, '', `{"b":${n},"a":"x"}`])
    const body = new TextEncoder().encode(text)
    const json = rng.chance(0.5) && text.startsWith('{')
    const req = { method, url, headers: { 'content-type': json ? 'application/json' : 'text/plain' }, body: async () => body }
    const head = `${method.toUpperCase()} ${url}\n`
    const expected = json
      ? sha256(`${head}json\n{"a":"x","b":${n}}`)
      : createHash('sha256').update(head).update('bytes\n').update(body).digest('hex')
    this.#expect(
      `the fingerprint of ${method} ${url} (${req.headers['content-type']}) ${JSON.stringify(text)}`,
      requestFingerprint(req, body),
      expected,
    )
    // Telemetry's hashed key (the operator page and spans name a record by it): the first 16 hex digits of scope\nkey.
    this.#expect(`the key hash of ${url}`, keyHash('acme', url), sha256(`acme\n${url}`).slice(0, 16))
    // The ledger's: a payload's canonical JSON, or its bytes as they are.
    const payload = rng.chance(0.5) ? body : { b: n, a: 'x' }
    this.#expect(
      `fingerprintOf(${payload instanceof Uint8Array ? `the bytes of ${JSON.stringify(text)}` : JSON.stringify(payload)})`,
      fingerprintOf(payload),
      payload instanceof Uint8Array ? sha256(body) : sha256(`{"a":"x","b":${n}}`),
    )
  }

  /** A handler's steps (docs/steps.md): a wrong name, a wrong function, a value JSON cannot keep, too many or too big; or the edge of each. */
  async #steps(): Promise<void> {
    const rng = this.#rng
    const { clock, memory, calls, leases, key } = this.#fresh()
    const wrong = rng.pick([
      'name',
      'fn',
      'twice',
      'unencodable',
      'size',
      'count',
      'no-steps',
      'fenced',
      'reconcile',
      'captures',
      undefined,
    ] as const)
    const markers = rng.chance(0.5)
    const base = counted(memory, calls, leases, wrong === 'no-steps' ? 'recordStep' : undefined)
    // fenced: a store that took the record over meanwhile refuses the step (its token is no longer current).
    const store = wrong === 'fenced' ? overriding(base, { recordStep: async () => false }) : base
    const ledger = this.#ledger(store, clock, 2_000)
    if (wrong === 'reconcile') return this.#reconcileGoneWrong(ledger, memory, clock, key)
    if (wrong === 'captures') return this.#capturesKept(ledger, memory, key)
    const valid = (length: number) => Array.from({ length }, () => rng.pick([...STEP_NAME_CHARS])).join('')
    let refusal: [string, string[]] | undefined
    const name = valid(1 + rng.int(64))
    // A step that returns nothing keeps null.
    let work = async (ctx: IntentContext): Promise<unknown> => [
      await ctx.step(name, () => ({ ok: name })),
      await ctx.capture(valid(64), () => 'kept'),
      await ctx.step('nothing', () => undefined),
    ]
    let expected: unknown = [{ ok: name }, 'kept', null]
    if (wrong === 'name') {
      const bad = rng.pick<unknown>(['', valid(65), 'with space', 'ünï', 'a/b', '$now:1', 'q"uote', 7, null])
      const via = rng.pick(['step', 'capture'] as const)
      refusal = ['INVALID_ARGUMENT', [`ctx.${via}`, JSON.stringify(bad)]]
      work = (ctx) => (via === 'step' ? ctx.step(bad as string, () => 1) : ctx.capture(bad as string, () => 1))
    } else if (wrong === 'fn') {
      refusal = ['INVALID_ARGUMENT', [`ctx.step("${name}"`]]
      work = (ctx) => ctx.step(name, rng.pick([undefined, 'charge', 5]) as never)
    } else if (wrong === 'twice') {
      refusal = ['INVALID_ARGUMENT', [`Step "${name}"`, 'twice']]
      work = async (ctx) => [await ctx.step(name, () => 1), await ctx.step(name, () => 2)]
    } else if (wrong === 'unencodable') {
      const cyclic: Record<string, unknown> = {}
      cyclic.self = cyclic
      const [bad, names] = rng.pick<[unknown, string[]]>([
        [10n, ['cannot encode']],
        [cyclic, ['cannot encode']],
        [() => 1, ['function']],
        [Symbol('s'), ['function']],
      ])
      refusal = ['INVALID_ARGUMENT', [`Step "${name}"`, ...names]]
      work = (ctx) => ctx.step(name, () => bad)
    } else if (wrong === 'fenced') {
      refusal = ['FENCED_OUT', [`Step "${name}"`, `acme/${key}`]]
      work = (ctx) => ctx.step(name, () => 1)
    } else if (wrong === 'no-steps') {
      const via = rng.pick(['step', 'capture', 'now', 'uuid', 'random'] as const)
      refusal = ['INVALID_OPTION', [`ctx.${via === 'step' ? 'step' : 'capture'}`, 'memory']]
      work = (ctx) => (via === 'step' || via === 'capture' ? ctx[via](name, () => 1) : ctx[via]())
    }
    // The size and count rules, over the edge or at it: 64 KiB of JSON (two-byte characters or one-byte), 256 steps.
    const over = rng.chance(0.5)
    if (wrong === 'size' || (wrong === undefined && rng.chance(0.3))) {
      const wide = rng.chance(0.5)
      const bytes = MAX_STEP_BYTES + (wrong === 'size' ? (wide ? 2 : 1) : 0)
      const text = wide ? 'é'.repeat((bytes - 2) / 2) : 'a'.repeat(bytes - 2)
      if (wrong === 'size') refusal = ['INVALID_ARGUMENT', [`Step "${name}"`, `${bytes} bytes`]]
      work = (ctx) => ctx.step(name, () => text)
      expected = text
    } else if (wrong === 'count' || (wrong === undefined && over)) {
      const steps = MAX_STEPS + (wrong === 'count' ? 1 : 0)
      // The last one's name is none of the others' (s1, c1, $now:1, …).
      if (wrong === 'count') refusal = ['INVALID_ARGUMENT', ['Step "last"', `${MAX_STEPS + 1}th`]]
      work = async (ctx) => {
        for (let i = 1; i < steps; i++)
          await rng.pick([() => ctx.step(`s${i}`, () => i), () => ctx.capture(`c${i}`, () => i), () => ctx.now()])()
        return ctx.step('last', () => 'last')
      }
      expected = 'last'
    }
    const what = `a handler whose steps ${wrong ? `are wrong (${wrong})` : 'keep to the rules'}${markers ? ', with started markers' : ''}`
    const runOptions = markers ? { reconcile: () => {} } : {}
    const settled = await settle(() => ledger.run({ scope: 'acme', key }, (ctx) => work(ctx), runOptions))
    if (refusal) {
      this.#refused(what, settled, ...refusal)
      // A value JSON cannot encode is refused with JSON's own error as the cause.
      if (
        wrong === 'unencodable' &&
        refusal[1].includes('cannot encode') &&
        !((settled as { error?: Error }).error?.cause instanceof TypeError)
      )
        this.#violation(`misuse: ${what}: the refusal does not carry JSON's own error as its cause`)
      // A mistake in the work is a transient failure: the record is released, for a fixed deploy to run.
      const record = await memory.get('acme', key)
      if (record?.status !== 'in_progress' || record.lockedUntilMs !== clock.now())
        this.#violation(`misuse: ${what}: its record was not released (${record?.status} until ${record?.lockedUntilMs})`)
      return
    }
    const result = this.#taken(what, settled) as { kind: string; value: unknown } | undefined
    if (!result) return
    if (expected !== undefined) this.#expect(`${what}: its value`, result.value, expected)
    const replayed = (await ledger.run({ scope: 'acme', key }, () => 'ran again', runOptions)) as { kind: string; value?: unknown }
    this.#expect(`${what}, again`, [replayed.kind, replayed.value], ['replayed', result.value])
  }

  /**
   * Captured values are kept under the names the last version gave them (`$now:1`, `$uuid:1`, …, counted from 1 in
   * each attempt, docs/steps.md), so a takeover by the next version replays them instead of capturing anew.
   */
  async #capturesKept(ledger: Ledger, memory: MemoryStore, key: string): Promise<void> {
    const rng = this.#rng
    const takes = Array.from({ length: 2 + rng.int(4) }, () => rng.pick(['now', 'uuid', 'random'] as const))
    await settle(() =>
      ledger.run({ scope: 'acme', key }, async (ctx) => {
        for (const take of takes) await ctx[take]()
        throw new Error('bank unavailable')
      }),
    )
    const counts = { now: 0, uuid: 0, random: 0 }
    const expected = takes.map((take) => `$${take}:${++counts[take]}`).sort()
    const taken = (await memory.acquire('acme', key, sha256('null'), 1_000)) as { steps?: { name: string }[] }
    this.#expect(`the names of the values ${takes.join(', ')} captured`, (taken.steps ?? []).map((step) => step.name).sort(), expected)
  }

  /**
   * A takeover's `reconcile` gone wrong (docs/steps.md, "Reconciling"): it throws, or records a step under a wrong
   * name. The run (or `begin`) fails with that error and the record is released, as a failed work's is.
   */
  async #reconcileGoneWrong(ledger: Ledger, memory: MemoryStore, clock: StillClock, key: string): Promise<void> {
    const rng = this.#rng
    // A first attempt starts a step and fails in it: its started marker stays, pending, for the next attempt. Or it
    // fails before any step, and leaves nothing to reconcile: the takeover's reconcile is not called.
    const pending = rng.chance(0.7)
    await settle(() =>
      ledger.run(
        { scope: 'acme', key },
        (ctx) =>
          pending
            ? ctx.step('charge', () => {
                throw new Error('bank timeout')
              })
            : Promise.reject(new Error('bank timeout')),
        { reconcile: () => {} },
      ),
    )
    const bad = rng.pick<unknown>(['', 'with space', 'x'.repeat(65), 7])
    const throws = rng.chance(0.5)
    const via = rng.pick(['run', 'begin'] as const)
    const reconcile: Reconcile = throws
      ? () => {
          throw new Error('reconcile bug')
        }
      : (_pending, rctx) => rctx.recordStep(bad as string, 'ch_1')
    const what = `a takeover through ${via} whose reconcile ${throws ? 'throws' : `records the step ${JSON.stringify(bad)}`}`
    const settled = await settle(() =>
      via === 'run' ? ledger.run({ scope: 'acme', key }, () => 'ran', { reconcile }) : ledger.begin({ scope: 'acme', key }, { reconcile }),
    )
    if (!pending) {
      const taken = this.#taken(`${what}, with nothing to reconcile`, settled) as { kind: string } | undefined
      if (taken) this.#expect(`${what}, with nothing to reconcile`, taken.kind, via === 'run' ? 'executed' : 'acquired')
      return
    }
    if (!throws) this.#refused(what, settled, 'INVALID_ARGUMENT', ['ctx.recordStep', JSON.stringify(bad)])
    else if (settled.ok || (settled.error as Error).message !== 'reconcile bug')
      this.#violation(`misuse: ${what} must fail with its error, and ${describe(settled)}`)
    const record = await memory.get('acme', key)
    this.#expect(`${what}: its record`, [record?.status, record?.token, record?.lockedUntilMs], ['in_progress', 2, clock.now()])
  }

  /** `runInTransaction` on a store that runs none, with a wrong `failedWrites`, without savepoints; or right. */
  async #transaction(): Promise<void> {
    const rng = this.#rng
    const { clock, memory, calls, leases, key } = this.#fresh()
    const savepoints: string[] = []
    const plain = counted(memory, calls, leases)
    const savepoint = rng.chance(0.5)
    const inTx = rng.chance(0.5)
    const withResource = rng.chance(0.5)
    // A store that runs transactions (its writes commit at once, as a driver in autocommit would), with or without
    // savepoints, and with or without recordStepInTransaction (without it, steps go to the store as outside one).
    const extra = {
      transaction: (fn: (tx: object) => Promise<unknown>) => fn({}),
      completeInTransaction: (_tx: object, ...args: Parameters<MemoryStore['complete']>) => plain.complete(...args),
      ...(savepoint ? { savepointInTransaction: async (_tx: object, command: string) => void savepoints.push(command) } : {}),
      // Steps in the transaction, when the store records them there (they commit with it).
      ...(inTx
        ? {
            recordStepInTransaction: (_tx: object, ...args: Parameters<MemoryStore['recordStep']>) => {
              calls.push('recordStepInTransaction')
              return memory.recordStep(...args)
            },
          }
        : {}),
    }
    const transactional = overriding(plain, extra)
    const none = rng.chance(0.2)
    const ledger = this.#ledger(none ? plain : transactional, clock, 2_000)
    const failedWrites = rng.pick<unknown>([undefined, 'rollback', 'commit', 'Commit', 'keep', 1, null])
    // What the work's value is classified as: a transient failure rolls the transaction back and releases the record.
    const classified = rng.pick(['completed', 'failed', 'transient'] as const)
    const failed = classified === 'failed'
    const what = `runInTransaction, its value ${classified}, on ${none ? 'a store without transactions' : `a store ${savepoint ? 'with' : 'without'} savepoints`}, failedWrites ${json(failedWrites)}`
    const settled = await settle(() =>
      ledger.runInTransaction(
        { scope: 'acme', key },
        async (ctx) => ({ ok: await ctx.step('write', () => key), none: await ctx.step('nothing', () => undefined) }),
        {
          failedWrites: failedWrites as never,
          classify: () => classified,
          ...(withResource ? { resourceId: (value: { ok: string }) => value.ok } : {}),
        },
      ),
    )
    if (none) return this.#refused(what, settled, 'INVALID_OPTION', ['runInTransaction', 'memory'], calls)
    if (failedWrites !== undefined && failedWrites !== 'rollback' && failedWrites !== 'commit')
      return this.#refused(what, settled, 'INVALID_OPTION', ['failedWrites', JSON.stringify(failedWrites)], calls)
    if (!savepoint && failedWrites !== 'commit')
      return this.#refused(what, settled, 'INVALID_OPTION', ['memory', 'savepointInTransaction', "failedWrites: 'commit'"], calls)
    const result = this.#taken(what, settled) as { kind: string; outcome: string; value: unknown } | undefined
    if (!result) return
    const transient = classified === 'transient'
    this.#expect(
      `${what}: its result`,
      [result.kind, result.outcome, result.value],
      ['executed', transient ? 'released' : classified, { ok: key, none: null }],
    )
    // The savepoint is set around the work and rolled back to for a final failure, unless its writes are to commit.
    const rollback = failedWrites !== 'commit'
    this.#expect(`${what}: its savepoints`, savepoints, rollback ? (failed ? ['set', 'rollback'] : ['set']) : [])
    const record = await memory.get('acme', key)
    // A transient failure keeps nothing: the record is released, in progress under its token, its lease over now.
    this.#expect(
      `${what}: its record`,
      [record?.status, record?.resourceId, transient ? record?.lockedUntilMs : undefined],
      transient ? ['in_progress', null, clock.now()] : [classified, withResource ? key : null, undefined],
    )
    this.#expect(`${what}: its releases`, calls.filter((c) => c === 'release').length, transient ? 1 : 0)
    this.#expect(
      `${what}: its steps recorded in the transaction`,
      calls.filter((c) => c === 'recordStepInTransaction').length,
      inTx ? 2 : 0,
    )
  }

  /**
   * One record's life in the store, at the exact millisecond each edge falls (the store's own clock): a lease of
   * L taken at t ends at t+L (a takeover from then, not before), a reuse with another request is refused while
   * the record lives, and a record whose retention has ended is absent (a new one, token counting on). With the
   * store's own refusals of a wrong argument, which change nothing.
   */
  async #storeEdges(): Promise<void> {
    const rng = this.#rng
    const clock = new StillClock(1_800_000_000_000 + rng.int(1_000_000))
    const badRetention = rng.chance(0.1)
    const retention = rng.chance(0.5) ? undefined : this.#duration(false)
    // A retention of 0 is allowed (a record is purgeable the moment its lease ends).
    const options = {
      clock,
      ...(badRetention ? { abandonedRetention: this.#badDuration(true) } : retention ? { abandonedRetention: retention[0] } : {}),
    }
    const badClock = !badRetention && rng.chance(0.1)
    if (badClock) (options as Record<string, unknown>).clock = rng.pick<unknown>([{ now: (): number => 1 }, 'utc'])
    const made = await settle(() => new MemoryStore(options as never))
    const what = `new MemoryStore(${json(options)})`
    if (badRetention) return this.#refused(what, made, 'INVALID_OPTION', ['abandonedRetention'])
    if (badClock) return this.#refused(what, made, 'INVALID_OPTION', ['new MemoryStore()', 'clock'])
    const store = this.#taken(what, made) as MemoryStore
    if (!store) return
    if (this.#defect === 'lease-edge') {
      // Defect: a store that reads its clock one millisecond late when it decides an acquire (a lease ends a tick late).
      const real = store.acquire.bind(store)
      store.acquire = (...args) => {
        clock.t -= 1
        try {
          return real(...args)
        } finally {
          clock.t += 1
        }
      }
    }
    const retentionMs = retention?.[1] ?? DEFAULT_RETENTION_MS
    const [scope, key] = ['acme', `edge-${++this.#cases}`]
    const [mine, other] = [sha256(`a${key}`), sha256(`b${key}`)]
    const leaseMs = 1 + rng.int(5_000)
    const ttlMs = 1 + rng.int(10_000)
    const at = (label: string, result: unknown, expected: unknown) => this.#expect(`the store, ${label}`, result, expected)
    const snapshot = async () => json(await store.list({ includeExpired: true, limit: 100 }))

    const t0 = clock.t
    at('a first acquire', await store.acquire(scope, key, mine, leaseMs), { kind: 'acquired', token: 1 })
    const stepped = rng.chance(0.5)
    if (stepped) await store.recordStep(scope, key, 1, 'charge', null)
    // A step's result replaces its marker; a marker written after it (a late write of the same holder) does not.
    const charged = stepped && rng.chance(0.5)
    if (charged) await store.recordStep(scope, key, 1, 'charge', '"ch_1"')
    if (charged && rng.chance(0.5)) await store.recordStep(scope, key, 1, 'charge', null)
    const steps = [{ name: 'charge', result: charged ? '"ch_1"' : null }]
    // The store's own refusals, of the holder's calls too: each names its argument and changes nothing.
    const before = await snapshot()
    const wrongs: [string, () => unknown, string, string][] = [
      [
        'acquire with a lease of',
        () => store.acquire(scope, key, mine, rng.pick([0, -5, 1.5, '100', Number.NaN]) as number),
        'INVALID_ARGUMENT',
        'leaseMs',
      ],
      ['acquire with a fingerprint', () => store.acquire(scope, key, mine.toUpperCase(), leaseMs), 'FINGERPRINT_INVALID', 'Fingerprint'],
      ['renew with a lease of', () => store.renew(scope, key, 1, 0), 'INVALID_ARGUMENT', 'leaseMs'],
      [
        'complete with a ttl of',
        () => store.complete(scope, key, 1, { status: 'completed', response: null } as never, -1),
        'INVALID_ARGUMENT',
        'ttlMs',
      ],
      ['purgeExpired with a limit of', () => store.purgeExpired(rng.pick([0, 2.5])), 'INVALID_ARGUMENT', 'limit'],
    ]
    const [label, call, code, name] = rng.pick(wrongs)
    this.#refused(`the store's ${label} a wrong value`, await settle(call), code, [name])
    at(`after refusing ${label} a wrong value`, await snapshot(), before)

    // One millisecond before the lease ends: the record is held; another request under the key is refused.
    clock.t = t0 + leaseMs - 1
    at(`${leaseMs - 1}ms into a ${leaseMs}ms lease`, await store.acquire(scope, key, mine, leaseMs), {
      kind: 'in_progress',
      lockedUntilMs: t0 + leaseMs,
    })
    at(`${leaseMs - 1}ms into a ${leaseMs}ms lease, another request`, await store.acquire(scope, key, other, leaseMs), { kind: 'mismatch' })
    // The millisecond it ends: a takeover, by the same request, or by another when the first left no steps.
    clock.t = t0 + leaseMs
    const by = rng.chance(0.5) ? mine : other
    const takeover = await store.acquire(scope, key, by, leaseMs)
    if (by === other && stepped) {
      at('at the end of a lease whose holder started a step, another request', takeover, { kind: 'mismatch' })
      return
    }
    at(
      `at the end of a ${leaseMs}ms lease${by === other ? ', another request' : ''}`,
      takeover,
      stepped ? { kind: 'acquired', token: 2, steps } : { kind: 'acquired', token: 2 },
    )
    // A stale holder's calls are refused and change nothing.
    const mid = await snapshot()
    at(
      'a stale holder',
      [await store.renew(scope, key, 1, leaseMs), await store.release(scope, key, 1), await store.recordStep(scope, key, 1, 'x', '1')],
      [false, false, false],
    )
    // A scope that holds nothing: nothing to read, hold, complete or evict.
    const response = { status: 200, headers: {}, body: new TextEncoder().encode(key) }
    at(
      'a scope that holds nothing',
      [
        await store.get('nobody', key),
        await store.renew('nobody', key, 2, leaseMs),
        await store.complete('nobody', key, 2, { status: 'completed', response, resourceId: null }, ttlMs),
        await store.release('nobody', key, 2),
        await store.recordStep('nobody', key, 2, 'x', '1'),
        await store.evict('nobody', key),
        await store.list({ scope: 'nobody' }),
      ],
      [null, false, false, false, false, false, []],
    )
    at('after a stale holder', await snapshot(), mid)
    // Completed at t1, kept for ttl: replayed (and another request refused) until t1+ttl, absent from then.
    const t1 = clock.t + rng.int(leaseMs)
    clock.t = t1
    if (rng.chance(0.3)) {
      // Released instead (a transient failure): taken over at once, by its own request.
      at('a release', await store.release(scope, key, 2), true)
      at('right after a release', await store.acquire(scope, key, by, leaseMs), {
        kind: 'acquired',
        token: 3,
        ...(stepped ? { steps } : {}),
      })
      return
    }
    at('a complete', await store.complete(scope, key, 2, { status: 'completed', response, resourceId: null }, ttlMs), true)
    clock.t = t1 + ttlMs - 1
    const replay = (await store.acquire(scope, key, by, leaseMs)) as { kind: string; record?: StoredRecord }
    at(
      `${ttlMs - 1}ms into a ${ttlMs}ms retention`,
      [replay.kind, replay.record?.token, replay.record?.expiresAtMs],
      ['replay', 2, t1 + ttlMs],
    )
    at(
      `${ttlMs - 1}ms into a ${ttlMs}ms retention, another request`,
      await store.acquire(scope, key, by === mine ? other : mine, leaseMs),
      { kind: 'mismatch' },
    )
    clock.t = t1 + ttlMs
    at(`at the end of a ${ttlMs}ms retention, a read`, await store.get(scope, key), null)
    const reborn = await store.acquire(scope, key, other, leaseMs)
    at(`at the end of a ${ttlMs}ms retention, another request`, reborn, { kind: 'acquired', token: 3 })
    const record = await store.get(scope, key)
    at(
      'a record made anew',
      [record?.attempts, record?.createdAtMs, record?.fingerprint, record?.expiresAtMs],
      [1, clock.t, other, clock.t + leaseMs + retentionMs],
    )
  }
}
