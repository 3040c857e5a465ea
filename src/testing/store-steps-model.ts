import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import { ManualClock } from '../core/clock.js'
import { applyStep } from '../core/steps.js'
import type { IdempotencyStore } from '../core/store.js'
import type { TestHarness } from './harness.js'
import { fp, type StoreFactory, sampleOutcome } from './store-fixtures.js'

const LEASE_MS = 30_000
const TTL_MS = 120_000
const RETENTION_MS = 24 * 60 * 60 * 1000
const KEYS = ['k0', 'k1'] as const
const NAMES = ['charge', '$now:1'] as const
const RESULTS = [null, '{"id":"ch_1"}', null, '1'] as const

interface ModelRecord {
  token: number
  status: 'in_progress' | 'completed'
  lockedUntilMs: number
  expiresAtMs: number
  steps: Map<string, string | null>
}

type Command =
  | { op: 'acquire'; key: number; holder: number }
  | { op: 'release'; key: number; holder: number }
  | { op: 'complete'; key: number; holder: number }
  | { op: 'step'; key: number; holder: number; name: number; result: number }
  | { op: 'evict'; key: number }
  | { op: 'advance'; ms: number }
  | { op: 'purge' }

const key = fc.integer({ min: 0, max: KEYS.length - 1 })
const holder = fc.integer({ min: 0, max: 1 })
const commandArb: fc.Arbitrary<Command> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ op: fc.constant('acquire' as const), key, holder }) },
  { weight: 3, arbitrary: fc.record({ op: fc.constant('release' as const), key, holder }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('complete' as const), key, holder }) },
  {
    weight: 5,
    arbitrary: fc.record({
      op: fc.constant('step' as const),
      key,
      holder,
      name: fc.integer({ min: 0, max: NAMES.length - 1 }),
      result: fc.integer({ min: 0, max: RESULTS.length - 1 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('evict' as const), key }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('advance' as const), ms: fc.constantFrom(1_000, LEASE_MS + 1, TTL_MS + 1) }) },
  { weight: 1, arbitrary: fc.constant({ op: 'purge' as const }) },
)

/**
 * The steps half of the model test (fast-check): random acquire / release / complete / recordStep /
 * evict / clock / purge sequences across holders, each compared with a reference model, including the
 * steps every takeover's acquire returns. Run from `describeStoreModel`, inside its suite.
 */
export function describeStoreStepsModel(createStore: StoreFactory, harness: TestHarness, numRuns: number, seed?: number): void {
  harness.describe('steps', () => {
    const clock = new ManualClock()
    let store: IdempotencyStore
    harness.beforeAll(async () => {
      store = await createStore({ clock })
    })
    harness.afterAll(async () => {
      await store?.close()
    })

    harness.it('agrees with the reference model on recorded steps, fencing and what each takeover reads back', async () => {
      if (!store.recordStep) return
      const recordStep = store.recordStep.bind(store)
      const commands = fc
        .array(commandArb, { minLength: 1, maxLength: 30 })
        .map((list) => (store.serverClock ? list.filter((c) => c.op !== 'advance' && c.op !== 'purge') : list))
      await fc.assert(
        fc.asyncProperty(commands, async (list) => {
          const scope = `steps-model-${randomUUID()}`
          const records = new Map<string, ModelRecord>()
          const tokens = new Map<string, number>()
          const now = () => clock.now()
          const held = (k: string, token: number) => {
            const record = records.get(k)
            return record && record.token === token && record.status === 'in_progress' && record.expiresAtMs > now() ? record : undefined
          }
          for (const [index, command] of list.entries()) {
            const at = `step ${index} ${JSON.stringify(command)}`
            if (command.op === 'advance') {
              clock.advance(command.ms)
              continue
            }
            if (command.op === 'purge') {
              while ((await store.purgeExpired(500)) === 500) {}
              for (const [k, record] of records) if (record.expiresAtMs <= now()) records.delete(k)
              continue
            }
            const k = KEYS[command.key] as string
            if (command.op === 'evict') {
              assert.equal(await store.evict(scope, k), records.delete(k), at)
              continue
            }
            const mine = `${command.holder}/${k}`
            const token = tokens.get(mine) ?? 1
            switch (command.op) {
              case 'acquire': {
                const actual = await store.acquire(scope, k, fp('a'), LEASE_MS)
                const record = records.get(k)
                const lease = { lockedUntilMs: now() + LEASE_MS, expiresAtMs: now() + LEASE_MS + RETENTION_MS }
                if (!record || record.expiresAtMs <= now()) {
                  const fresh = { token: (record?.token ?? 0) + 1, status: 'in_progress' as const, ...lease, steps: new Map() }
                  records.set(k, fresh)
                  assert.equal(actual.kind, 'acquired', at)
                  assert.equal(actual.kind === 'acquired' && (actual.steps ?? []).length, 0, `${at}: a fresh record has no steps`)
                } else if (record.status === 'in_progress' && record.lockedUntilMs <= now()) {
                  Object.assign(record, { token: record.token + 1, ...lease })
                  assert.equal(actual.kind, 'acquired', at)
                  const steps = actual.kind === 'acquired' ? (actual.steps ?? []) : []
                  assert.deepEqual(new Map(steps.map((s) => [s.name, s.result])), record.steps, `${at}: steps read back`)
                } else {
                  assert.notEqual(actual.kind, 'acquired', at)
                }
                if (actual.kind === 'acquired') tokens.set(mine, actual.token)
                break
              }
              case 'release': {
                const record = held(k, token)
                assert.equal(await store.release(scope, k, token), record !== undefined, at)
                if (record) Object.assign(record, { lockedUntilMs: now(), expiresAtMs: now() + RETENTION_MS })
                break
              }
              case 'complete': {
                const record = held(k, token)
                assert.equal(await store.complete(scope, k, token, sampleOutcome(), TTL_MS), record !== undefined, at)
                if (record) Object.assign(record, { status: 'completed', expiresAtMs: now() + TTL_MS })
                break
              }
              case 'step': {
                const name = NAMES[command.name] as string
                const result = RESULTS[command.result] as string | null
                const record = held(k, token)
                assert.equal(await recordStep(scope, k, token, name, result), record !== undefined, at)
                if (record) applyStep(record.steps, name, result)
                break
              }
            }
          }
        }),
        { numRuns, seed },
      )
    })
  })
}
