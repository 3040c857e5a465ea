import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import { ManualClock } from '../core/clock.js'
import type { AcquireResult, IdempotencyStore, RecordStatus } from '../core/store.js'
import { describeSkipped, resolveHarness, type SuiteOptions } from './harness.js'
import { fp, type StoreFactory, sampleOutcome, skipRunning } from './store-fixtures.js'
import { describeStoreStepsModel } from './store-steps-model.js'

/** Options of {@link describeStoreModel}. */
export interface StoreModelOptions extends SuiteOptions {
  /**
   * How many random command sequences to run. `IDEMKEY_MODEL_RUNS` in the environment caps it (a mutation
   * run, which repeats the suites for every mutant, sets it lower). @default 1000
   */
  numRuns?: number
  /**
   * How many sequences the real-time model runs on a store whose clock is its server's: each
   * waits out real leases and TTLs, so each takes a fraction of a second. @default 30
   */
  realTimeRuns?: number
  /** Fixed seed, to replay a failure fast-check printed. */
  seed?: number
  teardown?: () => unknown
}

/** `numRuns`, capped by `IDEMKEY_MODEL_RUNS` when it is set to a positive whole number. */
export function modelRuns(numRuns: number | undefined): number {
  const runs = numRuns ?? 1_000
  const cap = Number(process.env.IDEMKEY_MODEL_RUNS)
  return Number.isSafeInteger(cap) && cap > 0 ? Math.min(runs, cap) : runs
}

/** Lease and TTL on an injected clock, which the sequences move by hand. */
const CLOCK_TIMES = { leaseMs: 30_000, ttlMs: 120_000 }
/** Lease and TTL in real time, for the stores on their server's clock: short, so sequences can wait them out. */
const REAL_TIMES = { leaseMs: 150, ttlMs: 400 }
/**
 * In real time, a step whose outcome depends on a deadline closer than this to the instant the store
 * ran it (the store's clock and this process's agree only so far, and a call takes time) is not
 * compared: the sequence waits past such deadlines first, and one that still lands there is dropped.
 */
const REAL_TIME_MARGIN_MS = 40
const RETENTION_MS = 24 * 60 * 60 * 1000
const KEYS = ['k0', 'k1'] as const
const HOLDERS = 3
const FINGERPRINTS = [fp('model-a'), fp('model-b')] as const

/** A deadline the model knows to within `slackMs` after `atMs` (the time a store call took). */
interface Deadline {
  atMs: number
  slackMs: number
}

/** The reference model of one record: the store contract written as plainly as it can be. */
interface ModelRecord {
  fingerprint: string
  status: RecordStatus
  token: number
  lockedUntilMs: number | null
  expiresAtMs: number
  attempts: number
  body: Uint8Array | null
  /** How well the lease end and the expiry are known: 0 on an injected clock. */
  lockSlackMs: number
  expirySlackMs: number
}

type Command =
  | { op: 'acquire'; key: number; holder: number; fingerprint: number }
  | { op: 'renew'; key: number; holder: number }
  | { op: 'complete'; key: number; holder: number; status: 'completed' | 'failed'; body: Uint8Array }
  | { op: 'release'; key: number; holder: number }
  | { op: 'advance'; step: number }
  | { op: 'purge' }
  | { op: 'get'; key: number }

/** A small executable model of the store contract, compared step by step with the real store. */
class Model {
  readonly records = new Map<string, ModelRecord>()
  constructor(readonly leaseMs: number) {}

