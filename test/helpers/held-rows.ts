/**
 * The cases of a record whose row an open transaction holds, for the SQL stores
 * (src/backends/postgres/postgres-row-locks.test.ts, src/backends/mysql/mysql-row-locks.test.ts).
 *
 * The holder completed the record inside its own transaction (`runInTransaction`, an ORM's
 * transaction, a pg-boss batch), its lease has ended meanwhile, and the transaction has not committed
 * yet. A duplicate's acquire reads the committed version (a lease that ended: acquirable) and would take
 * the row over, which waits for the row lock until that transaction ends. It answers `in_progress`
 * instead: the record is in flight, and the wait belongs to the ledger (bounded by `wait`, woken or
 * polled), not to a pool connection held until the store's timeout. Each case holds the transaction open
 * until the duplicate has answered, so an acquire that waited for the lock would never answer and fail
 * the case (by the store's query timeout, {@link HELD_ROWS_QUERY_TIMEOUT_MS}), whatever the machine's speed.
 */
import { randomUUID } from 'node:crypto'
import { fingerprintOf } from '../../src/core/fingerprint.js'
import { Ledger } from '../../src/core/ledger.js'
import type { AcquireResult, IdempotencyStore, Outcome } from '../../src/core/store.js'

/** The store's `queryTimeout` in these cases: an acquire that waited for the row lock fails after it. */
export const HELD_ROWS_QUERY_TIMEOUT_MS = 3_000

/** A SQL store with its own transactions (PostgresStore, MySqlStore). */
export interface TransactionalSqlStore<Tx> extends IdempotencyStore {
  transaction<R>(fn: (tx: Tx) => Promise<R>): Promise<R>
  completeInTransaction(tx: Tx, scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean>
}

const fp = fingerprintOf({ amount: 100 })
const outcome: Outcome = { status: 'completed', response: { status: 201, headers: {}, body: new Uint8Array([123, 125]) }, resourceId: null }

/** Defines the cases on `store()` (made and migrated by the caller, with group commit on). */
export function describeHeldRows<Tx>(store: () => TransactionalSqlStore<Tx>): void {
  /**
   * Acquires `key` with a short lease, completes it inside a transaction, waits past the lease, then
   * runs `duplicate` while that transaction is still open, and commits only after it answered.
   */
  async function whileHeld<T>(scope: string, key: string, duplicate: () => Promise<T>): Promise<T> {
    const held = await store().acquire(scope, key, fp, 50)
    if (held.kind !== 'acquired') throw new Error(`expected to acquire, got ${held.kind}`)
    let answer!: Promise<T>
    await store().transaction(async (tx) => {
      expect(await store().completeInTransaction(tx, scope, key, held.token, outcome, 60_000)).toBe(true)
      // The committed version's lease has ended: to a reader outside, the record is acquirable.
      await new Promise((resolve) => setTimeout(resolve, 120))
      answer = duplicate()
      await answer.catch(() => {})
    })
    return answer
  }

  it('a duplicate acquire answers in_progress instead of waiting for the lock, and replays the record once the transaction commits', async () => {
    const scope = `s-${randomUUID()}`
    const answer = await whileHeld(scope, 'order-1', () => store().acquire(scope, 'order-1', fp, 30_000))
    expect(answer.kind).toBe('in_progress')
    expect((answer as Extract<AcquireResult, { kind: 'in_progress' }>).lockedUntilMs).toBeGreaterThan(Date.now())
    expect((await store().acquire(scope, 'order-1', fp, 30_000)).kind).toBe('replay')
  })

  it('in a group commit batch, only the held key answers in_progress: the batch neighbours acquire', async () => {
    const scope = `s-${randomUUID()}`
    const answers = await whileHeld(scope, 'held', () =>
      // The first goes out alone; the others wait for it and go out together, the held key among them.
      Promise.all(['first', 'new-1', 'held', 'new-2', 'new-3'].map((key) => store().acquire(scope, key, fp, 30_000))),
    )
    expect(answers.map((a) => a.kind)).toEqual(['acquired', 'acquired', 'in_progress', 'acquired', 'acquired'])
    expect((await store().acquire(scope, 'held', fp, 30_000)).kind).toBe('replay')
  })

  it('heldInTransaction names the rows an open transaction holds, answering while it holds them (it waits for no lock)', async () => {
    const scope = `s-${randomUUID()}`
    const s = store()
    if (!s.heldInTransaction) throw new Error(`${s.name} has no heldInTransaction`)
    const heldOf = s.heldInTransaction.bind(s)
    const ids = ['held', 'free', 'absent'].map((key) => ({ scope, key }))
    for (const key of ['held', 'free']) expect((await s.acquire(scope, key, fp, 50)).kind).toBe('acquired')
    let during: boolean[] = []
    await s.transaction(async (tx) => {
      const token = ((await s.get(scope, 'held')) as { token: number }).token
      expect(await s.completeInTransaction(tx, scope, 'held', token, outcome, 60_000)).toBe(true)
      // A probe that waited for the lock would wait for this transaction, which waits for the probe.
      during = await heldOf(ids)
    })
    expect(during).toEqual([true, false, false])
    expect(await heldOf(ids)).toEqual([false, false, false])
    expect(await heldOf([])).toEqual([])
  })

  it("a duplicate run waits as for any holder in flight, and replays the holder's outcome once it commits", async () => {
    const scope = `s-${randomUUID()}`
    const ledger = new Ledger({ store: store(), storeTimeout: HELD_ROWS_QUERY_TIMEOUT_MS, wait: '300ms' })
    const waited = await whileHeld(scope, 'order-2', () => ledger.run({ scope, key: 'order-2', fingerprint: fp }, () => 'ran twice'))
    // The transaction was open for the whole wait: the run ends in_progress, not STORE_UNAVAILABLE.
    expect(waited.kind).toBe('in_progress')
    const retried = await new Ledger({ store: store() }).run({ scope, key: 'order-2', fingerprint: fp }, () => 'ran twice')
    expect(retried.kind).toBe('replayed')
  })
}
