/**
 * What a PostgreSQL server's configuration can lose of idemkey's records (`idemkey doctor postgres://…`,
 * the operator page, `/readyz`): `fsync`, `full_page_writes`, `synchronous_commit`,
 * `synchronous_standby_names` and the standbys streaming from it, idemkey's table and whether its
 * retention can run, `wal_level` for the CDC relay. Read only.
 */
import { type DurabilityReport, finding, readSetting, type Setting } from '../../core/durability.js'
import { tableLayout } from './partitions.js'
import type { PgQueryable } from './pool.js'

/** Where the store keeps its records (the store URL's `?schema=` and `?table=`). */
export interface PostgresDurabilityOptions {
  schema?: string
  table?: string
}

const SETTINGS = ['fsync', 'full_page_writes', 'synchronous_commit', 'synchronous_standby_names', 'wal_level', 'wal_writer_delay']

/** Reads the server's settings and says, per failure, what idemkey's records can lose. */
export async function postgresDurabilityReport(db: PgQueryable, options: PostgresDurabilityOptions = {}): Promise<DurabilityReport> {
  const unchecked: string[] = []
  const notes: string[] = []
  const schema = options.schema ?? 'public'
  const table = options.table ?? 'idemkey_records'
  // pg_settings lists only what this role may read: a setting missing from it is unchecked, never assumed.
  const visible = new Map<string, string>()
  let settingsError: string | undefined
  try {
    const rows = await db.query('SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1)', [SETTINGS])
    for (const row of rows.rows as Array<{ name: string; setting: string; unit: string | null }>) {
      visible.set(row.name, row.unit === 'ms' ? `${row.setting}ms` : row.setting)
    }
  } catch (error) {
    settingsError = (error as Error).message
  }
  const setting = (name: string) =>
    readSetting(
      name,
      async () => {
        if (settingsError !== undefined) throw new Error(`pg_settings: ${settingsError}`)
        const value = visible.get(name)
        if (value === undefined) throw new Error('not visible to this role (grant it pg_read_all_settings)')
        return value
      },
      unchecked,
    )
  const fsync = await setting('fsync')
  const fullPages = await setting('full_page_writes')
  const commit = await setting('synchronous_commit')
  const standbyNames = await setting('synchronous_standby_names')
  const walLevel = await setting('wal_level')
  const writerDelay = await setting('wal_writer_delay')
  const version = await readSetting('version', async () => one(db, 'SHOW server_version'), unchecked)
  const recovery = await readSetting('pg_is_in_recovery()', async () => one(db, 'SELECT pg_is_in_recovery()::text'), unchecked)
  const senders = await readSetting(
    'pg_stat_replication',
    // Standbys only: a base backup in progress and a logical walsender (a CDC relay's slot) are no replica to promote.
    async () =>
      one(
        db,
        `SELECT count(*)::text FROM pg_stat_replication r WHERE coalesce(r.state, 'streaming') <> 'backup'
         AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical')`,
      ),
    unchecked,
  )
  if (recovery.ok && recovery.value === 'true') notes.push('this server is a standby (in recovery): point the doctor at the primary')
  if (walLevel.ok && walLevel.value !== 'logical') {
    notes.push(`wal_level=${walLevel.value}: the CDC relay (idemkey relay) needs wal_level = logical (a restart)`)
  }
  notes.push(
    "synchronous_commit is the doctor's session value (the server's, unless a role or database sets its own): ALTER ROLE app SET synchronous_commit = … changes it for the app alone",
  )

  const delay = writerDelay.ok ? writerDelay.value : '200ms'
  const asyncLoss = `the commits of the last ~3 × wal_writer_delay (${delay}): synchronous_commit = off acknowledges before the WAL is flushed`
  const findings = [
    !commit.ok
      ? unread('process-crash', commit)
      : commit.value === 'off'
        ? finding('process-crash', 'loses', asyncLoss, 'synchronous_commit = on', ev('synchronous_commit', commit))
        : finding(
            'process-crash',
            'safe',
            'nothing: each commit is in the WAL before it is acknowledged',
            '',
            ev('synchronous_commit', commit),
          ),
    machineCrash(fsync, fullPages, commit, asyncLoss),
    failover(commit, standbyNames, senders),
    finding('eviction', 'n/a', 'PostgreSQL never evicts rows', '', []),
    await expiry(db, schema, table, notes, unchecked),
  ]
  return { store: 'postgres', ...(version.ok ? { server: `PostgreSQL ${version.value}` } : {}), findings, unchecked, notes }
}

async function one(db: PgQueryable, sql: string): Promise<string | undefined> {
  const result = await db.query(sql)
  const row = result.rows[0] as Record<string, unknown> | undefined
  const value = row === undefined ? undefined : Object.values(row)[0]
  return value === undefined || value === null ? undefined : String(value)
}

