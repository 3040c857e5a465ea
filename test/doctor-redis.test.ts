/**
 * `idemkey doctor redis://…` against throwaway redis-server processes on free loopback ports, each
 * configured weak or strong on purpose (the shared server on 6379 is never touched): the rows, the
 * exit status, the table and the JSON; an ACL user without CONFIG, an unreachable port and an unknown
 * scheme say what was not checked and never pass.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Redis } from 'ioredis'
import { type DoctorResult, runDoctor } from '../src/cli/commands/doctor.js'
import { CliError } from '../src/cli/run.js'
import { runNode } from './helpers/cli.js'
import { freePort, isCI, portOpen } from './helpers/services.js'

const reason =
  spawnSync('redis-server', ['--version']).status === 0 ? undefined : 'redis-server is not on the PATH (apt-get install redis-server)'
if (reason && isCI()) throw new Error(`CI=${process.env.CI} and ${reason}`)
if (reason) console.warn(`\n!!! SKIPPED (idemkey doctor, Redis): ${reason}\n`)

const ROOT = join(import.meta.dirname, '..')
const servers: Array<{ child: ChildProcess; dir: string }> = []

/** A redis-server of its own on a free port, started with `args`; stopped in afterAll. */
async function redisServer(args: string[]): Promise<{ url: string; port: number; admin: Redis }> {
  const port = await freePort()
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-doctor-redis-'))
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', ...args], {
    stdio: 'ignore',
  })
  servers.push({ child, dir })
  for (let i = 0; i < 100 && !(await portOpen(port)); i++) await new Promise((resolve) => setTimeout(resolve, 50))
  const admin = new Redis({ port, host: '127.0.0.1', lazyConnect: true })
  await admin.connect()
  return { url: `redis://127.0.0.1:${port}`, port, admin }
}

const row = (result: DoctorResult, failure: string) => result.report.findings.find((f) => f.failure === failure)
const verdicts = (result: DoctorResult) => Object.fromEntries(result.report.findings.map((f) => [f.failure, f.verdict]))

