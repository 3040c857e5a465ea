/** ledger.runInTransaction through prisma's own transactions (idemkey/prisma), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('prisma', 'postgres')
await describeToolTransactions('prisma', 'mysql')