  acquire(key: string, fingerprint: string, now: number, slackMs: number): AcquireResult {
    const record = this.records.get(key)
    const lockedUntilMs = now + this.leaseMs
    const slack = { lockSlackMs: slackMs, expirySlackMs: slackMs }
    if (!record || record.expiresAtMs <= now) {
      const token = (record?.token ?? 0) + 1
      this.records.set(key, {
        fingerprint,
        status: 'in_progress',
        token,
        lockedUntilMs,
        expiresAtMs: lockedUntilMs + RETENTION_MS,
        attempts: 1,
        body: null,
        ...slack,
      })
      return { kind: 'acquired', token }
    }
    const live = record.status !== 'in_progress' || (record.lockedUntilMs as number) > now
    if (live) {
      if (record.fingerprint !== fingerprint) return { kind: 'mismatch' }
      if (record.status === 'in_progress') return { kind: 'in_progress', lockedUntilMs: record.lockedUntilMs as number }
      return { kind: 'replay', record: undefined as never }
    }
    Object.assign(record, {
      fingerprint,
      token: record.token + 1,
      attempts: record.attempts + 1,
      lockedUntilMs,
      expiresAtMs: lockedUntilMs + RETENTION_MS,
      ...slack,
    })
    return { kind: 'acquired', token: record.token }
  }

  held(key: string, token: number): ModelRecord | undefined {
    const record = this.records.get(key)
    return record && record.token === token && record.status === 'in_progress' ? record : undefined
  }

  purge(now: number): void {
    for (const [key, record] of this.records) if (record.expiresAtMs <= now) this.records.delete(key)
  }

  /** The deadlines a step on `key` (every key when undefined) depends on; `lease` for an acquire. */
  deadlines(key: string | undefined, lease: boolean): Deadline[] {
    const records = key === undefined ? [...this.records.values()] : [this.records.get(key)].filter((r) => r !== undefined)
    return records.flatMap((r) => [
      { atMs: r.expiresAtMs, slackMs: r.expirySlackMs },
      ...(lease && r.status === 'in_progress' && r.lockedUntilMs !== null ? [{ atMs: r.lockedUntilMs, slackMs: r.lockSlackMs }] : []),
    ])
  }
}

/** Each `advance` step moves time by one of these, in units of the lease and TTL of the mode. */
const ADVANCES = [
  (_: typeof CLOCK_TIMES) => 1,
  (t: typeof CLOCK_TIMES) => t.leaseMs / 2,
  (t: typeof CLOCK_TIMES) => t.leaseMs,
  (t: typeof CLOCK_TIMES) => t.leaseMs + 1,
  (t: typeof CLOCK_TIMES) => t.ttlMs + 1,
  (_: typeof CLOCK_TIMES) => RETENTION_MS,
]

/** Bodies of every size the stores treat alike: empty, one byte, and longer runs of any byte values. */
const bodyArb = fc.oneof(fc.constant(new Uint8Array(0)), fc.uint8Array({ minLength: 1, maxLength: 1 }), fc.uint8Array({ maxLength: 600 }))

function commandArb(advances: number): fc.Arbitrary<Command> {
  return fc.oneof(
    {
      weight: 5,
      arbitrary: fc.record({ op: fc.constant('acquire' as const), key: fc.nat(1), holder: fc.nat(HOLDERS - 1), fingerprint: fc.nat(1) }),
    },
    { weight: 2, arbitrary: fc.record({ op: fc.constant('renew' as const), key: fc.nat(1), holder: fc.nat(HOLDERS - 1) }) },
    {
      weight: 4,
      arbitrary: fc.record({
        op: fc.constant('complete' as const),
        key: fc.nat(1),
        holder: fc.nat(HOLDERS - 1),
        status: fc.constantFrom('completed' as const, 'failed' as const),
        body: bodyArb,
      }),
    },
    { weight: 3, arbitrary: fc.record({ op: fc.constant('release' as const), key: fc.nat(1), holder: fc.nat(HOLDERS - 1) }) },
    { weight: 3, arbitrary: fc.record({ op: fc.constant('advance' as const), step: fc.nat(advances - 1) }) },
    { weight: 1, arbitrary: fc.constant({ op: 'purge' as const }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant('get' as const), key: fc.nat(1) }) },
  )
}

