/** ledger.runInTransaction through drizzle's own transactions (idemkey/drizzle), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('drizzle', 'postgres')
await describeToolTransactions('drizzle', 'mysql')
