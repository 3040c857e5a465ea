/** ledger.runInTransaction through kysely's own transactions (idemkey/kysely), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('kysely', 'postgres')
await describeToolTransactions('kysely', 'mysql')
