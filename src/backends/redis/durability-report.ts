/**
 * What a Redis server's configuration can lose of idemkey's records (`idemkey doctor redis://…`, the
 * operator page, `/readyz`): persistence (`appendonly`, `appendfsync`, `save`), eviction
 * (`maxmemory`, `maxmemory-policy`), replication (INFO replication, `min-replicas-to-write`) and Cluster.
 * Read only: CONFIG GET and INFO, nothing written.
 */
import { type DurabilityReport, type Failure, finding, readSetting, type Setting } from '../../core/durability.js'

/** Sends one command (`call('CONFIG', 'GET', 'appendonly')`): ioredis's `redis.call`, node-redis's `sendCommand` spread. */
export type RedisCall = (command: string, ...args: string[]) => Promise<unknown>

/** Options of {@link redisDurabilityReport}. */
export interface RedisDurabilityOptions {
  /**
   * Replicas the app's completions wait for (`WAIT n`, the RedisStore's durability option): a failover
   * then loses nothing acknowledged while that many replicas are connected. @default 0 (no wait)
   */
  waitReplicas?: number
}

/** Reads the server's settings and says, per failure, what idemkey's records can lose. */
export async function redisDurabilityReport(call: RedisCall, options: RedisDurabilityOptions = {}): Promise<DurabilityReport> {
  const unchecked: string[] = []
  const notes: string[] = []
  const config = (name: string) =>
    readSetting(
      name,
      async () => {
        const reply = (await call('CONFIG', 'GET', name)) as unknown[]
        return reply.length >= 2 ? String(reply[1]) : undefined
      },
      unchecked,
    )
  const infoText = async (section: string) => String(await call('INFO', section))
  const info = async (section: string, field: string) =>
    readSetting(`INFO ${section} ${field}`, async () => infoField(await infoText(section), field), unchecked)

  const appendonly = await config('appendonly')
  const appendfsync = await config('appendfsync')
  const save = await config('save')
  const maxmemory = await config('maxmemory')
  const policy = await config('maxmemory-policy')
  const minReplicas = await config('min-replicas-to-write')
  const maxLag = await config('min-replicas-max-lag')
  const version = await info('server', 'redis_version')
  const role = await info('replication', 'role')
  const replicas = await info('replication', 'connected_slaves')
  const cluster = await info('cluster', 'cluster_enabled')

  const clustered = cluster.ok && cluster.value === '1'
  if (role.ok && role.value !== 'master') {
    notes.push(`this server is a ${role.value === 'slave' ? 'replica' : role.value}: point the doctor at the primary the store writes to`)
  }
  if (clustered) {
    notes.push(
      'Redis Cluster: each shard fails over on its own; the replication row counts this node only, so run the doctor against each primary',
    )
  }
  const server = version.ok
    ? `Redis ${version.value} (${clustered ? 'cluster' : 'standalone'}${role.ok ? `, ${role.value === 'slave' ? 'replica' : role.value}` : ''})`
    : undefined

  const wait = options.waitReplicas ?? 0
  const findings = [
    processCrash(appendonly, save),
    machineCrash(appendonly, appendfsync, save),
    failover(replicas, minReplicas, maxLag, wait, clustered),
    eviction(maxmemory, policy),
    finding('expiry', 'safe', 'records stay for their ttl (PEXPIRE on each key); a retry after it is a new request, by design', '', []),
  ]
  return { store: 'redis', ...(server ? { server } : {}), findings, unchecked, notes }
}

/** One `field:value` line of an INFO reply. */
function infoField(text: string, field: string): string | undefined {
  const line = text.split(/\r?\n/).find((l) => l.startsWith(`${field}:`))
  return line?.slice(field.length + 1).trim()
}

const ev = (name: string, setting: Setting) => (setting.ok ? [`${name}=${setting.value === '' ? '""' : setting.value}`] : [])

function unread(failure: Failure, ...settings: Setting[]) {
  const reasons = settings.flatMap((s) => (s.ok ? [] : [s.reason]))
  return finding(failure, 'unchecked', `not checked: ${reasons.join('; ')}`, '', [])
}

function snapshotLoss(save: Setting): string {
  if (!save.ok) return 'every write since the last RDB snapshot, if any (save could not be read)'
  return save.value.trim() === ''
    ? 'every record: no AOF and no RDB snapshots (save "")'
    : `every write since the last RDB snapshot (save ${save.value})`
}

