/** ledger.runInTransaction through MikroORM's own transactions (idemkey/mikro-orm), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('mikro-orm', 'postgres')
await describeToolTransactions('mikro-orm', 'mysql')