describe.skipIf(reason !== undefined)('idemkey doctor on Redis', () => {
  const admins: Redis[] = []
  afterAll(async () => {
    for (const admin of admins) admin.disconnect()
    for (const { child, dir } of servers) {
      child.kill('SIGKILL')
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it('a server without AOF and with allkeys-lru loses records to a process crash, a machine crash and eviction: exit 1', async () => {
    const weak = await redisServer(['--appendonly', 'no', '--maxmemory', '64mb', '--maxmemory-policy', 'allkeys-lru'])
    admins.push(weak.admin)
    const result = await runDoctor(weak.url)
    expect(verdicts(result)).toEqual({
      'process-crash': 'loses',
      'machine-crash': 'loses',
      failover: 'n/a',
      eviction: 'loses',
      expiry: 'safe',
    })
    expect(row(result, 'process-crash')).toMatchObject({ fix: 'appendonly yes', evidence: ['appendonly=no', 'save=""'] })
    expect(row(result, 'eviction')?.fix).toMatch(/^maxmemory-policy noeviction/)
    expect(row(result, 'eviction')?.evidence).toEqual(['maxmemory=67108864', 'maxmemory-policy=allkeys-lru'])
    expect(result.exitCode).toBe(1)
    expect(result.text).toMatch(/^process-crash +LOSES +every record: no AOF and no RDB snapshots/m)
    expect(result.text).toMatch(/^eviction +LOSES +records before their ttl when memory fills \(allkeys-lru/m)
    expect(result.text).toContain('UNSAFE: a single process-crash, machine-crash, eviction can lose acknowledged records')
    expect(result.json).toMatchObject({
      status: 'unsafe',
      exitCode: 1,
      losing: ['process-crash', 'machine-crash', 'eviction'],
      unproven: [],
    })
  })

  it('volatile-lru evicts too: every idemkey record has a TTL', async () => {
    const volatile = await redisServer([
      '--appendonly',
      'yes',
      '--appendfsync',
      'always',
      '--maxmemory',
      '64mb',
      '--maxmemory-policy',
      'volatile-lru',
    ])
    admins.push(volatile.admin)
    const result = await runDoctor(volatile.url)
    expect(row(result, 'eviction')).toMatchObject({ verdict: 'loses' })
    expect(row(result, 'eviction')?.loses).toContain('with a TTL, which every idemkey record has')
    expect(result.exitCode).toBe(1)
  })

  it('AOF with appendfsync everysec loses the last second to a machine crash only; --accept machine-crash passes it', async () => {
    const everysec = await redisServer([
      '--appendonly',
      'yes',
      '--appendfsync',
      'everysec',
      '--maxmemory',
      '64mb',
      '--maxmemory-policy',
      'noeviction',
    ])
    admins.push(everysec.admin)
    const result = await runDoctor(everysec.url)
    expect(verdicts(result)).toEqual({
      'process-crash': 'safe',
      'machine-crash': 'loses',
      failover: 'n/a',
      eviction: 'safe',
      expiry: 'safe',
    })
    expect(row(result, 'machine-crash')).toMatchObject({ fix: 'appendfsync always', evidence: ['appendonly=yes', 'appendfsync=everysec'] })
    expect(row(result, 'machine-crash')?.loses).toMatch(/^the last second of writes/)
    expect(result.exitCode).toBe(1)
    const accepted = await runDoctor(everysec.url, { accept: ['machine-crash'] })
    expect(accepted.exitCode).toBe(0)
    expect(accepted.text).toMatch(/^machine-crash +LOSES \(accepted\)/m)
    expect(accepted.json).toMatchObject({ status: 'safe', accepted: ['machine-crash'], losing: [] })
  })

  it('AOF fsynced at every write with noeviction and no replica: exit 0, one table, and the same rows in JSON through the CLI', async () => {
    const strong = await redisServer([
      '--appendonly',
      'yes',
      '--appendfsync',
      'always',
      '--maxmemory',
      '64mb',
      '--maxmemory-policy',
      'noeviction',
    ])
    admins.push(strong.admin)
    const result = await runDoctor(strong.url)
    expect(verdicts(result)).toEqual({
      'process-crash': 'safe',
      'machine-crash': 'safe',
      failover: 'n/a',
      eviction: 'safe',
      expiry: 'safe',
    })
    expect(result.exitCode).toBe(0)
    expect(result.text.split('\n')[0]).toMatch(/^redis:\/\/127\.0\.0\.1:\d+: Redis \d+\.\d+\.\d+ \(standalone, master\)$/)
    expect(result.text).toMatch(/^failure +verdict +can lose +closed by +read$/m)
    expect(result.text).toContain('SAFE: no single failure loses an acknowledged record. Exit 0.')

    if (!existsSync(join(ROOT, 'dist/cli/main.js'))) throw new Error('dist/cli/main.js is missing: run `npm run build` first.')
    const cli = await runNode([join(ROOT, 'dist/cli/main.js'), 'doctor', strong.url, '--json'])
    expect(cli.code).toBe(0)
    const json = JSON.parse(cli.stdout) as { findings: unknown[]; status: string }
    expect(json.status).toBe('safe')
    expect(json.findings).toEqual(result.report.findings)
  })

  it('a replica makes failover lose the writes not yet replicated, bounded by min-replicas-to-write; --wait-replicas 1 closes it', async () => {
    const primary = await redisServer([
      '--appendonly',
      'yes',
      '--appendfsync',
      'always',
      '--maxmemory-policy',
      'noeviction',
      '--min-replicas-to-write',
      '1',
      '--min-replicas-max-lag',
      '10',
    ])
    admins.push(primary.admin)
    const replica = await redisServer(['--replicaof', '127.0.0.1', String(primary.port)])
    admins.push(replica.admin)
    for (let i = 0; i < 100 && !/connected_slaves:1/.test(await primary.admin.info('replication')); i++) {
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const result = await runDoctor(primary.url)
    expect(row(result, 'failover')).toMatchObject({
      verdict: 'loses',
      evidence: ['connected_slaves=1', 'min-replicas-to-write=1', 'min-replicas-max-lag=10'],
    })
    expect(row(result, 'failover')?.loses).toContain('at most about 10 s of them')
    expect(row(result, 'failover')?.fix).toMatch(/RedisStore durability option \(WAIT/)
    expect(result.exitCode).toBe(1)
    expect((await runDoctor(primary.url, { accept: ['failover'] })).exitCode).toBe(0)

    const waiting = await runDoctor(primary.url, { waitReplicas: 1 })
    expect(row(waiting, 'failover')).toMatchObject({ verdict: 'safe' })
    expect(waiting.exitCode).toBe(0)
    const tooFew = await runDoctor(primary.url, { waitReplicas: 2 })
    expect(row(tooFew, 'failover')?.loses).toContain('Only 1 replica is connected, fewer than the 2 waited for')
    expect(tooFew.exitCode).toBe(1)

    const onReplica = await runDoctor(replica.url)
    expect(onReplica.report.server).toMatch(/\(standalone, replica\)$/)
    expect(onReplica.report.notes[0]).toMatch(/^this server is a replica: point the doctor at the primary/)
  })

  it('an ACL user without CONFIG gets the rows it could not read as unchecked, named, and exit 3 (never a false safe)', async () => {
    const strong = await redisServer(['--appendonly', 'yes', '--appendfsync', 'always', '--maxmemory-policy', 'noeviction'])
    admins.push(strong.admin)
    await strong.admin.call('ACL', 'SETUSER', 'doctor', 'on', '>secret', '~*', '+@all', '-config')
    const result = await runDoctor(`redis://doctor:secret@127.0.0.1:${strong.port}`)
    expect(verdicts(result)).toEqual({
      'process-crash': 'unchecked',
      'machine-crash': 'unchecked',
      failover: 'n/a',
      eviction: 'unchecked',
      expiry: 'safe',
    })
    expect(result.report.unchecked[0]).toMatch(/^appendonly: NOPERM .*config/i)
    expect(result.exitCode).toBe(3)
    expect(result.text).toContain('Not checked (not proven safe):')
    expect(result.text).toContain('NOT PROVEN: process-crash, machine-crash, eviction could not be checked')
    expect(result.json).toMatchObject({ url: `redis://doctor:***@127.0.0.1:${strong.port}`, status: 'unproven', exitCode: 3 })
    expect(JSON.stringify(result.json)).not.toContain('secret')
  })

  it('a port nothing listens on: every row unchecked with the connection error, exit 3', async () => {
    const port = await freePort()
    const result = await runDoctor(`redis://127.0.0.1:${port}`, { timeout: 2_000 })
    expect(new Set(Object.values(verdicts(result)))).toEqual(new Set(['unchecked']))
    expect(result.report.unchecked).toEqual([expect.stringMatching(/^the server: could not reach the server \(.*ECONNREFUSED/)])
    expect(result.exitCode).toBe(3)
  })

  it('a URL of an unknown scheme is bad input (exit 2) that says nothing was checked', async () => {
    const refused = await runDoctor('ftp://127.0.0.1/x').catch((error: unknown) => error)
    expect(refused).toBeInstanceOf(CliError)
    expect((refused as CliError).exitCode).toBe(2)
    expect((refused as CliError).message).toMatch(/^Store URL "ftp:\/\/127\.0\.0\.1\/x" is not usable: .* Nothing was checked\.$/)
    const cli = await runNode([join(ROOT, 'dist/cli/main.js'), 'doctor', 'ftp://x', '--accept', 'failover'])
    expect(cli.code).toBe(2)
    expect(cli.stdout).toBe('')
    const badAccept = await runNode([join(ROOT, 'dist/cli/main.js'), 'doctor', 'redis://127.0.0.1:1', '--accept', 'meteor'])
    expect(badAccept.code).toBe(2)
    expect(badAccept.stderr).toContain('unknown failure "meteor"')
    expect(badAccept.stderr).toContain('Nothing was checked.')
  })
})
