import mysql from 'mysql2/promise'
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

  it('reports a transaction on an unreachable server as STORE_UNAVAILABLE', async () => {
    const down = new MySqlStore({ uri: 'mysql://root@127.0.0.1:1/test', table })
    await expect(down.transaction(async () => 1)).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE' })
    await down.close()
  })
})
