/** ledger.runInTransaction through postgres.js's own transactions (idemkey/postgres-js, `sql.begin`): the guarantees of issue 25. */
import { describeToolTransactions } from './helpers/orm-guarantees.js'

await describeToolTransactions('postgres.js', 'postgres')
