/** ledger.runInTransaction through knex's own transactions (idemkey/knex), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('knex', 'postgres')
await describeToolTransactions('knex', 'mysql')
