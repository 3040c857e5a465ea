import mysql from 'mysql2/promise'
import { answeredWith } from '../../../test/helpers/final-answers.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { Ledger } from '../../core/ledger.js'
import { fp, sampleOutcome } from '../../testing/index.js'
import { MySqlStore } from './mysql-store.js'
import type { MySqlTransaction } from './pool.js'

const URI = 'mysql://root@127.0.0.1:3306/test'
const skip = await serviceSkipReason('MariaDB', 3306)
if (skip) console.warn(`\n!!! SKIPPED: MySqlStore transactions: ${skip}\n`)
const table = `idemkey_tx_${process.pid}_${Date.now().toString(36)}`
const orders = `${table}_orders`

describe.skipIf(skip !== undefined)('MySqlStore transactions (SPEC §6)', () => {
  const pool = mysql.createPool({ uri: URI, connectionLimit: 4 })
  const store = new MySqlStore({ pool, table })
  const ledger = new Ledger({ store, lease: '30s', ttl: '1h', wait: 0 })
  const orderIds = async () => {
    const [rows] = await pool.query(`SELECT id FROM \`${orders}\` ORDER BY id`)
    return (rows as Array<{ id: string }>).map((row) => row.id)
  }

  beforeAll(async () => {
    await store.migrate()
    await pool.query(`CREATE TABLE \`${orders}\` (id VARCHAR(64) PRIMARY KEY) ENGINE = InnoDB`)
  })
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS \`${table}\`, \`${table}_meta\`, \`${orders}\``)
    await pool.end()
  })

  it('commits the business write and the completed record together, and replays without running again', async () => {
    let runs = 0
    const work = async ({ tx }: { tx: MySqlTransaction }) => {
      runs++
      await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, ['order-1'])
      return { id: 'order-1' }
    }
    const first = await ledger.runInTransaction({ key: 'k1', scope: 'tx', payload: { n: 1 } }, work)
    expect(first).toMatchObject({ kind: 'executed', outcome: 'completed' })
    expect((await store.get('tx', 'k1'))?.status).toBe('completed')
    const again = await ledger.runInTransaction({ key: 'k1', scope: 'tx', payload: { n: 1 } }, work)
    expect(again).toMatchObject({ kind: 'replayed', value: { id: 'order-1' } })
    expect(runs).toBe(1)
    expect(await orderIds()).toEqual(['order-1'])
  })

  it('rolls back the business write when the work throws, and releases the key for a retry', async () => {
    const failing = ledger.runInTransaction({ key: 'k2', scope: 'tx', payload: { n: 2 } }, async ({ tx }) => {
      await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, ['order-2'])
      throw new Error('payment provider timed out')
    })
    await expect(failing).rejects.toThrow('payment provider timed out')
    expect(await orderIds()).not.toContain('order-2')
    expect(await store.acquire('tx', 'k2', fp('other'), 60_000)).toEqual({ kind: 'acquired', token: 2 })
  })

  it("rolls back the business write of a returned final answer (422) and stores the answer; failedWrites: 'commit' keeps it", async () => {
    const declined =
      (id: string) =>
      async ({ tx }: { tx: MySqlTransaction }) => {
        await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, [id])
        return { error: 'out of stock' }
      }
    const first = await ledger.runInTransaction({ key: 'k-422', scope: 'tx', payload: 1 }, declined('order-422'), answeredWith(422))
    expect(first).toMatchObject({ kind: 'executed', outcome: 'failed' })
    expect(await orderIds()).not.toContain('order-422')
    expect(await store.get('tx', 'k-422')).toMatchObject({ status: 'failed', response: { status: 422 } })
    const kept = await ledger.runInTransaction(
      { key: 'k-422-kept', scope: 'tx', payload: 1 },
      declined('order-422-kept'),
      answeredWith(422, { failedWrites: 'commit' }),
    )
    expect(kept).toMatchObject({ kind: 'executed', outcome: 'failed' })
    expect(await orderIds()).toContain('order-422-kept')
  })

  it("rolls back a fenced-out holder's business write: completeInTransaction refuses its stale token", async () => {
    const { token } = (await store.acquire('tx', 'k3', fp('a'), 200)) as { token: number }
    await new Promise((resolve) => setTimeout(resolve, 300))
    expect(await store.acquire('tx', 'k3', fp('a'), 60_000)).toEqual({ kind: 'acquired', token: token + 1 })
    const zombie = store.transaction(async (tx) => {
      await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, ['order-3-zombie'])
      if (!(await store.completeInTransaction(tx, 'tx', 'k3', token, sampleOutcome(), 60_000))) throw new Error('fenced out')
    })
    await expect(zombie).rejects.toThrow('fenced out')
    expect(await orderIds()).not.toContain('order-3-zombie')
    const record = await store.get('tx', 'k3')
    expect(record).toMatchObject({ status: 'in_progress', token: token + 1 })
    expect(await store.transaction((tx) => store.completeInTransaction(tx, 'tx', 'k3', token + 1, sampleOutcome(), 60_000))).toBe(true)
    expect((await store.get('tx', 'k3'))?.status).toBe('completed')
  })

  /**
   * A real deadlock: the work locks row a then row b, a second connection locks b then a. InnoDB rolls
   * the victim's whole transaction back; work that catches the error and carries on would otherwise
   * write in autocommit (each statement its own transaction) and complete the record with its first
   * write lost.
   */
  async function deadlocked(tx: MySqlTransaction, rows: string) {
    const other = await pool.getConnection()
    try {
      await other.query('START TRANSACTION')
      await tx.execute(`UPDATE \`${rows}\` SET v = v + 1 WHERE id = 'a'`)
      // The other changes more rows, so InnoDB picks the work's (smaller) transaction as the victim.
      // One row at a time: an UPDATE of most of the table scans it whole, locking row a too.
      for (const id of ['b', 'c', 'd', 'e', 'f']) await other.execute(`UPDATE \`${rows}\` SET v = v + 1 WHERE id = ?`, [id])
      const blocked = other.execute(`UPDATE \`${rows}\` SET v = v + 1 WHERE id = 'a'`).then(
        () => 'other went on',
        (error: { errno?: number }) => `other failed ${error.errno}`,
      )
      await new Promise((resolve) => setTimeout(resolve, 200)) // the other now waits on row a
      const mine = await tx.execute(`UPDATE \`${rows}\` SET v = v + 1 WHERE id = 'b'`).then(
        () => undefined,
        (error: { errno?: number }) => error,
      )
      await blocked
      return mine
    } finally {
      await other.query('ROLLBACK').catch(() => {})
      other.release()
    }
  }

  it('refuses to go on in a transaction InnoDB rolled back after a deadlock: work that catches the error and carries on writes nothing and completes nothing', async () => {
    const rows = `${table}_rows`
    await pool.query(`CREATE TABLE \`${rows}\` (id VARCHAR(8) PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB`)
    await pool.query(`INSERT INTO \`${rows}\` VALUES ('a', 0), ('b', 0), ('c', 0), ('d', 0), ('e', 0), ('f', 0)`)
    const seen: unknown[] = []
    const run = ledger.runInTransaction({ key: 'k-deadlock', scope: 'tx', payload: { n: 5 } }, async ({ tx }) => {
      await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, ['order-5-before'])
      const deadlock = await deadlocked(tx, rows)
      seen.push(deadlock)
      // Caught and carried on, as a careless retry loop does: this statement must not run in autocommit.
      await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, ['order-5-after'])
      return 'done'
    })
    await expect(run).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE', message: expect.stringContaining('deadlock') })
    expect(seen).toEqual([expect.objectContaining({ errno: 1213 })])
    // Neither write is there, and the record was released, not completed: a retry runs the work again.
    expect((await orderIds()).filter((id) => id.startsWith('order-5'))).toEqual([])
    expect(await store.acquire('tx', 'k-deadlock', fp('other'), 60_000)).toEqual({ kind: 'acquired', token: 2 })
    await pool.query(`DROP TABLE \`${rows}\``)
  })

  it('refuses to complete a transaction InnoDB rolled back after a deadlock when the work swallowed the error and returned', async () => {
    const rows = `${table}_rows2`
    await pool.query(`CREATE TABLE \`${rows}\` (id VARCHAR(8) PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB`)
    await pool.query(`INSERT INTO \`${rows}\` VALUES ('a', 0), ('b', 0), ('c', 0), ('d', 0), ('e', 0), ('f', 0)`)
    const run = ledger.runInTransaction({ key: 'k-deadlock-2', scope: 'tx', payload: { n: 6 } }, async ({ tx }) => {
      await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, ['order-6'])
      await deadlocked(tx, rows)
      return 'done, it says'
    })
    await expect(run).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    expect(await orderIds()).not.toContain('order-6')
    expect((await store.get('tx', 'k-deadlock-2'))?.status).not.toBe('completed')
    await pool.query(`DROP TABLE \`${rows}\``)
  })

  it('refuses a statement that ended the transaction under the work (an implicit commit: DDL), and completes nothing', async () => {
    const run = ledger.runInTransaction({ key: 'k-ddl', scope: 'tx', payload: { n: 7 } }, async ({ tx }) => {
      await tx.execute(`INSERT INTO \`${orders}\` (id) VALUES (?)`, ['order-7'])
      await tx.query(`CREATE TABLE IF NOT EXISTS \`${table}_ddl\` (id INT)`)
      return 'done'
    })
    await expect(run).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining('implicit commit') })
    // The DDL committed the insert before it (nothing can take that back), but the record is not completed.
    expect((await store.get('tx', 'k-ddl'))?.status).not.toBe('completed')
    await pool.query(`DROP TABLE IF EXISTS \`${table}_ddl\``)
  })

  it('reports a transaction on an unreachable server as STORE_UNAVAILABLE', async () => {
    const down = new MySqlStore({ uri: 'mysql://root@127.0.0.1:1/test', table })
    await expect(down.transaction(async () => 1)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    await down.close()
  })
})
