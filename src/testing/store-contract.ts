import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { ManualClock } from '../core/clock.js'
import { type IdempotencyStore, isTransactionalStore, type StoredRecord, type TransactionalStore } from '../core/store.js'
import { isIdempotencyError } from '../errors.js'
import { describeSkipped, resolveHarness, type SuiteOptions } from './harness.js'
import { ALL_BYTES, fp, type StoreFactory, sampleOutcome, skipRunning } from './store-fixtures.js'
import { describeStoreSteps } from './store-steps-contract.js'

/** Options of {@link describeStore}. */
export interface StoreContractOptions extends SuiteOptions {
  /**
   * The lease the lease tests use, in real milliseconds, for stores whose clock is the server's
   * (they sleep past it). Injected-clock stores use 30 s and move the clock instead. @default 300
   */
  serverLeaseMs?: number
  /** Runs after the store is closed (drop tables, stop servers). */
  teardown?: () => unknown
}

function expectCode(code: string): (error: unknown) => boolean {
  return (error) => {
    assert.ok(isIdempotencyError(error), `expected an IdempotencyError ${code}, got ${String(error)}`)
    assert.equal(error.code, code)
    return true
  }
}

/** Compares two records ignoring nothing: the stored state must be exactly the same. */
function sameRecord(after: StoredRecord | null, before: StoredRecord | null, message: string): void {
  assert.deepEqual(after, before, message)
}

/**
 * The store contract (docs/ledger.md, "Writing your own store") as a test suite. Every idemkey store runs it against its real server;
 * run it against your own store too.
 *
 * @example
 * import { describeStore } from 'idemkey/testing'
 * describeStore('my-store', () => new MyStore(...))
 */
