/**
 * One harness per data-layer tool and database, for the tool-transaction guarantee suite
 * (test/helpers/orm-guarantees.ts) and its SIGKILL fixture: the adapter under test, and the business
 * writes done the way a user of that tool does them (its own query API, inside its own `tx`).
 */
import { sql as drizzleSql } from 'drizzle-orm'
import { mysqlTable, varchar } from 'drizzle-orm/mysql-core'
import { drizzle as drizzleMysql } from 'drizzle-orm/mysql2'
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres'
import { pgTable, text } from 'drizzle-orm/pg-core'
import knexFactory, { type Knex } from 'knex'
import { Kysely, MysqlDialect, PostgresDialect } from 'kysely'
import { createPool as createCallbackPool } from 'mysql2'
import mysql from 'mysql2/promise'
import pg from 'pg'
import postgres from 'postgres'
import { Sequelize, type Transaction } from 'sequelize'
import { DataSource, type EntityManager } from 'typeorm'
import type { SqlTransactions } from '../../src/core/sql-transactions.js'
import { drizzleTransactions } from '../../src/orm/drizzle/index.js'
import { knexTransactions } from '../../src/orm/knex/index.js'
import { kyselyTransactions } from '../../src/orm/kysely/index.js'
import { mikroOrmTransactions } from '../../src/orm/mikro-orm/index.js'
import { postgresJsTransactions } from '../../src/orm/postgres-js/index.js'
import { sequelizeTransactions } from '../../src/orm/sequelize/index.js'
import { typeormTransactions } from '../../src/orm/typeorm/index.js'

export const PG_URL = 'postgres://root@127.0.0.1:5432/test'
export const MYSQL_URL = 'mysql://root@127.0.0.1:3306/test'

export type Dialect = 'postgres' | 'mysql'

/** The business tables of one test run: orders (intent, who) and accounts (id, balance). */
export interface BusinessTables {
  orders: string
  accounts: string
}

/** A tool wired to one database: its adapter, and business writes through its own API. */
export interface ToolHarness<Tx = unknown> {
  transactions: SqlTransactions<Tx>
  /** Inserts an order row inside `tx`, as a user of the tool writes it. */
  insertOrder(tx: Tx, intent: string, who: string): Promise<void>
  /** `balance = balance - 1` for one account inside `tx` (takes its row lock). */
  debit(tx: Tx, account: string): Promise<void>
  close(): Promise<void>
}

export type ToolName = 'drizzle' | 'kysely' | 'knex' | 'typeorm' | 'sequelize' | 'postgres.js' | 'prisma' | 'mikro-orm'

