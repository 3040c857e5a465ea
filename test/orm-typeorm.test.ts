/** ledger.runInTransaction through typeorm's own transactions (idemkey/typeorm), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('typeorm', 'postgres')
await describeToolTransactions('typeorm', 'mysql')
