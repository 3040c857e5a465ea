/**
 * What a MySQL or MariaDB server's configuration can lose of idemkey's records (`idemkey doctor
 * mysql://…`): `innodb_flush_log_at_trx_commit`, `sync_binlog`, replicas, semi-synchronous
 * replication and Galera. Session reads only (`SELECT @@…`, `SHOW …`): nothing is changed.
 */
import { type DurabilityReport, finding, readSetting, type Setting } from '../../core/durability.js'

/** Runs one statement and returns its rows (mysql2's `(await pool.query(sql))[0]`). */
export type MySqlRows = (sql: string) => Promise<Array<Record<string, unknown>>>

/** Reads the server's settings and says, per failure, what idemkey's records can lose. */
export async function mysqlDurabilityReport(rows: MySqlRows): Promise<DurabilityReport> {
  const unchecked: string[] = []
  const notes: string[] = []
  const variable = (name: string) =>
    readSetting(
      name,
      async () => {
        const found = await rows(`SHOW GLOBAL VARIABLES LIKE '${name}'`)
        const value = found[0]?.Value ?? found[0]?.value
        return value === undefined || value === null ? undefined : String(value)
      },
      unchecked,
    )
  const flush = await variable('innodb_flush_log_at_trx_commit')
  const syncBinlog = await variable('sync_binlog')
  const logBin = await variable('log_bin')
  const version = await variable('version')
  const wsrep = await optional(rows, 'wsrep_on')
  const semiSync = (await optional(rows, 'rpl_semi_sync_master_enabled')) ?? (await optional(rows, 'rpl_semi_sync_source_enabled'))
  const waitPoint = (await optional(rows, 'rpl_semi_sync_master_wait_point')) ?? (await optional(rows, 'rpl_semi_sync_source_wait_point'))
  const replicas = await readSetting(
    'replicas (binlog dump threads)',
    async () => {
      const grants = (await rows('SHOW GRANTS')).map((row) => String(Object.values(row)[0]))
      if (!grants.some((g) => /\b(ALL PRIVILEGES|PROCESS)\b/.test(g))) {
        throw new Error('counting them needs the PROCESS privilege')
      }
      const found = await rows("SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'")
      return String(found[0]?.n ?? 0)
    },
    unchecked,
  )
  const server = version.ok ? `${/mariadb/i.test(version.value) ? 'MariaDB' : 'MySQL'} ${version.value}` : undefined

  const ev = (name: string, s: Setting) => (s.ok ? [`${name}=${s.value}`] : [])
  const unread = (failure: 'process-crash' | 'machine-crash' | 'failover', ...settings: Setting[]) =>
    finding(failure, 'unchecked', `not checked: ${settings.flatMap((s) => (s.ok ? [] : [s.reason])).join('; ')}`)
  const flushEv = ev('innodb_flush_log_at_trx_commit', flush)
  const second = 'the commits of about the last second: the redo log is flushed once a second'
  const findings = [
    !flush.ok
      ? unread('process-crash', flush)
      : flush.value === '0'
        ? finding('process-crash', 'loses', second, 'innodb_flush_log_at_trx_commit = 1', flushEv)
        : finding('process-crash', 'safe', 'nothing: each commit is written to the redo log before it is acknowledged', '', flushEv),
    !flush.ok
      ? unread('machine-crash', flush)
      : flush.value === '1'
        ? finding('machine-crash', 'safe', 'nothing: the redo log is flushed to disk at each commit', '', flushEv)
        : finding('machine-crash', 'loses', second, 'innodb_flush_log_at_trx_commit = 1', flushEv),
    failover(),
    finding('eviction', 'n/a', 'InnoDB never evicts rows', '', []),
    finding('expiry', 'safe', 'records leave only after their ttl: idemkey gc deletes expired rows', '', []),
  ]
  return { store: 'mysql', ...(server ? { server } : {}), findings, unchecked, notes }

  function failover() {
    const evidence = [...ev('log_bin', logBin), ...ev('sync_binlog', syncBinlog), ...(replicas.ok ? [`replicas=${replicas.value}`] : [])]
    if (wsrep === 'ON') {
      return finding('failover', 'safe', 'nothing acknowledged: Galera certifies each commit on every node before it returns', '', [
        ...evidence,
        'wsrep_on=ON',
      ])
    }
    if (!replicas.ok) return unread('failover', replicas)
    if (Number(replicas.value) === 0) {
      return finding('failover', 'n/a', 'no replica reads the binlog of this server: there is nothing to promote', '', evidence)
    }
    if (!syncBinlog.ok) return unread('failover', syncBinlog)
    const semi = semiSync === 'ON' && (waitPoint === undefined || waitPoint === 'AFTER_SYNC')
    if (semi && syncBinlog.value === '1') {
      return finding(
        'failover',
        'safe',
        'nothing acknowledged: semi-synchronous replication (AFTER_SYNC) waits for a replica before the commit returns',
        '',
        [...evidence, 'semi-sync=ON'],
      )
    }
    return finding(
      'failover',
      'loses',
      `the commits acknowledged before the replica received them: replication is ${semi ? 'semi-synchronous, but sync_binlog is not 1' : 'asynchronous'}`,
      'rpl_semi_sync_master_enabled = ON (MySQL: rpl_semi_sync_source_enabled) with wait point AFTER_SYNC, and sync_binlog = 1',
      evidence,
    )
  }
}

/** A variable that exists only with a plugin or a build (Galera, semi-sync): undefined when absent or unreadable. */
async function optional(rows: MySqlRows, name: string): Promise<string | undefined> {
  try {
    const found = await rows(`SHOW GLOBAL VARIABLES LIKE '${name}'`)
    const value = found[0]?.Value ?? found[0]?.value
    return value === undefined || value === null ? undefined : String(value)
  } catch {
    return undefined
  }
}
