/** ledger.runInTransaction through sequelize's own transactions (idemkey/sequelize), on PostgreSQL and MariaDB: the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('sequelize', 'postgres')
await describeToolTransactions('sequelize', 'mysql')