function processCrash(appendonly: Setting, save: Setting) {
  if (!appendonly.ok) return unread('process-crash', appendonly)
  if (appendonly.value === 'yes') {
    return finding(
      'process-crash',
      'safe',
      'nothing: each write is in the AOF (the OS holds it) before Redis replies',
      '',
      ev('appendonly', appendonly),
    )
  }
  return finding('process-crash', 'loses', snapshotLoss(save), 'appendonly yes', [...ev('appendonly', appendonly), ...ev('save', save)])
}

function machineCrash(appendonly: Setting, appendfsync: Setting, save: Setting) {
  if (!appendonly.ok) return unread('machine-crash', appendonly)
  const evidence = [...ev('appendonly', appendonly), ...ev('appendfsync', appendfsync)]
  if (appendonly.value !== 'yes') {
    return finding('machine-crash', 'loses', snapshotLoss(save), 'appendonly yes, appendfsync always', [...evidence, ...ev('save', save)])
  }
  if (!appendfsync.ok) return unread('machine-crash', appendfsync)
  if (appendfsync.value === 'always') {
    return finding('machine-crash', 'safe', 'nothing: the AOF is fsynced before each reply', '', evidence)
  }
  const window =
    appendfsync.value === 'everysec'
      ? 'the last second of writes (up to 2 s when an fsync stalls): the AOF is fsynced once a second'
      : 'what the OS had not yet written to disk (typically up to 30 s): Redis never fsyncs the AOF'
  return finding('machine-crash', 'loses', window, 'appendfsync always', evidence)
}

function failover(replicas: Setting, minReplicas: Setting, maxLag: Setting, wait: number, clustered: boolean) {
  if (!replicas.ok) return unread('failover', replicas)
  const count = Number(replicas.value)
  const evidence = [`connected_slaves=${count}`, ...ev('min-replicas-to-write', minReplicas), ...ev('min-replicas-max-lag', maxLag)]
  if (count === 0 && !clustered) {
    return finding(
      'failover',
      'n/a',
      'no replica is connected: there is nothing to promote (the machine crash row says what a restart keeps)',
      '',
      evidence,
    )
  }
  if (wait > 0 && count >= wait) {
    return finding(
      'failover',
      'safe',
      `nothing acknowledged: completions wait for ${wait} replica${wait === 1 ? '' : 's'} (WAIT) before the answer is released`,
      '',
      [...evidence, `wait=${wait}`],
    )
  }
  const bounded =
    minReplicas.ok && Number(minReplicas.value) > 0 && maxLag.ok
      ? ` (at most about ${maxLag.value} s of them: writes are refused while fewer than ${minReplicas.value} replicas are in reach)`
      : ''
  const short = wait > 0 ? ` Only ${count} replica${count === 1 ? ' is' : 's are'} connected, fewer than the ${wait} waited for.` : ''
  return finding(
    'failover',
    'loses',
    `the writes acknowledged just before the primary died that had not reached the promoted replica: replication is asynchronous${bounded}.${short}`,
    'RedisStore durability option (WAIT for the replicas before each answer) and min-replicas-to-write >= 1; then run the doctor with --wait-replicas N',
    evidence,
  )
}

function eviction(maxmemory: Setting, policy: Setting) {
  if (!maxmemory.ok) return unread('eviction', maxmemory)
  const evidence = [...ev('maxmemory', maxmemory), ...ev('maxmemory-policy', policy)]
  if (maxmemory.value === '0') {
    return finding(
      'eviction',
      'safe',
      'nothing: no maxmemory, Redis never evicts (at the limit of the machine the OS may kill it: a process crash)',
      '',
      evidence,
    )
  }
  if (!policy.ok) return unread('eviction', policy)
  if (policy.value === 'noeviction') {
    return finding('eviction', 'safe', 'nothing: when memory is full, writes fail (the request is refused, not repeated)', '', evidence)
  }
  return finding(
    'eviction',
    'loses',
    `records before their ttl when memory fills (${policy.value} evicts keys${policy.value.startsWith('volatile') ? ' with a TTL, which every idemkey record has' : ''}): the retry of an evicted key runs again`,
    'maxmemory-policy noeviction (or a Redis of its own for idemkey)',
    evidence,
  )
}
