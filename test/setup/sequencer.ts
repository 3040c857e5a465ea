import { relative } from 'node:path'
import { BaseSequencer, type TestSpecification } from 'vitest/node'

/**
 * The files that take longest (seconds, on CI's idle 2-core machine, 2026-11-28), longest first. They
 * wait on servers, child processes and installs more than on the CPU, and two run at a time: started
 * last, as vitest's own order put them on a fresh clone (it has no durations yet, so it goes by file
 * size), the slowest ran alone at the end while the other worker sat idle, and the suite took 899 s of
 * wall time for 1,356 s of files. Longest first, the two workers end together. Only the order depends
 * on this list: a file missing from it, or one that got faster, runs all the same.
 */
const SLOWEST = [
  'test/postgres-failover.test.ts', // 200 on a loaded machine (2026-11-29): 28 kill -9 failovers of a primary and standby
  'test/package-consumer.test.ts', // 151: npm pack, installs and type-checks a consumer project
  'test/messaging-faults.test.ts', // 145: brokers and workers killed mid-flight
  'test/redis-failover.test.ts', // about 105 on a loaded dev machine, 2026-11-29: 26 Sentinel failovers under load
  'src/backends/postgres/postgres-store-partitioned.test.ts', // 67
  'test/docs-site.test.ts', // about 60 (estimated: 160 on a loaded machine): builds the documentation site
  'test/docs-quick-starts.test.ts', // about 100 on a loaded machine (2026-11-29): runs the 24 quick starts
  'test/cli-operator.test.ts', // 62
  'test/cli-demo.test.ts', // 58
  'test/faults.test.ts', // 55
  'test/doctor-sql.test.ts', // about 45 on a loaded machine: throwaway PostgreSQL and MariaDB servers
  'test/clock-skew.test.ts', // 39
  'test/package-managers.test.ts', // 38
  'test/tcp-faults.test.ts', // 34
  'test/redis-cluster.test.ts', // 25
  'src/backends/postgres/postgres-store.test.ts', // 24
  'src/backends/mysql/mysql-store.test.ts', // 23
  'test/pg-boss.test.ts', // 23
  'test/sqlite-processes.test.ts', // 23
  'test/docs-examples.test.ts', // 22
]

/**
 * Vitest's order (files that failed last time first, then the longest by its record of durations, or the
 * largest when it has none), with the known slowest files moved to the front in the order above.
 */
export class SlowestFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const ordered = await super.sort(files)
    const root = this.ctx.config.root
    const rank = (file: TestSpecification) => {
      const at = SLOWEST.indexOf(relative(root, file.moduleId).split('\\').join('/'))
      return at === -1 ? SLOWEST.length : at
    }
    // Array.prototype.sort is stable: the files of equal rank keep vitest's order.
    return ordered.sort((a, b) => rank(a) - rank(b))
  }
}
