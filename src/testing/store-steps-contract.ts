import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { ManualClock } from '../core/clock.js'
import { Ledger } from '../core/ledger.js'
import { MAX_STEP_RESULT_BYTES } from '../core/steps.js'
import { type AcquireResult, type IdempotencyStore, isTransactionalStore, type StepEntry } from '../core/store.js'
import { isIdempotencyError } from '../errors.js'
import type { TestHarness } from './harness.js'
import { fp, type StoreFactory, sampleOutcome } from './store-fixtures.js'

/** The steps a takeover's acquire returned, by name (order is the store's). */
function stepsOf(result: AcquireResult): Record<string, string | null> {
  assert.equal(result.kind, 'acquired', `expected a takeover, got ${result.kind}`)
  const steps: StepEntry[] = result.kind === 'acquired' ? (result.steps ?? []) : []
  const byName: Record<string, string | null> = {}
  for (const step of steps) byName[step.name] = step.result
  return byName
}

/**
 * The steps half of the store contract (docs/steps.md, "Writing a store"): `recordStep` fenced by token,
 * steps read back by the acquire of a takeover, dropped with their record. A store without `recordStep`
 * must make `ctx.step` fail with `INVALID_OPTION`. Run from `describeStore`, inside its suite.
 */
export function describeStoreSteps(createStore: StoreFactory, harness: TestHarness): void {
  const { describe, it, beforeAll, afterAll } = harness
  describe('steps', () => {
    const clock = new ManualClock()
    let store: IdempotencyStore
    const run = randomUUID().slice(0, 8)
    let counter = 0
    const scope = () => `steps-${run}-${++counter}`
    const lease = 60_000

    beforeAll(async () => {
      store = await createStore({ clock })
    })
    afterAll(async () => {
      await store?.close()
    })

    /** Acquires (s, k) and releases it, then acquires again: the takeover's acquire result. */
    const takeover = async (s: string, k: string, token: number): Promise<AcquireResult> => {
      assert.equal(await store.release(s, k, token), true)
      return store.acquire(s, k, fp('a'), lease)
    }
    const acquire = async (s: string, k = 'k'): Promise<number> => {
      const result = await store.acquire(s, k, fp('a'), lease)
      assert.equal(result.kind, 'acquired')
      return (result as { token: number }).token
    }

    it('runs ctx.step through the ledger, or fails it with INVALID_OPTION when the store records no steps', async () => {
      const ledger = new Ledger({ store, clock })
      const work = ledger.run({ scope: scope(), key: 'k', payload: 1 }, (ctx) => ctx.step('charge', () => ({ id: 'ch_1' })))
      if (!store.recordStep) {
        await assert.rejects(
          work,
          (error) => isIdempotencyError(error) && error.code === 'INVALID_OPTION' && /records steps/.test(error.message),
        )
        return
      }
      const result = await work
      assert.equal(result.kind, 'executed')
      assert.deepEqual(result.kind === 'executed' && result.value, { id: 'ch_1' })
    })

    it('gives a fresh record no steps', async () => {
      if (!store.recordStep) return
      const result = await store.acquire(scope(), 'k', fp('a'), lease)
      assert.deepEqual(result, { kind: 'acquired', token: 1 })
    })

    it('returns recorded steps and started markers with the acquire of a takeover', async () => {
      if (!store.recordStep) return
      const s = scope()
      const token = await acquire(s)
      assert.equal(await store.recordStep(s, 'k', token, 'reserve', '{"sku":"A","qty":2}'), true)
      assert.equal(await store.recordStep(s, 'k', token, 'charge', null), true)
      assert.equal(await store.recordStep(s, 'k', token, '$now:1', '1700000000000'), true)
      const next = await takeover(s, 'k', token)
      assert.deepEqual(stepsOf(next), { reserve: '{"sku":"A","qty":2}', charge: null, '$now:1': '1700000000000' })
      assert.equal((next as { token: number }).token, token + 1)
    })

    it('lets a result replace a started marker, never a marker a result', async () => {
      if (!store.recordStep) return
      const s = scope()
      const token = await acquire(s)
      assert.equal(await store.recordStep(s, 'k', token, 'charge', null), true)
      assert.equal(await store.recordStep(s, 'k', token, 'charge', '"ch_1"'), true)
      assert.equal(await store.recordStep(s, 'k', token, 'charge', null), true)
      assert.deepEqual(stepsOf(await takeover(s, 'k', token)), { charge: '"ch_1"' })
    })

    it('refuses a step from a holder whose token is no longer current, and keeps the new holder steps', async () => {
      if (!store.recordStep) return
      const s = scope()
      const first = await acquire(s)
      assert.equal(await store.recordStep(s, 'k', first, 'reserve', '1'), true)
      const second = await takeover(s, 'k', first)
      const token = (second as { token: number }).token
      assert.equal(await store.recordStep(s, 'k', first, 'reserve', '2'), false, 'zombie step refused')
      assert.equal(await store.recordStep(s, 'k', first, 'charge', '2'), false, 'zombie step refused')
      assert.equal(await store.recordStep(s, 'k', token, 'charge', '3'), true)
      assert.deepEqual(stepsOf(await takeover(s, 'k', token)), { reserve: '1', charge: '3' })
    })

    it('refuses another fingerprint as mismatch while a released attempt left steps, and changes nothing; the same request takes it over', async () => {
      if (!store.recordStep) return
      const s = scope()
      const token = await acquire(s)
      assert.equal(await store.recordStep(s, 'k', token, 'charge', '"ch_1"'), true)
      assert.equal(await store.release(s, 'k', token), true)
      const before = await store.get(s, 'k')
      // Found by the simulator (docs/testing.md): the steps are another request's partial effects.
      assert.deepEqual(await store.acquire(s, 'k', fp('b'), lease), { kind: 'mismatch' })
      assert.deepEqual(await store.get(s, 'k'), before, 'unchanged by the refused takeover')
      const again = await store.acquire(s, 'k', fp('a'), lease)
      assert.equal((again as { token: number }).token, token + 1)
      assert.deepEqual(stepsOf(again), { charge: '"ch_1"' })
    })

    it('refuses another fingerprint while a started marker is the only step left', async () => {
      if (!store.recordStep) return
      const s = scope()
      const token = await acquire(s)
      assert.equal(await store.recordStep(s, 'k', token, 'charge', null), true)
      assert.equal(await store.release(s, 'k', token), true)
      assert.deepEqual(await store.acquire(s, 'k', fp('b'), lease), { kind: 'mismatch' })
    })

    it('refuses steps on a completed record and on an absent one', async () => {
      if (!store.recordStep) return
      const s = scope()
      const token = await acquire(s)
      assert.equal(await store.complete(s, 'k', token, sampleOutcome(), 60_000), true)
      assert.equal(await store.recordStep(s, 'k', token, 'late', '1'), false)
      assert.equal(await store.recordStep(s, 'absent', 1, 'late', '1'), false)
      assert.equal(await store.get(s, 'absent'), null)
    })

    it('drops the steps with the record: an evicted key starts with none', async () => {
      if (!store.recordStep) return
      const s = scope()
      const token = await acquire(s)
      assert.equal(await store.recordStep(s, 'k', token, 'reserve', '1'), true)
      assert.equal(await store.evict(s, 'k'), true)
      assert.deepEqual(await store.acquire(s, 'k', fp('a'), lease), { kind: 'acquired', token: 1 })
    })

    it('drops the steps of an expired record when the key is acquired afresh', async () => {
      if (!store.recordStep || store.serverClock) return
      const s = scope()
      const token = await acquire(s)
      assert.equal(await store.recordStep(s, 'k', token, 'reserve', '1'), true)
      assert.equal(await store.complete(s, 'k', token, sampleOutcome(), 1_000), true)
      clock.advance(1_001)
      const fresh = await store.acquire(s, 'k', fp('a'), lease)
      assert.equal(fresh.kind, 'acquired')
      assert.equal((fresh as { steps?: StepEntry[] }).steps?.length ?? 0, 0)
    })

    it('keeps steps per (scope, key), through renewals', async () => {
      if (!store.recordStep) return
      const s = scope()
      const other = scope()
      const a = await acquire(s, 'a')
      const b = await acquire(s, 'b')
      const c = await acquire(other, 'a')
      assert.equal(await store.recordStep(s, 'a', a, 'x', '"a"'), true)
      assert.equal(await store.recordStep(s, 'b', b, 'x', '"b"'), true)
      assert.equal(await store.renew(s, 'a', a, lease), true)
      assert.deepEqual(stepsOf(await takeover(s, 'a', a)), { x: '"a"' })
      assert.deepEqual(stepsOf(await takeover(s, 'b', b)), { x: '"b"' })
      assert.deepEqual(stepsOf(await takeover(other, 'a', c)), {})
    })

    it('stores results byte for byte: quotes, backslashes, non-ASCII, and the 64 KiB maximum', async () => {
      if (!store.recordStep) return
      const s = scope()
      const token = await acquire(s)
      const tricky = JSON.stringify({ q: 'say "hi"\\n', u: 'é漢🙂', nul: '\u0000', n: -0.5e-7 })
      const bigNumber = '{"n":12345678901234567890}'
      const large = JSON.stringify('x'.repeat(MAX_STEP_RESULT_BYTES - 2))
      assert.equal(await store.recordStep(s, 'k', token, 'tricky', tricky), true)
      assert.equal(await store.recordStep(s, 'k', token, 'large', large), true)
      assert.equal(await store.recordStep(s, 'k', token, 'bigNumber', bigNumber), true)
      assert.equal(await store.recordStep(s, 'k', token, "we'ird.name:1-2_3", '[]'), true)
      const steps = stepsOf(await takeover(s, 'k', token))
      assert.equal(steps.tricky, tricky)
      assert.equal(steps.large?.length, large.length)
      assert.equal(steps.large, large)
      assert.equal(steps.bigNumber, bigNumber)
      assert.equal(steps["we'ird.name:1-2_3"], '[]')
    })

    it('commits a step recorded in a transaction with it, and rolls it back with it', async () => {
      if (!store.recordStep || !isTransactionalStore(store)) return
      const tx = store as typeof store & { recordStepInTransaction?: (...args: unknown[]) => Promise<boolean> }
      if (!tx.recordStepInTransaction) return
      const s = scope()
      const token = await acquire(s)
      await store.transaction((t) => tx.recordStepInTransaction?.(t, s, 'k', token, 'kept', '1') as Promise<boolean>)
      await assert.rejects(
        store.transaction(async (t) => {
          assert.equal(await tx.recordStepInTransaction?.(t, s, 'k', token, 'undone', '2'), true)
          throw new Error('roll back')
        }),
        /roll back/,
      )
      assert.equal(
        await store.transaction((t) => tx.recordStepInTransaction?.(t, s, 'k', token + 1, 'fenced', '3') as Promise<boolean>),
        false,
      )
      assert.deepEqual(stepsOf(await takeover(s, 'k', token)), { kept: '1' })
    })
  })
}
