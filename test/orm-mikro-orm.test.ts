/** ledger.runInTransaction through MikroORM's own transactions (idemkey/mikro-orm), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { randomUUID } from 'node:crypto'
import { type EntityManager, MikroORM } from '@mikro-orm/postgresql'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { Ledger } from '../src/core/ledger.js'
import { mikroOrmTransactions } from '../src/orm/mikro-orm/index.js'
import { describeToolTransactions } from './helpers/orm-guarantees.js'
import { PG_URL } from './helpers/orm-tools.js'
import { serviceSkipReason } from './helpers/services.js'

await describeToolTransactions('mikro-orm', 'postgres')
await describeToolTransactions('mikro-orm', 'mysql')

/**
 * docs/orm.md, "Nesting": runInTransaction opens a new top-level transaction of the tool, so called
 * inside another transaction of the application its writes and the record commit on their own. MikroORM
 * finds an open transaction through its async context and nests by default (a savepoint in it): the
 * record's completion then waited on the outer transaction, and rolled back with it after the ledger had
 * answered `completed`.
 */
describe.skipIf((await serviceSkipReason('PostgreSQL', 5432)) !== undefined)(
  'mikro-orm: runInTransaction called inside an open em.transactional',
  () => {
    const suffix = randomUUID().slice(0, 8)
    const table = `idemkey_orm_nest_${suffix}`
    const orders = `idemkey_orm_nest_orders_${suffix}`
    let orm: MikroORM
    let store: PostgresStore<pg.PoolClient, EntityManager>
    const pool = new pg.Pool({ connectionString: PG_URL, max: 4 })
    beforeAll(async () => {
      orm = await MikroORM.init({ clientUrl: PG_URL, entities: [], discovery: { warnWhenNoEntities: false }, pool: { max: 4 } } as never)
      store = new PostgresStore({ pool, table, transactions: mikroOrmTransactions(orm.em) }) as never
      await store.migrate()
      await pool.query(`CREATE TABLE "${orders}" (intent text NOT NULL)`)
    })
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}", "${orders}"`)
      await store.close()
      await orm.close()
      await pool.end()
    })

    it('commits the intent and its record on their own: the outer transaction rolling back afterwards takes neither with it', async () => {
      const ledger = new Ledger({ store })
      const key = `order-${randomUUID()}`
      let result: unknown
      await expect(
        orm.em.transactional(async () => {
          result = await ledger.runInTransaction({ key, payload: 1 }, async ({ tx }) => {
            await tx.execute(`INSERT INTO "${orders}" (intent) VALUES (?)`, [key])
            return 'placed'
          })
          throw new Error('the outer transaction fails after the intent')
        }),
      ).rejects.toThrow('outer transaction fails')
      expect(result).toMatchObject({ kind: 'executed', outcome: 'completed' })
      expect((await pool.query(`SELECT intent FROM "${orders}" WHERE intent = $1`, [key])).rows).toHaveLength(1)
      expect(await store.get('default', key)).toMatchObject({ status: 'completed' })
    })
  },
)
