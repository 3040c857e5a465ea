import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { answeredWith } from '../../../test/helpers/final-answers.js'
import { paused } from '../../../test/helpers/paused-store.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { Ledger } from '../../core/ledger.js'
import { isTransientTransactionError } from './postgres-errors.js'
import { PostgresStore } from './postgres-store.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
const suffix = randomUUID().slice(0, 8)
const table = `idemkey_tx_${suffix}`
const orders = `idemkey_tx_orders_${suffix}`
const accounts = `idemkey_tx_accounts_${suffix}`

describe.skipIf(skip !== undefined)('PostgresStore transactions (SPEC §6)', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 8 })
  const store = new PostgresStore<pg.PoolClient>({ pool, table })
  const orderRows = async (key: string) =>
    (await pool.query(`SELECT who FROM "${orders}" WHERE intent = $1 ORDER BY who`, [key])).rows.map((r) => r.who as string)

  beforeAll(async () => {
    await store.migrate()
    await pool.query(`CREATE TABLE "${orders}" (intent text NOT NULL, who text NOT NULL)`)
    await pool.query(`CREATE TABLE "${accounts}" (id text PRIMARY KEY, balance integer NOT NULL)`)
  })
  afterAll(async () => {
    await store.close()
    await pool.query(`DROP TABLE IF EXISTS "${table}", "${orders}", "${accounts}"`)
    await pool.end()
  })

  it('commits the business row and the completion together, and replays without running again', async () => {
    const ledger = new Ledger({ store })
    const key = `order-${randomUUID()}`
    const work = async ({ tx }: { tx: pg.PoolClient }) => {
      await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, 'first')`, [key])
      return { ok: true }
    }
    const first = await ledger.runInTransaction({ key, payload: { n: 1 } }, work)
    expect(first).toMatchObject({ kind: 'executed', outcome: 'completed', value: { ok: true } })
    const second = await ledger.runInTransaction({ key, payload: { n: 1 } }, work)
    expect(second).toMatchObject({ kind: 'replayed', value: { ok: true } })
    expect(await orderRows(key)).toEqual(['first'])
    expect((await store.get('default', key))?.status).toBe('completed')
  })

  it("rolls back the business writes of a returned final answer (422) and stores the answer; failedWrites: 'commit' keeps them", async () => {
    const ledger = new Ledger({ store })
    const [rolled, kept] = [`order-${randomUUID()}`, `order-${randomUUID()}`]
    const declined =
      (key: string) =>
      async ({ tx }: { tx: pg.PoolClient }) => {
        await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, 'declined')`, [key])
        return { error: 'out of stock' }
      }
    const first = await ledger.runInTransaction({ key: rolled, payload: 1 }, declined(rolled), answeredWith(422))
    expect(first).toMatchObject({ kind: 'executed', outcome: 'failed' })
    expect(await orderRows(rolled)).toEqual([])
    expect(await store.get('default', rolled)).toMatchObject({ status: 'failed', response: { status: 422 } })
    const second = await ledger.runInTransaction({ key: kept, payload: 1 }, declined(kept), answeredWith(422, { failedWrites: 'commit' }))
    expect(second).toMatchObject({ kind: 'executed', outcome: 'failed' })
    expect(await orderRows(kept)).toEqual(['declined'])
  })

  it('stores the final answer of work that caught its own failed statement: the savepoint undoes the aborted part', async () => {
    const ledger = new Ledger({ store })
    const key = `order-${randomUUID()}`
    const result = await ledger.runInTransaction(
      { key, payload: 1 },
      async ({ tx }) => {
        await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, 'before')`, [key])
        // A statement that fails aborts the whole PostgreSQL transaction; the work answers a final 422 instead.
        const failed = await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, NULL)`, [key]).then(
          () => false,
          () => true,
        )
        return { error: failed ? 'invalid order' : 'inserted' }
      },
      answeredWith(422),
    )
    expect(result).toMatchObject({ kind: 'executed', outcome: 'failed', value: { error: 'invalid order' } })
    expect(await orderRows(key)).toEqual([])
    expect(await store.get('default', key)).toMatchObject({ status: 'failed', response: { status: 422 } })
  })

  it('rolls back the business writes when the work throws, and releases the record for a retry', async () => {
    const ledger = new Ledger({ store })
    const key = `order-${randomUUID()}`
    await expect(
      ledger.runInTransaction({ key, payload: 1 }, async ({ tx }) => {
        await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, 'failed')`, [key])
        throw new Error('card declined by a flaky gateway')
      }),
    ).rejects.toThrow('flaky gateway')
    expect(await orderRows(key)).toEqual([])
    const retry = await ledger.runInTransaction({ key, payload: 1 }, async ({ tx, token }) => {
      await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, 'retry')`, [key])
      return token
    })
    expect(retry).toMatchObject({ kind: 'executed', outcome: 'completed', value: 2 })
    expect(await orderRows(key)).toEqual(['retry'])
  })

  it("rolls back a zombie's business row when it commits while the new holder is still running: the token alone refuses it", async () => {
    const key = `order-${randomUUID()}`
    const gate = () => {
      let open = () => {}
      const opened = new Promise<void>((resolve) => {
        open = resolve
      })
      return { open, opened }
    }
    const zombieWrote = gate()
    const zombieResumes = gate()
    const takerWrote = gate()
    const takerFinishes = gate()
    const zombie = new Ledger({ store: paused(store), lease: 300 })
    const zombieRun = zombie.runInTransaction({ key, payload: 1 }, async ({ tx }) => {
      await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, 'zombie')`, [key])
      zombieWrote.open()
      await zombieResumes.opened
      return 'zombie'
    })
    await zombieWrote.opened
    // Past the zombie's lease: the next request takes over with token 2, and is still working…
    await new Promise((resolve) => setTimeout(resolve, 400))
    const taker = new Ledger({ store, wait: 0 })
    const takerRun = taker.runInTransaction({ key, payload: 1 }, async ({ tx, token, takeover }) => {
      await tx.query(`INSERT INTO "${orders}" (intent, who) VALUES ($1, 'taker')`, [key])
      takerWrote.open()
      await takerFinishes.opened
      return { token, takeover }
    })
    await takerWrote.opened
    // …when the zombie resumes and commits. The record is in progress, as the zombie left it: only
    // its token (1, not 2) tells the store to refuse the completion and roll the zombie's order back.
    expect(await store.get('default', key)).toMatchObject({ status: 'in_progress', token: 2 })
    zombieResumes.open()
    expect(await zombieRun).toMatchObject({ kind: 'executed', outcome: 'fenced_out', token: 1 })
    expect(await orderRows(key)).toEqual([])
    expect(await store.get('default', key)).toMatchObject({ status: 'in_progress', token: 2 })
    takerFinishes.open()
    expect(await takerRun).toMatchObject({ kind: 'executed', outcome: 'completed', value: { token: 2, takeover: true } })
    expect(await orderRows(key)).toEqual(['taker'])
    expect(await store.get('default', key)).toMatchObject({ status: 'completed', token: 2 })
  })

  it('rolls back and releases on a serialization failure, recognisable by isTransientTransactionError, and the retry runs', async () => {
    const serializable = new PostgresStore<pg.PoolClient>({ pool, table, isolationLevel: 'serializable', notifications: false })
    const ledger = new Ledger({ store: serializable })
    const account = `acct-${randomUUID()}`
    await pool.query(`INSERT INTO "${accounts}" (id, balance) VALUES ($1, 100)`, [account])
    let arrived = 0
    let go = () => {}
    const bothRead = new Promise<void>((resolve) => {
      go = resolve
    })
    const debit = (key: string) =>
      ledger.runInTransaction({ key, payload: 'debit' }, async ({ tx }) => {
        await tx.query(`SELECT balance FROM "${accounts}" WHERE id = $1`, [account])
        if (++arrived === 2) go()
        await bothRead
        await tx.query(`UPDATE "${accounts}" SET balance = balance - 1 WHERE id = $1`, [account])
        return 'debited'
      })
    const keys = [`debit-${randomUUID()}`, `debit-${randomUUID()}`]
    const results = await Promise.allSettled(keys.map(debit))
    const failed = results.flatMap((r, i) => (r.status === 'rejected' ? [{ key: keys[i] as string, error: r.reason as unknown }] : []))
    expect(failed).toHaveLength(1)
    const { key, error } = failed[0] as { key: string; error: unknown }
    expect(isTransientTransactionError(error)).toBe(true)
    expect((error as { code?: string }).code).toBe('40001')
    // Released: the same key runs afresh, with the next token.
    const retry = await ledger.runInTransaction({ key, payload: 'debit' }, async ({ tx, token }) => {
      await tx.query(`UPDATE "${accounts}" SET balance = balance - 1 WHERE id = $1`, [account])
      return token
    })
    expect(retry).toMatchObject({ kind: 'executed', outcome: 'completed', value: 2 })
    const { rows } = await pool.query(`SELECT balance FROM "${accounts}" WHERE id = $1`, [account])
    expect(rows[0].balance).toBe(98)
  })
})
