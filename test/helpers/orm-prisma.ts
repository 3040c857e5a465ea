/**
 * The Prisma harness of the tool-transaction tests. Prisma's client is generated from
 * test/fixtures/prisma/{pg,mysql}.prisma on first use (`prisma generate`, with its query compiler: no
 * engine download). Its schema engine cannot be downloaded here and is not needed to generate; any
 * executable stands in for it (PRISMA_SCHEMA_ENGINE_BINARY), see docs/orm.md.
 */
import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { PrismaMariaDb } from '@prisma/adapter-mariadb'
import { PrismaPg } from '@prisma/adapter-pg'
import { prismaTransactions } from '../../src/orm/prisma/index.js'
import type { BusinessTables, Dialect, ToolHarness } from './orm-tools.js'

const FIXTURES = join(dirname(fileURLToPath(import.meta.url)), '../fixtures/prisma')
const require = createRequire(import.meta.url)

/** The tables the Prisma schemas map their models to (Prisma's models name fixed tables). */
export const PRISMA_TABLES: BusinessTables = { orders: 'idemkey_prisma_orders', accounts: 'idemkey_prisma_accounts' }

/**
 * Generates the client of one schema unless it is there. Asynchronously: `prisma generate` can take a
 * minute on a loaded machine, and a test worker whose event loop is blocked that long misses its RPC
 * deadline with vitest's main process ("Timeout calling onTaskUpdate"), failing a run whose tests passed.
 */
export async function generatePrismaClient(dialect: Dialect): Promise<string> {
  const name = dialect === 'postgres' ? 'pg' : 'mysql'
  const output = join(FIXTURES, 'generated', name)
  if (!existsSync(join(output, 'client.ts'))) {
    const cli = require.resolve('prisma/build/index.js')
    await promisify(execFile)(process.execPath, [cli, 'generate', '--schema', join(FIXTURES, `${name}.prisma`)], {
      env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: '/bin/true', PRISMA_HIDE_UPDATE_MESSAGE: '1' },
    })
  }
  return join(output, 'client.ts')
}

export async function prismaHarness(dialect: Dialect, tables: BusinessTables, poolSize = 6): Promise<ToolHarness> {
  if (tables.orders !== PRISMA_TABLES.orders || tables.accounts !== PRISMA_TABLES.accounts) {
    throw new Error(`the Prisma schema maps its models to ${JSON.stringify(PRISMA_TABLES)}`)
  }
  const { PrismaClient } = (await import(await generatePrismaClient(dialect))) as {
    PrismaClient: new (options: { adapter: unknown }) => PrismaLike
  }
  const adapter =
    dialect === 'postgres'
      ? new PrismaPg({ connectionString: 'postgres://root@127.0.0.1:5432/test', max: poolSize })
      : new PrismaMariaDb({ host: '127.0.0.1', port: 3306, user: 'root', database: 'test', connectionLimit: poolSize })
  const prisma = new PrismaClient({ adapter })
  const transactions = prismaTransactions(prisma, { dialect })
  return {
    transactions,
    insertOrder: async (tx, intent, who) => void (await (tx as PrismaLike).order.create({ data: { intent, who } })),
    debit: async (tx, id) => void (await (tx as PrismaLike).account.update({ where: { id }, data: { balance: { decrement: 1 } } })),
    close: () => prisma.$disconnect(),
  } as ToolHarness
}

/** The part of the generated client the harness uses (the generated types are not type-checked here). */
interface PrismaLike {
  order: { create(args: { data: { intent: string; who: string } }): Promise<unknown> }
  account: { update(args: { where: { id: string }; data: { balance: { decrement: number } } }): Promise<unknown> }
  // biome-ignore lint/suspicious/noExplicitAny: Prisma's transaction signature.
  $transaction(fn: (tx: any) => Promise<any>, options?: any): Promise<any>
  $queryRawUnsafe(query: string, ...values: unknown[]): Promise<unknown>
  $executeRawUnsafe(query: string, ...values: unknown[]): Promise<number>
  $disconnect(): Promise<void>
}
