/**
 * PostgresStore on the partitioned layout, the same suites as postgres-store.test.ts. 2 s partitions, so a
 * run crosses many partition boundaries and outruns the partitions `migrate()` made ahead: inserts then
 * create theirs.
 */
import { describePostgresLayout } from '../../../test/helpers/postgres-store-suites.js'

await describePostgresLayout('postgres (partitioned, 2 s partitions)', { layout: 'partitioned', partitionInterval: '2s' }, 'h3_part')