export function describeStore(name: string, createStore: StoreFactory, options: StoreContractOptions = {}): void {
  const { describe, it, beforeAll, afterAll } = resolveHarness(options.harness)
  const suiteName = `store contract: ${name}`
  if (options.skip) {
    describeSkipped({ describe, it, beforeAll, afterAll }, suiteName, options.skip)
    return
  }

  describe(suiteName, () => {
    const clock = new ManualClock()
    let store: IdempotencyStore
    let leaseMs = 30_000
    const run = randomUUID().slice(0, 8)
    let counter = 0
    /** A fresh scope per test, so tests never see each other's records. */
    const scope = () => `contract-${run}-${++counter}`
    /** Moves time past `ms`: the injected clock, or a real sleep for server-clock stores. */
    const advance = async (ms: number) => {
      if (store.serverClock) await new Promise((resolve) => setTimeout(resolve, ms))
      else clock.advance(ms)
    }

    beforeAll(async () => {
      store = await createStore({ clock })
      if (store.serverClock) leaseMs = options.serverLeaseMs ?? 300
    })
    afterAll(async () => {
      await store?.close()
      await options.teardown?.()
    })

    it('grants token 1 to the first acquire of a new key', async () => {
      const result = await store.acquire(scope(), 'k', fp('a'), leaseMs)
      assert.deepEqual(result, { kind: 'acquired', token: 1 })
    })

    it('lets exactly one of 100 parallel acquires of one key win', async () => {
      const s = scope()
      const results = await Promise.all(Array.from({ length: 100 }, () => store.acquire(s, 'race', fp('a'), 60_000)))
      const winners = results.filter((r) => r.kind === 'acquired')
      assert.equal(winners.length, 1, `expected one winner, got ${winners.length}`)
      assert.equal(results.filter((r) => r.kind === 'in_progress').length, 99)
      assert.deepEqual(winners[0], { kind: 'acquired', token: 1 })
    })

    it('answers in_progress with the lease end while a live holder runs', async () => {
      const s = scope()
      const before = store.serverClock ? Date.now() : clock.now()
      await store.acquire(s, 'k', fp('a'), 60_000)
      const result = await store.acquire(s, 'k', fp('a'), 60_000)
      assert.equal(result.kind, 'in_progress')
      if (result.kind !== 'in_progress') return
      if (store.serverClock) assert.ok(Math.abs(result.lockedUntilMs - (before + 60_000)) < 5_000, 'lease end near now + lease')
      else assert.equal(result.lockedUntilMs, before + 60_000)
    })

    it('replays a completed record with byte-identical status, headers and body', async () => {
      const s = scope()
      const { token } = (await store.acquire(s, 'k', fp('a'), leaseMs)) as { token: number }
      const outcome = sampleOutcome('completed')
      assert.equal(await store.complete(s, 'k', token, outcome, 60_000), true)
      const replay = await store.acquire(s, 'k', fp('a'), leaseMs)
      assert.equal(replay.kind, 'replay')
      if (replay.kind !== 'replay') return
      assert.equal(replay.record.status, 'completed')
      assert.equal(replay.record.response?.status, 201)
      assert.deepEqual(replay.record.response?.headers, outcome.response.headers)
      assert.deepEqual(Buffer.from(replay.record.response?.body as Uint8Array), Buffer.from(ALL_BYTES))
      assert.equal(replay.record.resourceId, 'order_42')
      assert.equal(replay.record.token, token)
      assert.equal(replay.record.lockedUntilMs, null)
    })

    it('replays a failed (final) record like a completed one', async () => {
      const s = scope()
      const { token } = (await store.acquire(s, 'k', fp('a'), leaseMs)) as { token: number }
      assert.equal(await store.complete(s, 'k', token, sampleOutcome('failed'), 60_000), true)
      const replay = await store.acquire(s, 'k', fp('a'), leaseMs)
      assert.equal(replay.kind, 'replay')
      if (replay.kind === 'replay') {
        assert.equal(replay.record.status, 'failed')
        assert.equal(replay.record.response?.status, 400)
      }
    })

    it('rolls a transaction back to its savepoint and goes on: what came after it is undone, the transaction still commits (transactional stores)', async () => {
      if (!isTransactionalStore(store) || !store.savepointInTransaction) return
      const tx = store as TransactionalStore<unknown> & Required<Pick<TransactionalStore<unknown>, 'savepointInTransaction'>>
      const s = scope()
      const { token } = (await store.acquire(s, 'k', fp('a'), leaseMs)) as { token: number }
      await tx.transaction(async (t) => {
        await tx.savepointInTransaction(t, 'set')
        assert.equal(await tx.completeInTransaction(t, s, 'k', token, sampleOutcome('completed'), 60_000), true)
        await tx.savepointInTransaction(t, 'rollback')
        // The completion above is undone, so the record is in progress again for this one.
        assert.equal(await tx.completeInTransaction(t, s, 'k', token, sampleOutcome('failed'), 60_000), true)
      })
      const record = await store.get(s, 'k')
      assert.equal(record?.status, 'failed')
      assert.equal(record?.response?.status, 400)
    })

    it('round-trips empty, binary and NUL-filled bodies exactly', async () => {
      const s = scope()
      const bodies = [new Uint8Array(0), new Uint8Array([0, 0, 0]), Uint8Array.from({ length: 70_000 }, (_, i) => (i * 31) % 256)]
      for (const [i, body] of bodies.entries()) {
        const { token } = (await store.acquire(s, `body-${i}`, fp('a'), leaseMs)) as { token: number }
        await store.complete(s, `body-${i}`, token, sampleOutcome('completed', body), 60_000)
        const record = await store.get(s, `body-${i}`)
        assert.ok(record?.response, 'stored')
        assert.ok(record.response.body instanceof Uint8Array, 'body is a Uint8Array')
        assert.equal(record.response.body.byteLength, body.byteLength)
        assert.deepEqual(Buffer.from(record.response.body), Buffer.from(body))
      }
    })

    it('answers mismatch for another fingerprint whatever the status, and changes nothing', async () => {
      const s = scope()
      const { token: t1 } = (await store.acquire(s, 'running', fp('a'), 60_000)) as { token: number }
      const { token: t2 } = (await store.acquire(s, 'done', fp('a'), leaseMs)) as { token: number }
      await store.complete(s, 'done', t2, sampleOutcome('completed'), 60_000)
      const { token: t3 } = (await store.acquire(s, 'failed', fp('a'), leaseMs)) as { token: number }
      await store.complete(s, 'failed', t3, sampleOutcome('failed'), 60_000)
      for (const key of ['running', 'done', 'failed']) {
        const before = await store.get(s, key)
        assert.deepEqual(await store.acquire(s, key, fp('b'), leaseMs), { kind: 'mismatch' }, key)
        sameRecord(await store.get(s, key), before, `${key} unchanged by a mismatch`)
      }
      assert.equal(t1, 1)
    })

    it('renew extends the lease past its old end', async () => {
      const s = scope()
      const { token } = (await store.acquire(s, 'k', fp('a'), leaseMs)) as { token: number }
      await advance(leaseMs * 0.6)
      assert.equal(await store.renew(s, 'k', token, leaseMs), true)
      await advance(leaseMs * 0.6)
      // Past the first lease's end, but inside the renewed one.
      assert.equal((await store.acquire(s, 'k', fp('a'), leaseMs)).kind, 'in_progress')
    })

    it('takes over after the lease ends, with token + 1 and one more attempt', async () => {
      const s = scope()
      await store.acquire(s, 'k', fp('a'), leaseMs)
      await advance(leaseMs + 100)
      assert.deepEqual(await store.acquire(s, 'k', fp('a'), leaseMs), { kind: 'acquired', token: 2 })
      const record = await store.get(s, 'k')
      assert.equal(record?.attempts, 2)
      assert.equal(record?.status, 'in_progress')
    })

    it('refuses complete, release and renew with a stale token and changes nothing', async () => {
      const s = scope()
      await store.acquire(s, 'k', fp('a'), leaseMs)
      await advance(leaseMs + 100)
      const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
      assert.equal(token, 2)
      const before = await store.get(s, 'k')
      assert.equal(await store.complete(s, 'k', 1, sampleOutcome(), 60_000), false)
      assert.equal(await store.release(s, 'k', 1), false)
      assert.equal(await store.renew(s, 'k', 1, 60_000), false)
      assert.equal(await store.complete(s, 'k', 3, sampleOutcome(), 60_000), false, 'a future token is not current either')
      sameRecord(await store.get(s, 'k'), before, 'a fenced-out holder changes nothing')
      assert.equal(await store.complete(s, 'k', 2, sampleOutcome(), 60_000), true)
    })

    it('refuses complete, release and renew once the record is completed', async () => {
      const s = scope()
      const { token } = (await store.acquire(s, 'k', fp('a'), leaseMs)) as { token: number }
      await store.complete(s, 'k', token, sampleOutcome('completed'), 60_000)
      const before = await store.get(s, 'k')
      assert.equal(await store.complete(s, 'k', token, sampleOutcome('failed'), 60_000), false)
      assert.equal(await store.release(s, 'k', token), false)
      assert.equal(await store.renew(s, 'k', token, leaseMs), false)
      sameRecord(await store.get(s, 'k'), before, 'a completed record is final')
    })

    it('makes a released key acquirable again at once, with the next token', async () => {
      const s = scope()
      const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
      assert.equal(await store.release(s, 'k', token), true)
      assert.deepEqual(await store.acquire(s, 'k', fp('a'), 60_000), { kind: 'acquired', token: token + 1 })
    })

    it('lets a released key be acquired with another fingerprint (a released record is not live)', async () => {
      const s = scope()
      const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
      await store.release(s, 'k', token)
      assert.deepEqual(await store.acquire(s, 'k', fp('b'), 60_000), { kind: 'acquired', token: token + 1 })
      assert.equal((await store.get(s, 'k'))?.fingerprint, fp('b'))
    })

    it('treats a record past its TTL as absent: get is null and acquire grants it', async () => {
      const s = scope()
      const ttl = store.serverClock ? 200 : 60_000
      const { token } = (await store.acquire(s, 'k', fp('a'), leaseMs)) as { token: number }
      await store.complete(s, 'k', token, sampleOutcome(), ttl)
      assert.ok(await store.get(s, 'k'))
      await advance(ttl + 100)
      assert.equal(await store.get(s, 'k'), null)
      const again = await store.acquire(s, 'k', fp('b'), leaseMs)
      assert.equal(again.kind, 'acquired', 'an expired record neither replays nor mismatches')
      assert.equal((await store.get(s, 'k'))?.attempts, 1, 'a new lifecycle starts')
    })

    it('purges expired records in bounded batches and keeps live ones', async () => {
      const s = scope()
      const ttl = store.serverClock ? 100 : 1_000
      for (let i = 0; i < 25; i++) {
        const { token } = (await store.acquire(s, `old-${i}`, fp('a'), leaseMs)) as { token: number }
        await store.complete(s, `old-${i}`, token, sampleOutcome(), ttl)
      }
      await advance(ttl + 100)
      const { token } = (await store.acquire(s, 'live', fp('a'), leaseMs)) as { token: number }
      await store.complete(s, 'live', token, sampleOutcome(), 3_600_000)
      const batches: number[] = []
      for (let purged = 10; purged === 10; ) {
        purged = await store.purgeExpired(10)
        assert.ok(purged <= 10, `a batch purged ${purged} records, more than its limit of 10`)
        batches.push(purged)
        assert.ok(batches.length < 1_000, 'purge terminates')
      }
      assert.ok(batches.length >= 3, `25 records in batches of 10 take at least 3 calls, took ${batches.length}`)
      assert.deepEqual(await store.list({ scope: s, includeExpired: true }), await store.list({ scope: s }))
      const left = await store.list({ scope: s, includeExpired: true })
      assert.deepEqual(
        left.map((r) => r.key),
        ['live'],
      )
    })

    it('keeps scopes isolated: one key in two scopes is two records', async () => {
      const a = scope()
      const b = scope()
      const { token } = (await store.acquire(a, 'shared', fp('a'), leaseMs)) as { token: number }
      await store.complete(a, 'shared', token, sampleOutcome(), 60_000)
      assert.deepEqual(await store.acquire(b, 'shared', fp('b'), leaseMs), { kind: 'acquired', token: 1 })
      assert.equal((await store.acquire(a, 'shared', fp('a'), leaseMs)).kind, 'replay')
      assert.equal(await store.complete(b, 'shared', 1, sampleOutcome('failed'), 60_000), true)
      assert.equal((await store.get(a, 'shared'))?.status, 'completed')
      assert.equal((await store.get(b, 'shared'))?.status, 'failed')
    })

    it('accepts keys of 1 and 255 characters and any printable ASCII', async () => {
      const s = scope()
      for (const key of ['k', 'x'.repeat(255), ` !"#$%&'()*+,-./:;<=>?@[\\]^_\`{|}~`, "'; DROP TABLE x; --"]) {
        const result = await store.acquire(s, key, fp('a'), leaseMs)
        assert.deepEqual(result, { kind: 'acquired', token: 1 }, JSON.stringify(key))
        assert.equal((await store.get(s, key))?.key, key)
      }
    })

    it('accepts scopes in any language', async () => {
      const s = `${scope()}-Zürich-東京-🙂`
      assert.deepEqual(await store.acquire(s, 'k', fp('a'), leaseMs), { kind: 'acquired', token: 1 })
      assert.equal((await store.get(s, 'k'))?.scope, s)
    })

    it('rejects invalid keys with KEY_INVALID', async () => {
      const s = scope()
      for (const key of ['', 'x'.repeat(256), 'tab\there', 'new\nline', 'é', '\u0000', 42, null, undefined]) {
        await assert.rejects(() => store.acquire(s, key as string, fp('a'), leaseMs), expectCode('KEY_INVALID'), JSON.stringify(key))
      }
    })

    it('rejects invalid scopes with SCOPE_INVALID and invalid fingerprints with FINGERPRINT_INVALID', async () => {
      for (const bad of ['', 'x'.repeat(256), 'a\nb', 7]) {
        await assert.rejects(() => store.acquire(bad as string, 'k', fp('a'), leaseMs), expectCode('SCOPE_INVALID'))
      }
      for (const bad of ['', 'abc', fp('a').toUpperCase(), `${fp('a')}0`, null]) {
        await assert.rejects(() => store.acquire(scope(), 'k', bad as string, leaseMs), expectCode('FINGERPRINT_INVALID'))
      }
    })

    it('lists records by scope and status, oldest first', async () => {
      const s = scope()
      const { token } = (await store.acquire(s, 'first', fp('a'), leaseMs)) as { token: number }
      await store.complete(s, 'first', token, sampleOutcome(), 60_000)
      await advance(10)
      await store.acquire(s, 'second', fp('a'), 60_000)
      assert.deepEqual(
        (await store.list({ scope: s })).map((r) => r.key),
        ['first', 'second'],
      )
      assert.deepEqual(
        (await store.list({ scope: s, status: 'in_progress' })).map((r) => r.key),
        ['second'],
      )
      assert.equal((await store.list({ scope: s, limit: 1 })).length, 1)
    })

    it('evicts a record whatever its state, and the key starts afresh', async () => {
      const s = scope()
      await store.acquire(s, 'k', fp('a'), 60_000)
      assert.equal(await store.evict(s, 'k'), true)
      assert.equal(await store.get(s, 'k'), null)
      assert.equal(await store.evict(s, 'k'), false)
      assert.deepEqual(await store.acquire(s, 'k', fp('b'), leaseMs), { kind: 'acquired', token: 1 })
    })

    it('notifies watchers when a record is completed or released (stores that implement watch)', async function (this: unknown, ...args: unknown[]) {
      // Known only once the store is open: a store without watch is marked skipped, never a green test that checked nothing.
      if (!store.watch) return skipRunning(`${name} has no watch(): waiters poll it`, this, args[0])
      const s = scope()
      let calls = 0
      const changed = () =>
        new Promise<void>((resolve, reject) => {
          const start = calls
          const timer = setTimeout(() => reject(new Error('no notification within 5 s')), 5_000)
          const check = setInterval(() => {
            if (calls > start) {
              clearTimeout(timer)
              clearInterval(check)
              resolve()
            }
          }, 2)
        })
      const stop = store.watch(s, 'k', () => calls++)
      try {
        const { token } = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
        let waiting = changed()
        await store.release(s, 'k', token)
        await waiting
        const next = (await store.acquire(s, 'k', fp('a'), 60_000)) as { token: number }
        waiting = changed()
        await store.complete(s, 'k', next.token, sampleOutcome(), 60_000)
        await waiting
      } finally {
        stop()
      }
    })

    describeStoreSteps(createStore, { describe, it, beforeAll, afterAll })
  })
}

export { fp, type StoreFactory, sampleOutcome, skipRunning } from './store-fixtures.js'
