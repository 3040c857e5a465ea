import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import { ManualClock } from '../core/clock.js'
import type { AcquireResult, IdempotencyStore, RecordStatus } from '../core/store.js'
import { describeSkipped, resolveHarness, type SuiteOptions } from './harness.js'
import { fp, type StoreFactory, sampleOutcome } from './store-contract.js'
import { describeStoreStepsModel } from './store-steps-model.js'

/** Options of {@link describeStoreModel}. */
export interface StoreModelOptions extends SuiteOptions {
  /** How many random command sequences to run. @default 1000 */
  numRuns?: number
  /** Fixed seed, to replay a failure fast-check printed. */
  seed?: number
  teardown?: () => unknown
}

const LEASE_MS = 30_000
const TTL_MS = 120_000
const RETENTION_MS = 24 * 60 * 60 * 1000
const KEYS = ['k0', 'k1'] as const
const HOLDERS = 3
const FINGERPRINTS = [fp('model-a'), fp('model-b')] as const

/** The reference model of one record: the store contract written as plainly as it can be. */
interface ModelRecord {
  fingerprint: string
  status: RecordStatus
  token: number
  lockedUntilMs: number | null
  expiresAtMs: number
  attempts: number
  body: number | null
}

type Command =
  | { op: 'acquire'; key: number; holder: number; fingerprint: number }
  | { op: 'renew'; key: number; holder: number }
  | { op: 'complete'; key: number; holder: number; status: 'completed' | 'failed'; body: number }
  | { op: 'release'; key: number; holder: number }
  | { op: 'advance'; ms: number }
  | { op: 'purge' }
  | { op: 'get'; key: number }

/** A small executable model of the store contract, compared step by step with the real store. */
class Model {
  readonly records = new Map<string, ModelRecord>()

  acquire(key: string, fingerprint: string, now: number): AcquireResult {
    const record = this.records.get(key)
    const lockedUntilMs = now + LEASE_MS
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
}

const commandArb: fc.Arbitrary<Command> = fc.oneof(
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
      body: fc.nat(255),
    }),
  },
  { weight: 3, arbitrary: fc.record({ op: fc.constant('release' as const), key: fc.nat(1), holder: fc.nat(HOLDERS - 1) }) },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('advance' as const),
      ms: fc.constantFrom(1, LEASE_MS / 2, LEASE_MS, LEASE_MS + 1, TTL_MS + 1, RETENTION_MS),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ op: 'purge' as const }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('get' as const), key: fc.nat(1) }) },
)

/**
 * Property-based model test (fast-check): random sequences of acquire / renew / complete / release /
 * clock advances / purges across several holders, each step compared with a reference model of the
 * store contract. Stores on a server's clock cannot have their time moved, so for them the sequences
 * hold no clock advances and no purges (their lease and TTL behaviour is pinned by `describeStore`).
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
      const commands = fc
        .array(commandArb, { minLength: 1, maxLength: 40 })
        .map((list) => (store.serverClock ? list.filter((c) => c.op !== 'advance' && c.op !== 'purge') : list))
      await fc.assert(
        fc.asyncProperty(commands, async (list) => {
          const scope = `model-${randomUUID()}`
          const model = new Model()
          const tokens = new Map<string, number>() // `${holder}/${key}` → the token that holder last got
          const now = () => clock.now()
          for (const [step, command] of list.entries()) {
            const at = `step ${step} ${JSON.stringify(command)}`
            switch (command.op) {
              case 'acquire': {
                const key = KEYS[command.key] as string
                const fingerprint = FINGERPRINTS[command.fingerprint] as string
                const expected = model.acquire(key, fingerprint, now())
                const actual = await store.acquire(scope, key, fingerprint, LEASE_MS)
                assert.equal(actual.kind, expected.kind, at)
                if (actual.kind === 'acquired' && expected.kind === 'acquired') {
                  assert.equal(actual.token, expected.token, at)
                  tokens.set(`${command.holder}/${key}`, actual.token)
                }
                if (actual.kind === 'in_progress' && expected.kind === 'in_progress' && !store.serverClock) {
                  assert.equal(actual.lockedUntilMs, expected.lockedUntilMs, at)
                }
                if (actual.kind === 'replay') {
                  const record = model.records.get(key) as ModelRecord
                  assert.equal(actual.record.status, record.status, at)
                  assert.equal(actual.record.token, record.token, at)
                  assert.deepEqual([...(actual.record.response?.body ?? [])], [record.body], at)
                }
                break
              }
              case 'renew':
              case 'release':
              case 'complete': {
                const key = KEYS[command.key] as string
                const token = tokens.get(`${command.holder}/${key}`) ?? 1
                const record = model.held(key, token)
                let actual: boolean
                if (command.op === 'renew') {
                  actual = await store.renew(scope, key, token, LEASE_MS)
                  if (record) Object.assign(record, { lockedUntilMs: now() + LEASE_MS, expiresAtMs: now() + LEASE_MS + RETENTION_MS })
                } else if (command.op === 'release') {
                  actual = await store.release(scope, key, token)
                  if (record) Object.assign(record, { lockedUntilMs: now(), expiresAtMs: now() + RETENTION_MS })
                } else {
                  const outcome = sampleOutcome(command.status, Uint8Array.of(command.body))
                  actual = await store.complete(scope, key, token, outcome, TTL_MS)
                  if (record)
                    Object.assign(record, { status: command.status, lockedUntilMs: null, expiresAtMs: now() + TTL_MS, body: command.body })
                }
                assert.equal(actual, record !== undefined, at)
                break
              }
              case 'advance':
                clock.advance(command.ms)
                break
              case 'purge':
                while ((await store.purgeExpired(500)) === 500) {}
                model.purge(now())
                break
              case 'get': {
                const key = KEYS[command.key] as string
                const record = model.records.get(key)
                const expected = record && record.expiresAtMs > now() ? record : undefined
                const actual = await store.get(scope, key)
                assert.equal(actual === null, expected === undefined, at)
                if (actual && expected) {
                  assert.equal(actual.status, expected.status, at)
                  assert.equal(actual.token, expected.token, at)
                  assert.equal(actual.fingerprint, expected.fingerprint, at)
                  assert.equal(actual.attempts, expected.attempts, at)
                  if (!store.serverClock) {
                    assert.equal(actual.lockedUntilMs, expected.lockedUntilMs, at)
                    assert.equal(actual.expiresAtMs, expected.expiresAtMs, at)
                  }
                }
                break
              }
            }
          }
        }),
        { numRuns: options.numRuns ?? 1_000, seed: options.seed },
      )
    })

    describeStoreStepsModel(createStore, harness, options.numRuns ?? 1_000, options.seed)
  })
}