/** Builds the harness of a tool on a database; `prisma` comes from test/helpers/orm-prisma.ts (its client is generated). */
export async function toolHarness(tool: ToolName, dialect: Dialect, tables: BusinessTables, poolSize = 6): Promise<ToolHarness> {
  const { orders, accounts } = tables
  switch (tool) {
    case 'drizzle': {
      if (dialect === 'postgres') {
        const pool = new pg.Pool({ connectionString: PG_URL, max: poolSize })
        const db = drizzlePg(pool)
        const table = pgTable(orders, { intent: text('intent').notNull(), who: text('who').notNull() })
        const account = pgTable(accounts, { id: text('id').primaryKey() })
        return harness(drizzleTransactions(db), {
          insertOrder: async (tx, intent, who) => void (await tx.insert(table).values({ intent, who })),
          debit: async (tx, id) =>
            void (await tx.execute(drizzleSql`UPDATE ${account} SET balance = balance - 1 WHERE ${account.id} = ${id}`)),
          close: () => pool.end(),
        })
      }
      const pool = mysql.createPool({ uri: MYSQL_URL, connectionLimit: poolSize })
      const db = drizzleMysql(pool)
      const table = mysqlTable(orders, {
        intent: varchar('intent', { length: 200 }).notNull(),
        who: varchar('who', { length: 50 }).notNull(),
      })
      const account = mysqlTable(accounts, { id: varchar('id', { length: 200 }).primaryKey() })
      return harness(drizzleTransactions(db), {
        insertOrder: async (tx, intent, who) => void (await tx.insert(table).values({ intent, who })),
        debit: async (tx, id) =>
          void (await tx.execute(drizzleSql`UPDATE ${account} SET balance = balance - 1 WHERE ${account.id} = ${id}`)),
        close: () => pool.end(),
      })
    }
    case 'kysely': {
      interface DB {
        [table: string]: { intent?: string; who?: string; id?: string; balance?: number }
      }
      const db = new Kysely<DB>({
        dialect:
          dialect === 'postgres'
            ? new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: poolSize }) })
            : new MysqlDialect({ pool: createCallbackPool({ uri: MYSQL_URL, connectionLimit: poolSize }) }),
      })
      return harness(kyselyTransactions(db), {
        insertOrder: async (tx, intent, who) => void (await tx.insertInto(orders).values({ intent, who }).execute()),
        debit: async (tx, id) =>
          void (await tx
            .updateTable(accounts)
            .set((eb) => ({ balance: eb('balance', '-', 1) }))
            .where('id', '=', id)
            .execute()),
        close: () => db.destroy(),
      })
    }
    case 'knex': {
      const knex: Knex =
        dialect === 'postgres'
          ? knexFactory({ client: 'pg', connection: PG_URL, pool: { min: 0, max: poolSize } })
          : knexFactory({ client: 'mysql2', connection: MYSQL_URL, pool: { min: 0, max: poolSize } })
      return harness(knexTransactions(knex), {
        insertOrder: async (tx, intent, who) => void (await tx(orders).insert({ intent, who })),
        debit: async (tx, id) => void (await tx(accounts).where({ id }).decrement('balance', 1)),
        close: () => knex.destroy(),
      })
    }
    case 'typeorm': {
      const dataSource = new DataSource(
        dialect === 'postgres' ? { type: 'postgres', url: PG_URL, poolSize } : { type: 'mysql', url: MYSQL_URL, poolSize },
      )
      await dataSource.initialize()
      return harness(typeormTransactions(dataSource), {
        insertOrder: async (tx: EntityManager, intent, who) =>
          void (await tx.createQueryBuilder().insert().into(orders, ['intent', 'who']).values({ intent, who }).execute()),
        debit: async (tx: EntityManager, id) =>
          void (await tx
            .createQueryBuilder()
            .update(accounts)
            .set({ balance: () => 'balance - 1' })
            .where('id = :id', { id })
            .execute()),
        close: () => dataSource.destroy(),
      })
    }
    case 'sequelize': {
      const sequelize = new Sequelize(dialect === 'postgres' ? PG_URL : MYSQL_URL, {
        logging: false,
        pool: { max: poolSize, min: 0 },
        dialect: dialect === 'postgres' ? 'postgres' : 'mysql',
      })
      const queries = sequelize.getQueryInterface()
      return harness(sequelizeTransactions(sequelize), {
        insertOrder: async (tx: Transaction, intent, who) =>
          void (await queries.bulkInsert(orders, [{ intent, who }], { transaction: tx })),
        debit: async (tx: Transaction, id) =>
          void (await queries.bulkUpdate(accounts, { balance: sequelize.literal('balance - 1') }, { id }, { transaction: tx })),
        close: () => sequelize.close(),
      })
    }
    case 'postgres.js': {
      if (dialect !== 'postgres') throw new Error('postgres.js is PostgreSQL only')
      const sql = postgres(PG_URL, { max: poolSize, onnotice: () => {} })
      return harness(postgresJsTransactions(sql), {
        insertOrder: async (tx, intent, who) => void (await tx`INSERT INTO ${tx(orders)} ${tx({ intent, who })}`),
        debit: async (tx, id) => void (await tx`UPDATE ${tx(accounts)} SET balance = balance - 1 WHERE id = ${id}`),
        close: () => sql.end({ timeout: 5 }),
      })
    }
    case 'mikro-orm': {
      const { MikroORM } = dialect === 'postgres' ? await import('@mikro-orm/postgresql') : await import('@mikro-orm/mysql')
      const orm = await MikroORM.init({
        clientUrl: dialect === 'postgres' ? PG_URL : MYSQL_URL,
        entities: [],
        discovery: { warnWhenNoEntities: false },
        pool: { max: poolSize },
      } as never)
      return harness(mikroOrmTransactions(orm.em), {
        insertOrder: async (tx, intent, who) =>
          void (await tx.execute(`INSERT INTO ${quote(dialect, orders)} (intent, who) VALUES (?, ?)`, [intent, who])),
        debit: async (tx, id) => void (await tx.execute(`UPDATE ${quote(dialect, accounts)} SET balance = balance - 1 WHERE id = ?`, [id])),
        close: () => orm.close(),
      })
    }
    case 'prisma': {
      const { prismaHarness } = await import('./orm-prisma.js')
      return prismaHarness(dialect, tables, poolSize)
    }
  }
}

function quote(dialect: Dialect, name: string): string {
  return dialect === 'postgres' ? `"${name}"` : `\`${name}\``
}

/** Types the harness by its adapter's transaction, and erases it for the caller. */
function harness<Tx>(transactions: SqlTransactions<Tx>, rest: Omit<ToolHarness<Tx>, 'transactions'>): ToolHarness {
  return { transactions, ...rest } as unknown as ToolHarness
}