const ev = (name: string, s: Setting) => (s.ok ? [`${name}=${s.value === '' ? "''" : s.value}`] : [])

function unread(failure: 'process-crash' | 'machine-crash' | 'failover' | 'expiry', ...settings: Setting[]) {
  return finding(failure, 'unchecked', `not checked: ${settings.flatMap((s) => (s.ok ? [] : [s.reason])).join('; ')}`)
}

function machineCrash(fsync: Setting, fullPages: Setting, commit: Setting, asyncLoss: string) {
  if (!fsync.ok || !fullPages.ok || !commit.ok) return unread('machine-crash', fsync, fullPages, commit)
  const evidence = [...ev('fsync', fsync), ...ev('full_page_writes', fullPages), ...ev('synchronous_commit', commit)]
  if (fsync.value === 'off') {
    return finding(
      'machine-crash',
      'loses',
      'any commit, and the database may be corrupt: fsync = off never forces the WAL to disk',
      'fsync = on',
      evidence,
    )
  }
  if (fullPages.value === 'off') {
    return finding(
      'machine-crash',
      'loses',
      'pages torn by the crash: recovery may fail or lose rows (full_page_writes = off)',
      'full_page_writes = on',
      evidence,
    )
  }
  if (commit.value === 'off') return finding('machine-crash', 'loses', asyncLoss, 'synchronous_commit = on', evidence)
  return finding('machine-crash', 'safe', 'nothing: the WAL is flushed to disk before each commit is acknowledged', '', evidence)
}

function failover(commit: Setting, standbyNames: Setting, senders: Setting) {
  if (!commit.ok || !standbyNames.ok) return unread('failover', commit, standbyNames)
  const evidence = [
    ...ev('synchronous_standby_names', standbyNames),
    ...ev('synchronous_commit', commit),
    ...(senders.ok ? [`standbys=${senders.value}`] : []),
  ]
  const waits = ['on', 'remote_apply', 'remote_write'].includes(commit.value)
  if (standbyNames.value.trim() !== '' && waits) {
    return finding(
      'failover',
      'safe',
      `nothing acknowledged: each commit waits for a synchronous standby (${commit.value === 'remote_apply' ? 'applied' : commit.value === 'remote_write' ? 'received' : 'flushed'} there); promote only a synchronous one`,
      '',
      evidence,
    )
  }
  if (!senders.ok) return unread('failover', senders)
  if (Number(senders.value) === 0) {
    return finding(
      'failover',
      'n/a',
      'no standby streams from this server: there is nothing to promote (managed storage-level replicas are not visible here)',
      '',
      evidence,
    )
  }
  const why =
    standbyNames.value.trim() === ''
      ? 'the standbys are asynchronous (synchronous_standby_names is empty)'
      : `synchronous_commit = ${commit.value} does not wait for the synchronous standby`
  return finding(
    'failover',
    'loses',
    `the commits acknowledged just before the primary died that had not reached the promoted standby: ${why}`,
    "synchronous_standby_names = 'FIRST 1 (standby names)' (or ANY 1) with synchronous_commit = on (or remote_apply)",
    evidence,
  )
}

async function expiry(db: PgQueryable, schema: string, table: string, notes: string[], unchecked: string[]) {
  const name = `${schema}.${table}`
  try {
    const layout = await tableLayout(db, schema, table)
    if (layout === undefined) {
      notes.push(`${name} does not exist yet: idemkey migrate --store … creates it`)
      return finding('expiry', 'safe', `records leave only after their ttl (${name} is not created yet)`, '', [])
    }
    const rights = await db.query(
      `SELECT has_table_privilege(c.oid, 'DELETE') AS can_delete, pg_has_role(c.relowner, 'USAGE') AS owns
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
      [schema, table],
    )
    const row = rights.rows[0] as { can_delete: boolean; owns: boolean } | undefined
    const retention = layout.layout === 'partitioned' ? 'drops expired partitions' : 'deletes expired rows'
    const canRun = layout.layout === 'partitioned' ? row?.owns === true : row?.can_delete === true
    if (!canRun) {
      notes.push(
        `idemkey gc ${retention} of ${name}, which this role cannot (${layout.layout === 'partitioned' ? 'it does not own the table' : 'no DELETE privilege'}): the table only grows`,
      )
    }
    return finding(
      'expiry',
      'safe',
      `records leave only after their ttl: idemkey gc ${retention} (${layout.layout} layout${canRun ? '' : '; this role cannot run it'})`,
      '',
      [`layout=${layout.layout}`, `retention=${canRun ? 'can run' : 'cannot run as this role'}`],
    )
  } catch (error) {
    const reason = `${name}: ${(error as Error).message}`
    unchecked.push(reason)
    return finding('expiry', 'unchecked', `not checked: ${reason}`)
  }
}
