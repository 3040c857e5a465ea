/**
 * Each ORM adapter refuses what is not its ORM's object with a typed error that names what it needs:
 * a pg Pool, a Prisma client given to Knex and the like crashed with "Cannot read properties of
 * undefined" (or failed only at the first statement).
 */
import { describe, expect, it } from 'vitest'
import { drizzleTransactions } from './drizzle/index.js'
import { knexTransactions } from './knex/index.js'
import { kyselyTransactions } from './kysely/index.js'
import { mikroOrmTransactions } from './mikro-orm/index.js'
import { postgresJsPool, postgresJsTransactions } from './postgres-js/index.js'
import { prismaTransactions } from './prisma/index.js'
import { sequelizeTransactions } from './sequelize/index.js'
import { typeormTransactions } from './typeorm/index.js'

/** What a user could pass by mistake: a pg Pool's shape. */
const pgPool = { query: async () => ({ rows: [] }), connect: async () => ({}) }

describe('ORM adapters given something else', () => {
  it.each([
    ['knexTransactions', () => knexTransactions(pgPool as never), 'knexTransactions needs a Knex instance'],
    ['sequelizeTransactions', () => sequelizeTransactions(pgPool as never), 'sequelizeTransactions needs Sequelize'],
    ['typeormTransactions', () => typeormTransactions(pgPool as never), 'typeormTransactions needs a DataSource'],
    ['mikroOrmTransactions', () => mikroOrmTransactions(pgPool as never), 'mikroOrmTransactions needs a MikroORM EntityManager'],
    ['kyselyTransactions', () => kyselyTransactions(pgPool as never), 'kyselyTransactions needs a Kysely instance'],
    ['prismaTransactions', () => prismaTransactions(pgPool as never), 'prismaTransactions needs a PrismaClient'],
    ['postgresJsTransactions', () => postgresJsTransactions(pgPool as never), 'postgresJsTransactions(sql) needs a postgres.js instance'],
    ['postgresJsPool', () => postgresJsPool(pgPool as never), 'postgresJsPool(sql) needs a postgres.js instance'],
    ['drizzleTransactions', () => drizzleTransactions(pgPool as never), 'drizzleTransactions needs a Drizzle database'],
    ['knexTransactions (nothing)', () => knexTransactions(undefined as never), 'knexTransactions needs a Knex instance'],
  ])('%s refuses it with INVALID_OPTION, naming what it needs', (_name, make, message) => {
    expect(make).toThrow(expect.objectContaining({ code: 'INVALID_OPTION', message: expect.stringContaining(message) }))
  })
})
