/**
 * `idemkey doctor` on the SQL stores, against deliberately weak and strong configurations: a throwaway
 * PostgreSQL (fsync and synchronous_commit off, then on, then a synchronous standby named; a role that
 * may not read pg_settings), a throwaway mariadbd (innodb_flush_log_at_trx_commit 2 and 0; a user without
 * PROCESS), the shared MariaDB read only, and SQLite files in WAL and rollback mode.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process'
import { chownSync, existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { promisify } from 'node:util'
import mysql from 'mysql2/promise'
import pg from 'pg'
import { PostgresStore } from '../src/backends/postgres/index.js'
import { type DoctorResult, runDoctor } from '../src/cli/commands/doctor.js'
import { CliError } from '../src/cli/run.js'
import { canStartThrowaway, startThrowaway, type ThrowawayServer } from './fixtures/postgres/throwaway-server.js'
import { freePort, isCI, serviceSkipReason } from './helpers/services.js'

const run = promisify(execFile)
const verdicts = (result: DoctorResult) => Object.fromEntries(result.report.findings.map((f) => [f.failure, f.verdict]))
const row = (result: DoctorResult, failure: string) => result.report.findings.find((f) => f.failure === failure)

function skip(name: string, reason: string | undefined): string | undefined {
  if (reason && isCI()) throw new Error(`CI=${process.env.CI} and ${reason}`)
  if (reason) console.warn(`\n!!! SKIPPED (idemkey doctor, ${name}): ${reason}\n`)
  return reason
}

describe('idemkey doctor on SQLite files', () => {
  // Made in beforeAll: a run that filters these tests out leaves no directory behind.
  let dir: string
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'idemkey-doctor-sqlite-'))
  })
  afterAll(() => rmSync(dir, { recursive: true, force: true }))
  const file = (name: string, mode: string) => {
    const path = join(dir, name)
    const db = new DatabaseSync(path)
    db.exec(`PRAGMA journal_mode = ${mode}; CREATE TABLE t (x)`)
    db.close()
    return path
  }

  it("WAL with SqliteStore's default synchronous=NORMAL loses the last commits to a machine crash: exit 1; --synchronous full passes", async () => {
    const path = file('wal.db', 'WAL')
    const weak = await runDoctor(`sqlite:${path}`)
    expect(verdicts(weak)).toEqual({ 'process-crash': 'safe', 'machine-crash': 'loses', failover: 'n/a', eviction: 'n/a', expiry: 'safe' })
    expect(row(weak, 'machine-crash')).toMatchObject({
      fix: "SqliteStore { synchronous: 'full' } (PRAGMA synchronous = FULL)",
      evidence: ['journal_mode=wal', "synchronous=normal (SqliteStore's default)"],
    })
    expect(weak.exitCode).toBe(1)
    expect(weak.text).toMatch(/^machine-crash +LOSES +the last commits: in WAL mode with synchronous = NORMAL/m)
    const strong = await runDoctor(`sqlite:${path}`, { synchronous: 'full' })
    expect(row(strong, 'machine-crash')).toMatchObject({ verdict: 'safe', evidence: ['journal_mode=wal', 'synchronous=full'] })
    expect(strong.exitCode).toBe(0)
    expect(strong.json).toMatchObject({ store: 'sqlite', status: 'safe', exitCode: 0 })
  })

  it('a rollback journal with NORMAL can be corrupted by a power loss; with FULL it is safe, and the note says the store switches to WAL', async () => {
    const path = file('delete.db', 'DELETE')
    const normal = await runDoctor(`sqlite:${path}`, { synchronous: 'normal' })
    expect(row(normal, 'machine-crash')?.loses).toMatch(/can corrupt the file \(rollback journal with synchronous = NORMAL\)/)
    expect(normal.exitCode).toBe(1)
    const off = await runDoctor(`sqlite:${path}`, { synchronous: 'off' })
    expect(row(off, 'machine-crash')?.loses).toMatch(/synchronous = OFF/)
    const full = await runDoctor(`sqlite:${path}`, { synchronous: 'full' })
    expect(full.exitCode).toBe(0)
    expect(full.report.notes).toContain('journal_mode=delete: SqliteStore switches the file to WAL when it opens it')
  })

  it('a file that does not exist is bad input (exit 2), not a store created empty', async () => {
    const missing = join(dir, 'nope.db')
    const refused = await runDoctor(`sqlite:${missing}`).catch((error: unknown) => error)
    expect(refused).toBeInstanceOf(CliError)
    expect((refused as CliError).exitCode).toBe(2)
    expect(existsSync(missing)).toBe(false)
  })
})

const pgSkip = skip(
  'PostgreSQL',
  canStartThrowaway() ? undefined : 'the PostgreSQL 15 binaries (initdb, pg_ctl) are not in /usr/lib/postgresql/15/bin',
)

describe.skipIf(pgSkip !== undefined)('idemkey doctor on a throwaway PostgreSQL', () => {
  // Settings given at start win over ALTER SYSTEM: the weak server is its own (the fixture starts with fsync=off).
  let weak: ThrowawayServer
  let server: ThrowawayServer
  let admin: pg.Client
  beforeAll(async () => {
    ;[weak, server] = await Promise.all([
      startThrowaway({ settings: { synchronous_commit: 'off' } }),
      startThrowaway({ settings: { fsync: 'on' } }),
    ])
    admin = new pg.Client({ connectionString: server.url })
    await admin.connect()
  }, 90_000)
  afterAll(async () => {
    await admin?.end().catch(() => {})
    await weak?.destroy()
    await server?.destroy()
  })
  const set = async (settings: Record<string, string>) => {
    for (const [name, value] of Object.entries(settings)) await admin.query(`ALTER SYSTEM SET ${name} = '${value}'`)
    await admin.query('SELECT pg_reload_conf()')
    await new Promise((resolve) => setTimeout(resolve, 300))
  }

  it('fsync=off and synchronous_commit=off lose commits to a process crash and a machine crash: exit 1', async () => {
    const result = await runDoctor(weak.url)
    expect(verdicts(result)).toEqual({
      'process-crash': 'loses',
      'machine-crash': 'loses',
      failover: 'n/a',
      eviction: 'n/a',
      expiry: 'safe',
    })
    expect(row(result, 'process-crash')).toMatchObject({ fix: 'synchronous_commit = on', evidence: ['synchronous_commit=off'] })
    expect(row(result, 'process-crash')?.loses).toContain('~3 × wal_writer_delay (200ms)')
    expect(row(result, 'machine-crash')).toMatchObject({
      fix: 'fsync = on',
      evidence: ['fsync=off', 'full_page_writes=on', 'synchronous_commit=off'],
    })
    expect(result.exitCode).toBe(1)
    expect(result.text).toMatch(/^machine-crash +LOSES +any commit, and the database may be corrupt/m)
    expect(result.json).toMatchObject({ store: 'postgres', status: 'unsafe', losing: ['process-crash', 'machine-crash'] })
  })

  it('fsync and synchronous_commit on: exit 0; full_page_writes off alone fails it again', async () => {
    const strong = await runDoctor(server.url)
    expect(verdicts(strong)).toEqual({ 'process-crash': 'safe', 'machine-crash': 'safe', failover: 'n/a', eviction: 'n/a', expiry: 'safe' })
    expect(strong.exitCode).toBe(0)
    expect(strong.report.notes[0]).toMatch(/^wal_level=replica: the CDC relay \(idemkey relay\) needs wal_level = logical/)
    await set({ full_page_writes: 'off' })
    const torn = await runDoctor(server.url)
    expect(row(torn, 'machine-crash')).toMatchObject({ verdict: 'loses', fix: 'full_page_writes = on' })
    expect(torn.exitCode).toBe(1)
    await set({ full_page_writes: 'on' })
  })

  it('synchronous_standby_names with synchronous_commit on makes failover safe; with local and no standby streaming, nothing is to promote', async () => {
    await set({ synchronous_standby_names: 'FIRST 1 (s1)' })
    const sync = await runDoctor(server.url)
    expect(row(sync, 'failover')).toMatchObject({
      verdict: 'safe',
      evidence: ['synchronous_standby_names=FIRST 1 (s1)', 'synchronous_commit=on', 'standbys=0'],
    })
    await set({ synchronous_commit: 'local' })
    // No standby streams: nothing to promote, whatever the names say.
    const local = await runDoctor(server.url)
    expect(row(local, 'failover')).toMatchObject({ verdict: 'n/a' })
    await set({ synchronous_standby_names: '', synchronous_commit: 'on' })
  })

  it("reads idemkey's table layout and whether this role can run its retention", async () => {
    const store = new PostgresStore({ connectionString: server.url })
    await store.migrate()
    await store.close()
    const owner = await runDoctor(server.url)
    expect(row(owner, 'expiry')).toMatchObject({ verdict: 'safe', evidence: ['layout=plain', 'retention=can run'] })
    await admin.query('CREATE ROLE doctor_reader LOGIN; GRANT SELECT ON idemkey_records TO doctor_reader')
    const reader = await runDoctor(server.url.replace('postgres@', 'doctor_reader@'))
    expect(row(reader, 'expiry')?.evidence).toEqual(['layout=plain', 'retention=cannot run as this role'])
    expect(reader.report.notes).toContain(
      'idemkey gc deletes expired rows of public.idemkey_records, which this role cannot (no DELETE privilege): the table only grows',
    )
  })

  it('a role that may not read pg_settings gets those rows unchecked, named, and exit 3', async () => {
    await admin.query('REVOKE SELECT ON pg_settings FROM PUBLIC')
    const result = await runDoctor(server.url.replace('postgres@', 'doctor_reader@'))
    expect(verdicts(result)).toMatchObject({ 'process-crash': 'unchecked', 'machine-crash': 'unchecked', failover: 'unchecked' })
    expect(result.report.unchecked[0]).toMatch(/^fsync: pg_settings: permission denied for view pg_settings$/)
    expect(result.exitCode).toBe(3)
    expect(result.text).toContain('NOT PROVEN: process-crash, machine-crash, failover could not be checked')
    await admin.query('GRANT SELECT ON pg_settings TO PUBLIC')
  })

  it('an asynchronous streaming standby makes failover lose commits; synchronous_standby_names closes it', async () => {
    const BIN = process.env.PG_BIN ?? '/usr/lib/postgresql/15/bin'
    const asRoot = process.getuid?.() === 0
    const cmd = (file: string, args: string[]) =>
      asRoot ? run('runuser', ['-u', 'postgres', '--', join(BIN, file), ...args]) : run(join(BIN, file), args)
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-doctor-standby-'))
    if (asRoot) {
      const { stdout: uid } = await run('id', ['-u', 'postgres'])
      const { stdout: gid } = await run('id', ['-g', 'postgres'])
      chownSync(dir, Number(uid.trim()), Number(gid.trim()))
    }
    const data = join(dir, 'data')
    const port = await freePort()
    try {
      await cmd('pg_basebackup', ['-h', '127.0.0.1', '-p', String(server.port), '-U', 'postgres', '-D', data, '-R', '-X', 'stream'])
      await cmd('pg_ctl', [
        '-D',
        data,
        '-o',
        `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1`,
        '-l',
        join(dir, 'log'),
        '-w',
        '-t',
        '30',
        'start',
      ])
      for (let i = 0; i < 100; i++) {
        const { rows } = await admin.query("SELECT count(*)::int AS n FROM pg_stat_replication WHERE state = 'streaming'")
        if ((rows[0] as { n: number }).n === 1) break
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
      const async = await runDoctor(server.url)
      expect(row(async, 'failover')).toMatchObject({
        verdict: 'loses',
        evidence: ["synchronous_standby_names=''", 'synchronous_commit=on', 'standbys=1'],
      })
      expect(row(async, 'failover')?.loses).toContain('the standbys are asynchronous (synchronous_standby_names is empty)')
      expect(row(async, 'failover')?.fix).toMatch(/^synchronous_standby_names = 'FIRST 1/)
      expect(async.exitCode).toBe(1)
      expect((await runDoctor(server.url, { accept: ['failover'] })).exitCode).toBe(0)

      await set({ synchronous_standby_names: '*' })
      const sync = await runDoctor(server.url)
      expect(row(sync, 'failover')).toMatchObject({
        verdict: 'safe',
        evidence: ['synchronous_standby_names=*', 'synchronous_commit=on', 'standbys=1'],
      })
      expect(sync.exitCode).toBe(0)

      const standby = await runDoctor(`postgres://postgres@127.0.0.1:${port}/postgres`)
      expect(standby.report.notes).toContain('this server is a standby (in recovery): point the doctor at the primary')
    } finally {
      await set({ synchronous_standby_names: '' })
      await cmd('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop']).catch(() => {})
      rmSync(dir, { recursive: true, force: true })
    }
  }, 60_000)

  it('a server that does not answer: every row unchecked, exit 3', async () => {
    const port = await freePort()
    const result = await runDoctor(`postgres://postgres@127.0.0.1:${port}/postgres`, { timeout: 2_000 })
    expect(new Set(Object.values(verdicts(result)))).toEqual(new Set(['unchecked']))
    expect(result.report.unchecked[0]).toMatch(/^the server: could not reach the server \(.*ECONNREFUSED/)
    expect(result.exitCode).toBe(3)
  })
})

const MARIADBD = '/usr/sbin/mariadbd'
const mariaSkip = skip(
  'MariaDB throwaway',
  existsSync(MARIADBD) && existsSync('/usr/bin/mariadb-install-db') ? undefined : 'mariadbd and mariadb-install-db are not installed',
)

describe.skipIf(mariaSkip !== undefined)('idemkey doctor on a throwaway mariadbd', () => {
  let dir: string
  let child: ChildProcess | undefined
  let port: number
  const start = async (flush: number) => {
    port = await freePort()
    const args = [
      '--no-defaults',
      `--datadir=${join(dir, 'data')}`,
      `--port=${port}`,
      '--bind-address=127.0.0.1',
      `--socket=${join(dir, 'sock')}`,
      `--pid-file=${join(dir, 'pid')}`,
      `--innodb-flush-log-at-trx-commit=${flush}`,
      '--innodb-buffer-pool-size=16M',
      '--skip-log-bin',
    ]
    const asRoot = process.getuid?.() === 0
    child = asRoot
      ? spawn('runuser', ['-u', 'mysql', '--', MARIADBD, ...args], { stdio: 'ignore' })
      : spawn(MARIADBD, args, { stdio: 'ignore' })
    for (let i = 0; i < 100; i++) {
      const ok = await mysql
        .createConnection({ host: '127.0.0.1', port, user: 'root' })
        .then(async (c) => {
          await c.end()
          return true
        })
        .catch(() => false)
      if (ok) return
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
    throw new Error('the throwaway mariadbd did not answer within 20 s')
  }
  const stop = async () => {
    if (!child) return
    const exited = new Promise((resolve) => child?.once('exit', resolve))
    child.kill('SIGTERM')
    await exited
    child = undefined
  }
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'idemkey-doctor-maria-'))
    const asRoot = process.getuid?.() === 0
    if (asRoot) {
      const { stdout: uid } = await run('id', ['-u', 'mysql'])
      const { stdout: gid } = await run('id', ['-g', 'mysql'])
      chownSync(dir, Number(uid.trim()), Number(gid.trim()))
    }
    await run('mariadb-install-db', [
      '--no-defaults',
      `--datadir=${join(dir, 'data')}`,
      ...(asRoot ? ['--user=mysql'] : []),
      '--auth-root-authentication-method=normal',
      '--skip-test-db',
    ])
  }, 60_000)
  afterAll(async () => {
    await stop()
    rmSync(dir, { recursive: true, force: true })
  })

  it('innodb_flush_log_at_trx_commit=2 loses the last second to a machine crash; 0 to a process crash too: exit 1', async () => {
    await start(2)
    const two = await runDoctor(`mysql://root@127.0.0.1:${port}/mysql`)
    expect(verdicts(two)).toEqual({ 'process-crash': 'safe', 'machine-crash': 'loses', failover: 'n/a', eviction: 'n/a', expiry: 'safe' })
    expect(row(two, 'machine-crash')).toMatchObject({
      fix: 'innodb_flush_log_at_trx_commit = 1',
      evidence: ['innodb_flush_log_at_trx_commit=2'],
    })
    expect(two.report.server).toMatch(/^MariaDB 1\d\./)
    expect(two.exitCode).toBe(1)
    expect((await runDoctor(`mysql://root@127.0.0.1:${port}/mysql`, { accept: ['machine-crash'] })).exitCode).toBe(0)
    await stop()
    await start(0)
    const zero = await runDoctor(`mysql://root@127.0.0.1:${port}/mysql`)
    expect(verdicts(zero)).toMatchObject({ 'process-crash': 'loses', 'machine-crash': 'loses' })
    expect(zero.text).toMatch(/^process-crash +LOSES +the commits of about the last second/m)
    expect(zero.exitCode).toBe(1)
  }, 60_000)

  it('a user without PROCESS cannot count the replicas: failover unchecked, exit 3', async () => {
    await stop()
    await start(1)
    const root = await mysql.createConnection({ host: '127.0.0.1', port, user: 'root' })
    await root.query("CREATE USER 'doctor'@'%' IDENTIFIED BY 'pw'")
    await root.query("GRANT SELECT ON mysql.* TO 'doctor'@'%'")
    await root.end()
    const result = await runDoctor(`mysql://doctor:pw@127.0.0.1:${port}/mysql`)
    expect(verdicts(result)).toEqual({
      'process-crash': 'safe',
      'machine-crash': 'safe',
      failover: 'unchecked',
      eviction: 'n/a',
      expiry: 'safe',
    })
    expect(result.report.unchecked).toEqual(['replicas (binlog dump threads): counting them needs the PROCESS privilege'])
    expect(result.exitCode).toBe(3)
    expect(result.json).toMatchObject({ url: `mysql://doctor:***@127.0.0.1:${port}/mysql`, unproven: ['failover'] })
  }, 60_000)
})

describe('idemkey doctor on the shared MariaDB (session reads only)', async () => {
  const mariaShared = await serviceSkipReason('MariaDB', 3306)
  it.skipIf(mariaShared !== undefined)('says what the server settings read by a plain SELECT mean', async () => {
    const c = await mysql.createConnection({ host: '127.0.0.1', port: 3306, user: 'root', database: 'test' })
    const [rows] = await c.query('SELECT @@innodb_flush_log_at_trx_commit AS flush')
    await c.end()
    const flush = String((rows as Array<{ flush: number }>)[0]?.flush)
    const result = await runDoctor('mysql://root@127.0.0.1:3306/test')
    expect(row(result, 'machine-crash')).toMatchObject({
      verdict: flush === '1' ? 'safe' : 'loses',
      evidence: [`innodb_flush_log_at_trx_commit=${flush}`],
    })
    expect(row(result, 'process-crash')?.verdict).toBe(flush === '0' ? 'loses' : 'safe')
  })
})
