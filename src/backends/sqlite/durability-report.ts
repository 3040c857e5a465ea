/**
 * What a SQLite file can lose of idemkey's records (`idemkey doctor sqlite:…`): its journal mode (kept
 * in the file) and the `synchronous` level the store's connection uses (per connection: SqliteStore
 * sets NORMAL unless given `synchronous: 'full'`).
 */
import { type DurabilityReport, finding } from '../../core/durability.js'

/** Options of {@link sqliteDurabilityReport}. */
export interface SqliteDurabilityOptions {
  /** The app's SqliteStore `synchronous` (or the PRAGMA its own connection sets). @default 'normal' (SqliteStore's) */
  synchronous?: 'off' | 'normal' | 'full' | 'extra'
}

/** Says, from the file's journal mode and the connection's synchronous level, what each failure loses. */
export function sqliteDurabilityReport(journalMode: string, options: SqliteDurabilityOptions = {}): DurabilityReport {
  const mode = journalMode.toLowerCase()
  const sync = options.synchronous ?? 'normal'
  const evidence = [`journal_mode=${mode}`, `synchronous=${sync}${options.synchronous === undefined ? " (SqliteStore's default)" : ''}`]
  const notes = [
    "synchronous is set by each connection, not kept in the file: the doctor takes the app's from --synchronous (SqliteStore's default: normal)",
  ]
  if (mode !== 'wal') notes.push(`journal_mode=${mode}: SqliteStore switches the file to WAL when it opens it`)
  const unjournaled = mode === 'off' || mode === 'memory'
  const findings = [
    unjournaled
      ? finding(
          'process-crash',
          'loses',
          `a crash during a write can corrupt the file (journal_mode=${mode} keeps no rollback journal on disk)`,
          'PRAGMA journal_mode = WAL',
          evidence,
        )
      : finding('process-crash', 'safe', 'nothing: each commit is in the file or its journal before it returns', '', evidence),
    machineCrash(mode, sync, unjournaled, evidence),
    finding(
      'failover',
      'n/a',
      'one file on one machine: there is no replica to promote (file copies such as Litestream are asynchronous)',
      '',
      [],
    ),
    finding('eviction', 'n/a', 'SQLite never evicts rows', '', []),
    finding('expiry', 'safe', 'records leave only after their ttl: idemkey gc deletes expired rows', '', []),
  ]
  return { store: 'sqlite', findings, unchecked: [], notes }
}

function machineCrash(mode: string, sync: string, unjournaled: boolean, evidence: string[]) {
  const fix = "SqliteStore { synchronous: 'full' } (PRAGMA synchronous = FULL)"
  if (unjournaled)
    return finding(
      'machine-crash',
      'loses',
      `any commit, and the file may be corrupt (journal_mode=${mode})`,
      'PRAGMA journal_mode = WAL',
      evidence,
    )
  if (sync === 'off')
    return finding(
      'machine-crash',
      'loses',
      'any commit the OS had not written, and the file may be corrupt (synchronous = OFF)',
      fix,
      evidence,
    )
  if (sync === 'normal') {
    return mode === 'wal'
      ? finding(
          'machine-crash',
          'loses',
          'the last commits: in WAL mode with synchronous = NORMAL the WAL is fsynced at checkpoints, not at each commit',
          fix,
          evidence,
        )
      : finding(
          'machine-crash',
          'loses',
          'a power loss at the wrong moment can corrupt the file (rollback journal with synchronous = NORMAL)',
          fix,
          evidence,
        )
  }
  return finding('machine-crash', 'safe', 'nothing: each commit is fsynced before it returns', '', evidence)
}
