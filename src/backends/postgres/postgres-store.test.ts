/** PostgresStore on the plain layout: the store contract, the model, and a store made from a connection string. */
import { describePostgresLayout } from '../../../test/helpers/postgres-store-suites.js'

await describePostgresLayout('postgres', {}, 'idemkey')