/** How one property moves time: an injected clock by hand, or real time by sleeping. */
interface TimeMode {
  times: typeof CLOCK_TIMES
  /** Real time, on the store's server clock: waits, and drops steps too close to a deadline. */
  real: boolean
  now(): number
  advance(ms: number): Promise<void>
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/**
 * Runs one command sequence against `store` in a fresh scope, comparing every step with the model.
 * `mode.real === false && store.serverClock`: time never moves (no advance, no purge in the sequence).
 */
async function runSequence(store: IdempotencyStore, list: Command[], mode: TimeMode): Promise<void> {
  const { leaseMs, ttlMs } = mode.times
  const scope = `model-${randomUUID()}`
  const model = new Model(leaseMs)
  const tokens = new Map<string, number>() // `${holder}/${key}` → the token that holder last got
  const exact = !store.serverClock
  /** In real time, waits until no deadline of `deadlines` is near now. */
  const settle = async (deadlines: Deadline[]) => {
    if (!mode.real) return
    for (;;) {
      const now = mode.now()
      const near = deadlines.filter((d) => d.atMs + d.slackMs + REAL_TIME_MARGIN_MS > now && d.atMs - 2 * REAL_TIME_MARGIN_MS < now)
      if (near.length === 0) return
      await sleep(Math.max(...near.map((d) => d.atMs + d.slackMs + REAL_TIME_MARGIN_MS - now)) + 1)
    }
  }
  /** In real time, drops the sequence when a deadline fell inside the call, from `t0` to now, give or take the margin. */
  const decided = (deadlines: Deadline[], t0: number) => {
    if (!mode.real) return
    const t1 = mode.now()
    fc.pre(deadlines.every((d) => d.atMs + d.slackMs + REAL_TIME_MARGIN_MS <= t0 || d.atMs - REAL_TIME_MARGIN_MS >= t1))
  }
  for (const [step, command] of list.entries()) {
    const at = `step ${step} ${JSON.stringify(command, (_, v) => (v instanceof Uint8Array ? Buffer.from(v).toString('hex') : v))}`
    switch (command.op) {
      case 'acquire': {
        const key = KEYS[command.key] as string
        const fingerprint = FINGERPRINTS[command.fingerprint] as string
        const deadlines = model.deadlines(key, true)
        await settle(deadlines)
        const t0 = mode.now()
        const actual = await store.acquire(scope, key, fingerprint, leaseMs)
        decided(deadlines, t0)
        const expected = model.acquire(key, fingerprint, t0, mode.now() - t0)
        assert.equal(actual.kind, expected.kind, at)
        if (actual.kind === 'acquired' && expected.kind === 'acquired') {
          assert.equal(actual.token, expected.token, at)
          tokens.set(`${command.holder}/${key}`, actual.token)
        }
        if (actual.kind === 'in_progress' && expected.kind === 'in_progress' && exact) {
          assert.equal(actual.lockedUntilMs, expected.lockedUntilMs, at)
        }
        if (actual.kind === 'replay') {
          const record = model.records.get(key) as ModelRecord
          assert.equal(actual.record.status, record.status, at)
          assert.equal(actual.record.token, record.token, at)
          assert.equal(Buffer.from(actual.record.response?.body ?? []).toString('hex'), Buffer.from(record.body ?? []).toString('hex'), at)
        }
        break
      }
      case 'renew':
      case 'release':
      case 'complete': {
        const key = KEYS[command.key] as string
        const token = tokens.get(`${command.holder}/${key}`) ?? 1
        const record = model.held(key, token)
        const t0 = mode.now()
        let actual: boolean
        if (command.op === 'renew') {
          actual = await store.renew(scope, key, token, leaseMs)
          if (record)
            Object.assign(record, { lockedUntilMs: t0 + leaseMs, expiresAtMs: t0 + leaseMs + RETENTION_MS, lockSlackMs: mode.now() - t0 })
        } else if (command.op === 'release') {
          actual = await store.release(scope, key, token)
          // The lease ends at the release: every later acquire finds it over, however close it follows.
          if (record) Object.assign(record, { lockedUntilMs: t0, expiresAtMs: t0 + RETENTION_MS, lockSlackMs: 0 })
        } else {
          const outcome = sampleOutcome(command.status, command.body)
          actual = await store.complete(scope, key, token, outcome, ttlMs)
          if (record) {
            Object.assign(record, {
              status: command.status,
              lockedUntilMs: null,
              expiresAtMs: t0 + ttlMs,
              expirySlackMs: mode.now() - t0,
              body: command.body,
            })
          }
        }
        assert.equal(actual, record !== undefined, at)
        break
      }
      case 'advance':
        await mode.advance((ADVANCES[command.step] as (t: typeof CLOCK_TIMES) => number)(mode.times))
        break
      case 'purge': {
        const deadlines = model.deadlines(undefined, false)
        await settle(deadlines)
        const t0 = mode.now()
        while ((await store.purgeExpired(500)) === 500) {}
        decided(deadlines, t0)
        model.purge(t0)
        break
      }
      case 'get': {
        const key = KEYS[command.key] as string
        const deadlines = model.deadlines(key, false)
        await settle(deadlines)
        const t0 = mode.now()
        const actual = await store.get(scope, key)
        decided(deadlines, t0)
        const record = model.records.get(key)
        const expected = record && record.expiresAtMs > t0 ? record : undefined
        assert.equal(actual === null, expected === undefined, at)
        if (actual && expected) {
          assert.equal(actual.status, expected.status, at)
          assert.equal(actual.token, expected.token, at)
          assert.equal(actual.fingerprint, expected.fingerprint, at)
          assert.equal(actual.attempts, expected.attempts, at)
          if (exact) {
            assert.equal(actual.lockedUntilMs, expected.lockedUntilMs, at)
            assert.equal(actual.expiresAtMs, expected.expiresAtMs, at)
          }
        }
        break
      }
    }
  }
}

/**
 * Property-based model test (fast-check): random sequences of acquire / renew / complete / release /
 * clock advances / purges across several holders, each step compared with a reference model of the
 * store contract, with response bodies of any length and bytes. On an injected clock, time moves by
 * hand. A store on its server's clock runs the sequences twice: without time moving (many runs), and
 * in real time with short leases and TTLs that the sequences wait out (fewer runs: they sleep), so
 * lease ends, takeovers, expiries and purges are compared there too.
 */
export function describeStoreModel(name: string, createStore: StoreFactory, options: StoreModelOptions = {}): void {
  const harness = resolveHarness(options.harness)
  const suiteName = `store model: ${name}`
  if (options.skip) {
    describeSkipped(harness, suiteName, options.skip)
    return
  }
  harness.describe(suiteName, () => {
    const clock = new ManualClock()
    let store: IdempotencyStore
    harness.beforeAll(async () => {
      store = await createStore({ clock })
    })
    harness.afterAll(async () => {
      await store?.close()
      await options.teardown?.()
    })

    harness.it('agrees with the reference model on every step of random command sequences', async () => {
      const mode: TimeMode = {
        times: CLOCK_TIMES,
        real: false,
        now: () => clock.now(),
        advance: async (ms) => clock.advance(ms),
      }
      const commands = fc
        .array(commandArb(ADVANCES.length), { minLength: 1, maxLength: 40 })
        .map((list) => (store.serverClock ? list.filter((c) => c.op !== 'advance' && c.op !== 'purge') : list))
      await fc.assert(
        fc.asyncProperty(commands, (list) => runSequence(store, list, mode)),
        { numRuns: modelRuns(options.numRuns), seed: options.seed },
      )
    })

    harness.it(
      "agrees with the reference model in real time on the server's clock: leases that end, takeovers, expiries, purges",
      async function (this: unknown, ...args: unknown[]) {
        if (!store.serverClock) return skipRunning(`${name} runs on an injected clock, which the test above moves`, this, args[0])
        const mode: TimeMode = { times: REAL_TIMES, real: true, now: () => Date.now(), advance: sleep }
        // Up to a lease and a half past the TTL (never the day-long retention): what real time can afford.
        const commands = fc.array(commandArb(ADVANCES.length - 1), { minLength: 10, maxLength: 25, size: 'max' })
        await fc.assert(
          fc.asyncProperty(commands, (list) => runSequence(store, list, mode)),
          { numRuns: options.realTimeRuns ?? 30, seed: options.seed, maxSkipsPerRun: 10 },
        )
      },
    )

    describeStoreStepsModel(createStore, harness, modelRuns(options.numRuns), options.seed)
  })
}
