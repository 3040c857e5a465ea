/**
 * Prisma transactions for `PostgresStore` and `MySqlStore` (docs/orm.md): `ledger.runInTransaction`
 * hands the work the interactive transaction's client (`tx.order.create(…)`), and the record completes
 * inside that transaction.
 *
 * @example
 * import { prismaTransactions } from 'idemkey/prisma'
 * const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString }) })
 * const ledger = new Ledger({ store: new PostgresStore({ connectionString, transactions: prismaTransactions(prisma) }) })
 * await ledger.runInTransaction({ key, payload: order }, async ({ tx }) => tx.order.create({ data: order }))
 */
import type { SqlTransactions } from '../../core/sql-transactions.js'
import { IdempotencyError } from '../../errors.js'

/** The methods Prisma leaves out of an interactive transaction's client (its `ITXClientDenyList`). */
type Denied = '$connect' | '$disconnect' | '$on' | '$transaction' | '$extends' | '$use'

/** What idemkey needs of a Prisma client: interactive transactions and raw SQL. */
export interface PrismaClientLike {
  // biome-ignore lint/suspicious/noExplicitAny: Prisma's $transaction is overloaded and generic; any keeps every generated client assignable.
  $transaction(fn: (tx: any) => Promise<any>, options?: any): Promise<any>
  $queryRawUnsafe(query: string, ...values: unknown[]): PromiseLike<unknown>
  $executeRawUnsafe(query: string, ...values: unknown[]): PromiseLike<number>
}

/** The client of an interactive transaction, as Prisma types it (`Prisma.TransactionClient`). */
export type PrismaTransactionOf<Client> = Omit<Client, Denied>

/** Options of {@link prismaTransactions}. */
export interface PrismaTransactionsOptions {
  /** The database: PostgreSQL (`@prisma/adapter-pg`) or MySQL/MariaDB (`@prisma/adapter-mariadb`). @default 'postgres' */
  dialect?: 'postgres' | 'mysql'
  /**
   * Prisma's interactive-transaction options. Prisma ends a transaction after `timeout` (5 s by default):
   * set it above the work's longest run. @default { timeout: 30000, maxWait: 5000 }
   */
  transactionOptions?: { timeout?: number; maxWait?: number; isolationLevel?: string }
}

/**
 * Transactions of a Prisma 7 client with a driver adapter: each statement of the store runs as
 * `tx.$queryRawUnsafe` (PostgreSQL) or `tx.$executeRawUnsafe` (MySQL) with bound values.
 *
 * @example new PostgresStore({ connectionString, transactions: prismaTransactions(prisma) })
 */
export function prismaTransactions<Client extends PrismaClientLike>(
  prisma: Client,
  options: PrismaTransactionsOptions = {},
): SqlTransactions<PrismaTransactionOf<Client>> {
  if (typeof prisma?.$transaction !== 'function' || typeof prisma.$queryRawUnsafe !== 'function') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'prismaTransactions needs a PrismaClient (new PrismaClient({ adapter })): one with $transaction() and $queryRawUnsafe().',
    )
  }
  const dialect = options.dialect ?? 'postgres'
  if (dialect !== 'postgres' && dialect !== 'mysql') {
    throw new IdempotencyError(
      'INVALID_OPTION',
      `prismaTransactions dialect must be 'postgres' or 'mysql', got ${JSON.stringify(dialect)}.`,
    )
  }
  const transactionOptions = { timeout: 30_000, maxWait: 5_000, ...options.transactionOptions }
  return {
    tool: 'prisma',
    dialect,
    transaction: (fn) => prisma.$transaction(fn, transactionOptions),
    async execute(tx, sql, values) {
      const raw = tx as unknown as PrismaClientLike
      if (dialect === 'postgres') {
        const rows = await raw.$queryRawUnsafe(sql, ...values)
        return { count: Array.isArray(rows) ? rows.length : 0 }
      }
      return { count: Number(await raw.$executeRawUnsafe(sql, ...values)) }
    },
  }
}
