/**
 * MySqlStore (MariaDB here), as src/stores/postgres/postgres-row-locks.test.ts for PostgreSQL.
 * A record whose row an open transaction holds: the holder completed it inside its own transaction
 * (`runInTransaction`, an ORM's transaction), its lease has ended meanwhile,
 * and the transaction has not committed yet. A duplicate's acquire reads the committed version (a lease
 * that ended: acquirable) and would take the row over, which waits for the row lock until that
 * transaction ends (InnoDB: up to `innodb_lock_wait_timeout`, 50 s by default). It answers `in_progress`
 * instead, having found the row held by a locking read that does not wait (`FOR UPDATE NOWAIT`): the record is in flight, and the wait belongs to the ledger (bounded by `wait`,
 * woken or polled), not to a pool connection held until the store's timeout. Each case holds the
 * transaction open until the duplicate has answered, so an acquire that waited for the lock would never
 * answer and fail the test (by the store's query timeout), whatever the machine's speed.
 */
import { randomUUID } from 'node:crypto'
import mysql from 'mysql2/promise'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { fingerprintOf } from '../../core/fingerprint.js'
import { Ledger } from '../../core/ledger.js'
import type { AcquireResult } from '../../core/store.js'
import { MySqlStore } from './mysql-store.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
if (skip) console.warn(`\n!!! SKIPPED: MySqlStore row locks: ${skip}\n`)
const suffix = `${process.pid}_${Date.now().toString(36)}`
const fp = fingerprintOf({ amount: 100 })
const outcome = { status: 'completed' as const, response: { status: 201, headers: {}, body: new Uint8Array([123, 125]) }, resourceId: null }

/** An acquire that waited for the row lock would fail after this (`queryTimeout`): the lock is held until it answers. */
const STORE_TIMEOUT_MS = 3_000

describe.skipIf(skip !== undefined)('MySqlStore: a record whose row an open transaction holds', () => {
  const pool = mysql.createPool({ uri: URI, connectionLimit: 8 })
  const table = `idemkey_rowlock_${suffix}`
  const store = new MySqlStore({ pool, table, queryTimeout: STORE_TIMEOUT_MS })

  beforeAll(async () => {
    await store.migrate()
  })
  afterAll(async () => {
    await store.close()
    await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\``)
    await pool.end()
  })

  /**
   * Acquires `key` with a short lease, completes it inside a transaction, waits past the lease, then
   * runs `duplicate` while that transaction is still open, and commits only after it answered.
   */
  async function whileHeld<T>(scope: string, key: string, duplicate: () => Promise<T>): Promise<T> {
    const held = await store.acquire(scope, key, fp, 50)
    if (held.kind !== 'acquired') throw new Error(`expected to acquire, got ${held.kind}`)
    let answer!: Promise<T>
    await store.transaction(async (tx) => {
      expect(await store.completeInTransaction(tx, scope, key, held.token, outcome, 60_000)).toBe(true)
      // The committed version's lease has ended: to a reader outside, the record is acquirable.
      await new Promise((resolve) => setTimeout(resolve, 120))
      answer = duplicate()
      await answer.catch(() => {})
    })
    return answer
  }

  it('a duplicate acquire answers in_progress instead of waiting for the lock, and replays the record once the transaction commits', async () => {
    const scope = `s-${randomUUID()}`
    const answer = await whileHeld(scope, 'order-1', () => store.acquire(scope, 'order-1', fp, 30_000))
    expect(answer.kind).toBe('in_progress')
    expect((answer as Extract<AcquireResult, { kind: 'in_progress' }>).lockedUntilMs).toBeGreaterThan(Date.now())
    const after = await store.acquire(scope, 'order-1', fp, 30_000)
    expect(after.kind).toBe('replay')
  })

  it('in a group commit batch, only the held key answers in_progress: the batch neighbours acquire', async () => {
    const scope = `s-${randomUUID()}`
    const answers = await whileHeld(scope, 'held', () =>
      // The first goes out alone; the others wait for it and go out together, the held key among them.
      Promise.all(['first', 'new-1', 'held', 'new-2', 'new-3'].map((key) => store.acquire(scope, key, fp, 30_000))),
    )
    expect(answers.map((a) => a.kind)).toEqual(['acquired', 'acquired', 'in_progress', 'acquired', 'acquired'])
    expect((await store.acquire(scope, 'held', fp, 30_000)).kind).toBe('replay')
  })

  it("a duplicate run waits as for any holder in flight, and replays the holder's outcome once it commits", async () => {
    const scope = `s-${randomUUID()}`
    const ledger = new Ledger({ store, storeTimeout: STORE_TIMEOUT_MS, wait: '300ms' })
    const waited = await whileHeld(scope, 'order-2', () => ledger.run({ scope, key: 'order-2', fingerprint: fp }, () => 'ran twice'))
    // The transaction was open for the whole wait: the run ends in_progress, not STORE_UNAVAILABLE.
    expect(waited.kind).toBe('in_progress')
    const retried = await new Ledger({ store }).run({ scope, key: 'order-2', fingerprint: fp }, () => 'ran twice')
    expect(retried.kind).toBe('replayed')
  })
})
