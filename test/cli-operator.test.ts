import { spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { isBuiltin } from 'node:module'
import { type AddressInfo, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Database from 'better-sqlite3'
import { MySqlStore } from '../src/backends/mysql/mysql-store.js'
import { PostgresStore } from '../src/backends/postgres/postgres-store.js'
import { SqliteInbox } from '../src/backends/sqlite/sqlite-inbox.js'
import { SqliteStore } from '../src/backends/sqlite/sqlite-store.js'
import { type CliResult, runNode } from './helpers/cli.js'
import { serviceSkipReason } from './helpers/services.js'

const ROOT = join(import.meta.dirname, '..')
const BIN = join(ROOT, 'bin/idemkey.js')

/**
 * Runs the built CLI as a user would, in `cwd` with `env` added; stdin is not a terminal. Asynchronous:
 * a worker blocked in spawnSync for long on a loaded machine cannot answer vitest's RPC in time.
 */
function cliIn(cwd: string, env: Record<string, string>, ...args: string[]): Promise<CliResult> {
  const { IDEMKEY_STORE: _, ...inherited } = process.env
  return runNode([BIN, ...args], { cwd, env: { ...inherited, ...env } })
}

const cli = (...args: string[]) => cliIn(ROOT, {}, ...args)

const json = <T>(text: string) => JSON.parse(text) as T
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const FP = 'a'.repeat(64)
const response = { status: 201, headers: { 'content-type': 'application/json' }, body: new TextEncoder().encode('{"id":"ch_1"}') }

describe('idemkey operator commands (built CLI on a SQLite file)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'idemkey-cli-ops-'))
  const dbPath = join(dir, 'ops.db')
  const store = `sqlite:${dbPath}`

  beforeAll(async () => {
    if (!existsSync(join(ROOT, 'dist/cli/main.js'))) {
      throw new Error('dist/cli/main.js is missing: run `npm run build` first (npm test does).')
    }
    const s = new SqliteStore({ path: dbPath })
    const done = await s.acquire('tenant-1', 'done-key', FP, 30_000)
    if (done.kind !== 'acquired') throw new Error('setup')
    await s.complete('tenant-1', 'done-key', done.token, { status: 'completed', response, resourceId: 'ch_1' }, 3_600_000)
    await s.acquire('tenant-1', 'stuck-key', FP, 1) // its holder "died": the lease ends at once
    await s.acquire('tenant-1', 'busy-key', FP, 600_000)
    // A transient failure gave this one back: its lease ended at the release, not by running out.
    const released = await s.acquire('tenant-1', 'released-key', FP, 600_000)
    if (released.kind !== 'acquired') throw new Error('setup')
    await s.release('tenant-1', 'released-key', released.token)
    const old = await s.acquire('tenant-1', 'expired-key', FP, 30_000)
    if (old.kind !== 'acquired') throw new Error('setup')
    await s.complete('tenant-1', 'expired-key', old.token, { status: 'completed', response }, 1)
    await s.close()
    await sleep(20)
  })
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  it('migrate creates the schema in a new SQLite file and is safe to run again', async () => {
    const fresh = join(dir, 'fresh.db')
    expect((await cli('migrate', '--store', `sqlite:${fresh}`)).code).toBe(0)
    const again = await cli('migrate', '--store', `sqlite:${fresh}`, '--json')
    expect(again.code).toBe(0)
    expect(json<{ result: string }>(again.stdout).result).toContain('up to date')
    const db = new Database(fresh, { readonly: true })
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as Array<{ name: string }>
    db.close()
    expect(tables.map((t) => t.name)).toContain('idemkey_records')
  })

  it('inspect shows status, token, attempts and the stored response of a record', async () => {
    const out = await cli('inspect', 'done-key', '--scope', 'tenant-1', '--store', store, '--json')
    expect(out.code).toBe(0)
    const { record } = json<{ record: Record<string, unknown> & { response: Record<string, unknown> } }>(out.stdout)
    expect(record).toMatchObject({ key: 'done-key', scope: 'tenant-1', status: 'completed', token: 1, attempts: 1, resourceId: 'ch_1' })
    expect(record.response).toMatchObject({ status: 201, bodyBytes: 13, bodyPreview: '{"id":"ch_1"}' })
    const table = await cli('inspect', 'done-key', '--scope', 'tenant-1', '--store', store)
    expect(table.stdout).toMatch(/status:\s+completed/)
    expect(table.stdout).toMatch(/response:\s+201, 13 bytes/)
  })

  it('inspect of an unknown key exits 1 and says where it looked', async () => {
    const out = await cli('inspect', 'nope', '--scope', 'tenant-1', '--store', store)
    expect(out.code).toBe(1)
    expect(out.stderr).toContain('No live record for key "nope" in scope "tenant-1"')
  })

  it('list puts stuck intents first and hides expired records', async () => {
    const out = await cli('list', '--store', store, '--json')
    expect(out.code).toBe(0)
    const records = json<Array<{ key: string; stuck: boolean; status: string; leaseEnded: string | null }>>(out.stdout)
    expect(records.map((r) => r.key)).toEqual(['stuck-key', 'busy-key', 'released-key', 'done-key'])
    expect(records.map((r) => [r.stuck, r.leaseEnded])).toEqual([
      [true, 'abandoned'],
      [false, null],
      [false, 'released'],
      [false, null],
    ])
    const table = await cli('list', '--store', store)
    expect(table.stdout.split('\n')[2]).toMatch(/^STUCK\s+tenant-1\s+stuck-key\s+in_progress/)
  })

  it('list tells a record released after a transient failure from one whose holder crashed', async () => {
    const lines = (await cli('list', '--status', 'in_progress', '--store', store)).stdout.split('\n')
    const line = (key: string) => lines.find((l) => l.includes(key)) ?? ''
    expect(line('stuck-key')).toMatch(/^STUCK\s/)
    expect(line('stuck-key')).toContain('not renewed (holder crashed or hung')
    expect(line('released-key')).toMatch(/^released\s/)
    expect(line('released-key')).toContain('transient failure: the next retry runs afresh')
    expect(line('busy-key')).toMatch(/^\s+tenant-1\s+busy-key/)
    const inspected = await cli('inspect', 'released-key', '--scope', 'tenant-1', '--store', store)
    expect(inspected.stdout).toMatch(/lease:\s+released \S+ ago/)
  })

  it('list filters by status and by age', async () => {
    const inProgress = json<Array<{ key: string }>>((await cli('list', '--status', 'in_progress', '--store', store, '--json')).stdout)
    expect(inProgress.map((r) => r.key).sort()).toEqual(['busy-key', 'released-key', 'stuck-key'])
    expect(json<unknown[]>((await cli('list', '--older-than', '1h', '--store', store, '--json')).stdout)).toEqual([])
    expect((await cli('list', '--older-than', '1h', '--store', store)).stdout).toContain('no records match')
  })

  it('gc purges expired records and prints the count', async () => {
    const first = await cli('gc', '--store', store, '--json')
    expect(first.code).toBe(0)
    expect(json<{ purged: number }>(first.stdout).purged).toBe(1)
    expect((await cli('gc', '--store', store)).stdout).toContain('purged 0 expired records')
  })

  it('evict refuses without confirmation when stdin is not a terminal, and deletes with --yes', async () => {
    const refused = await cli('evict', 'busy-key', '--scope', 'tenant-1', '--store', store)
    expect(refused.code).toBe(2)
    expect(refused.stderr).toContain('--yes')
    expect((await cli('inspect', 'busy-key', '--scope', 'tenant-1', '--store', store)).code).toBe(0)
    const done = await cli('evict', 'busy-key', '--scope', 'tenant-1', '--store', store, '--yes', '--json')
    expect(json<{ evicted: boolean }>(done.stdout).evicted).toBe(true)
    expect((await cli('inspect', 'busy-key', '--scope', 'tenant-1', '--store', store)).code).toBe(1)
    expect((await cli('evict', 'busy-key', '--scope', 'tenant-1', '--store', store, '--yes')).stdout).toContain('nothing to evict')
  })

  it('list, inspect, gc and evict refuse a SQLite store that does not exist, and create nothing', async () => {
    const cwd = mkdtempSync(join(tmpdir(), 'idemkey-cli-empty-'))
    try {
      for (const args of [['list'], ['gc'], ['inspect', 'order-1'], ['evict', 'order-1', '--yes'], ['list', '--store', 'sqlite:nope.db']]) {
        const out = await cliIn(cwd, {}, ...args)
        expect(out.code, args.join(' ')).toBe(2)
        expect(out.stderr, args.join(' ')).toMatch(/No store at sqlite:\S+: .* does not exist, and \w+ does not create one\. Pass --store/)
      }
      expect(readdirSync(cwd)).toEqual([])
      // migrate is the command that creates a store.
      expect((await cliIn(cwd, {}, 'migrate')).code).toBe(0)
      expect((await cliIn(cwd, {}, 'list')).stdout).toContain('no records match')
    } finally {
      rmSync(cwd, { recursive: true, force: true })
    }
  })

  it('takes the store from IDEMKEY_STORE when --store is not given', async () => {
    const out = await cliIn(ROOT, { IDEMKEY_STORE: store }, 'list', '--status', 'completed', '--json')
    expect(out.code, out.stderr).toBe(0)
    expect(json<Array<{ key: string }>>(out.stdout).map((r) => r.key)).toEqual(['done-key'])
  })

  it('reaches a table that is not the default with ?table= in the store URL', async () => {
    const path = join(dir, 'custom.db')
    expect((await cli('migrate', '--store', `sqlite:${path}?table=app_keys`)).code).toBe(0)
    const db = new Database(path, { readonly: true })
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as Array<{ name: string }>
    db.close()
    expect(tables.map((t) => t.name)).toContain('app_keys')
    expect(tables.map((t) => t.name)).not.toContain('idemkey_records')
    expect((await cli('list', '--store', `sqlite:${path}?table=app_keys`)).stdout).toContain('no records match')
    expect((await cli('list', '--store', `sqlite:${path}?schema=x`)).stderr).toContain('a sqlite store takes ?table=, not ?schema=')
    expect((await cli('list', '--store', 'redis://127.0.0.1:6379?table=x')).stderr).toContain('a redis store takes ?prefix=, not ?table=')
    const secret = await cli('list', '--store', 'postgres://app:s3cret@127.0.0.1/app?table=')
    expect(secret.stderr).toContain('postgres://app:***@127.0.0.1/app?table=')
    expect(secret.stderr).not.toContain('s3cret')
  })

  it('refuses an upstream URL with parts the proxy would drop: a user, a password, a query, a fragment', async () => {
    for (const [upstream, says] of [
      ['http://app:s3cret@127.0.0.1:3000', 'takes no user or password'],
      ['http://app@127.0.0.1:3000', 'takes no user or password'],
      ['http://127.0.0.1:3000/api?v=2', 'without ?query or #fragment'],
      ['http://127.0.0.1:3000/api#x', 'without ?query or #fragment'],
    ] as const) {
      const out = await cli('proxy', '--upstream', upstream)
      expect(out.code, upstream).toBe(1)
      expect(out.stderr, upstream).toContain(says)
      expect(out.stderr, upstream).not.toContain('s3cret')
    }
  })

  it('refuses a timeout of 0, which the servers and clients below would read as no bound at all', async () => {
    for (const args of [
      ['proxy', '--upstream', 'http://127.0.0.1:3000', '--upstream-timeout', '0s'],
      ['proxy', '--upstream', 'http://127.0.0.1:3000', '--header-timeout', '0'],
      ['proxy', '--upstream', 'http://127.0.0.1:3000', '--body-timeout', '0ms'],
      ['demo', '--client-timeout', '0s'],
    ]) {
      const out = await cli(...args)
      expect(out.code, args.join(' ')).toBe(1)
      expect(out.stderr, args.join(' ')).toMatch(/--[a-z-]+-timeout must be longer than 0: a timeout of 0 would turn the bound off/)
    }
    const size = await cli('size', '--writes', '10', '--window', '0s')
    expect(size.code).toBe(1)
    expect(size.stderr).toContain('--window must be longer than 0')
    // A lease or TTL of 0 was taken, and every covered request then failed in the ledger.
    for (const [flag, says] of [
      ['--lease', 'a request must own its key for some time'],
      ['--ttl', 'an outcome kept for no time is never replayed'],
    ]) {
      const out = await cli('proxy', '--upstream', 'http://127.0.0.1:3000', flag as string, '0s')
      expect(out.code, flag).toBe(1)
      expect(out.stderr, flag).toContain(`${flag} must be longer than 0: ${says}`)
    }
  })

  it('refuses an empty --host or --admin-host (an unset variable in --host "$HOST"), which Node reads as every interface, not the loopback default', async () => {
    for (const flag of ['--host', '--admin-host']) {
      const out = await cli('proxy', '--upstream', 'http://127.0.0.1:3000', flag, '')
      expect(out.code, flag).toBe(1)
      expect(out.stderr, flag).toContain(
        `${flag} is an address to listen on, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface), got "".`,
      )
    }
  })

  it('refuses a timeout past 24.8 days, which the timer below would fire after 1 ms (a drain that ends at once)', async () => {
    for (const args of [
      ['proxy', '--upstream', 'http://127.0.0.1:3000', '--upstream-timeout', '25d'],
      ['proxy', '--upstream', 'http://127.0.0.1:3000', '--header-timeout', '25d'],
      ['proxy', '--upstream', 'http://127.0.0.1:3000', '--body-timeout', '25d'],
      ['proxy', '--upstream', 'http://127.0.0.1:3000', '--drain-timeout', '25d'],
      ['demo', '--client-timeout', '25d'],
      [
        'relay',
        '--from',
        'postgres://app@127.0.0.1/app',
        '--to',
        'nats://127.0.0.1:4222',
        '--table',
        't',
        '--silent-connection-timeout',
        '25d',
      ],
    ]) {
      const out = await cli(...args)
      expect(out.code, args.join(' ')).toBe(1)
      expect(out.stderr, args.join(' ')).toMatch(
        /--[a-z-]+-timeout "25d" is longer than 24\.8 days \(2147483647 ms\), the longest delay a Node timer keeps: it would fire after 1 ms\./,
      )
    }
  })

  it('says which flag to change when the proxy cannot listen, without a stack trace', async () => {
    const holder = createServer()
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve))
    const port = (holder.address() as AddressInfo).port
    try {
      for (const [flags, says] of [
        [['--port', String(port)], `--port ${port}: something else already listens on 127.0.0.1:${port}`],
        [['--port', '0', '--admin-port', String(port)], `--admin-port ${port}: something else already listens on 127.0.0.1:${port}`],
        [['--port', '0', '--host', '192.0.2.1'], '--host 192.0.2.1: not an address of this machine'],
      ] as const) {
        const out = await cli('proxy', '--upstream', 'http://127.0.0.1:3000', '--store', 'memory:', ...flags)
        expect(out.code, flags.join(' ')).toBe(1)
        expect(out.stderr, flags.join(' ')).toContain(says)
        expect(out.stderr, flags.join(' ')).not.toMatch(/\n\s+at /)
      }
    } finally {
      holder.close()
    }
  })

  it('refuses a --scope-header no request can carry, which would scope every request by its credential instead', async () => {
    for (const name of ['X Tenant', 'X-Tenant:', '', 'Tenant\u00e9']) {
      const out = await cli('proxy', '--upstream', 'http://127.0.0.1:3000', '--scope-header', name)
      expect(out.code, name).toBe(1)
      expect(out.stderr, name).toContain('expected an HTTP header name such as X-Tenant-Id')
    }
  })

  it('never shows the password of a URL it refuses, however commander would quote it', async () => {
    const refusals = [
      ['list', '--store', 'postgres://app:pa/s3cret@127.0.0.1/app'],
      ['list', '--store', 'mysql://root:p@s3cret@127.0.0.1/test?schema=x'],
      ['proxy', '--upstream', 'ftp://app:s3cret@127.0.0.1'],
      ['relay', '--from', 'mysql://app:s3cret@127.0.0.1/app', '--to', 'nats://127.0.0.1:4222', '--table', 't'],
      ['relay', '--from', 'postgres://app@127.0.0.1/app', '--to', 'ftp://app:s3cret@127.0.0.1', '--table', 't'],
    ]
    for (const args of refusals) {
      const out = await cli(...args)
      expect(out.code, args.join(' ')).toBe(1)
      // Told as commander tells any refused flag: "error: option … is invalid." and the --help line.
      expect(out.stderr, args.join(' ')).toMatch(
        /^error: option '--\w+ <url>' argument '.*' is invalid\. .*\n\(add --help for usage and examples\)\n$/,
      )
      expect(out.stderr, args.join(' ')).toContain(':***@')
      expect(out.stderr, args.join(' ')).not.toContain('s3cret')
    }
  })

  it('--help shows defaults as they are written (24h, 1mb), not as the numbers they parse to', async () => {
    for (const command of ['demo', 'proxy', 'migrate', 'inspect', 'list', 'gc', 'evict', 'relay']) {
      const help = (await cli(command, '--help')).stdout.replace(/\s+/g, ' ')
      // A duration or size option whose default shows as a bare number of milliseconds or bytes.
      expect(help, command).not.toMatch(/<(duration|size)>[^<]*?\(default: \d+\)/)
      expect(help, command).not.toMatch(/SPEC/)
    }
    const proxy = (await cli('proxy', '--help')).stdout.replace(/\s+/g, ' ')
    for (const shown of [
      '(default: 30s)',
      '(default: 24h)',
      '(default: 10s)',
      '(default: 1mb)',
      '(default: 64mb)',
      '(default: POST,PATCH)',
    ]) {
      expect(proxy).toContain(shown)
    }
    const demo = (await cli('demo', '--help')).stdout.replace(/\s+/g, ' ')
    expect(demo).toContain('(default: 2s)')
    expect(demo).toContain('(default: 1s)')
  })

  it('each command loads only the packages it uses', async () => {
    // A module hook that reports every package (bare specifier) the CLI resolves. registerHooks runs
    // in the loading thread, for import and require alike (Node.js 22.15+); the off-thread
    // module.register hooks of earlier releases miss what Node 24's loader resolves synchronously.
    const register = join(dir, 'register.mjs')
    writeFileSync(
      register,
      `import { registerHooks } from 'node:module'
      registerHooks({
        resolve(specifier, context, next) {
          if (!/^(\\.|\\/|node:|file:)/.test(specifier)) process.stderr.write('PACKAGE ' + specifier + '\\n')
          return next(specifier, context)
        },
      })\n`,
    )
    const packages = async (...args: string[]) => {
      const out = await runNode(['--import', register, BIN, ...args])
      // Node's built-ins named without `node:` (require('fs') in a CommonJS package) are not packages.
      return [...new Set([...out.stderr.matchAll(/^PACKAGE (\S+)$/gm)].map((m) => m[1] as string))]
        .filter((name) => !isBuiltin(name))
        .sort()
    }
    expect(await packages('--version')).toEqual([])
    expect(await packages('proxy', '--help')).toEqual([])
    // The relay's broker clients, pg and pg-logical-replication load only when it runs.
    expect(await packages('relay', '--help')).toEqual([])
    expect(await packages('migrate', '--store', 'memory:')).toEqual([])
    // The embedded store's driver is built in (node:sqlite), and so is the CLI parser: nothing to load.
    expect(await packages('list', '--store', store)).toEqual([])
    // Asked for by name, better-sqlite3 is loaded (with what it requires itself), and nothing else.
    const own = Object.keys(
      (JSON.parse(readFileSync(join(ROOT, 'node_modules/better-sqlite3/package.json'), 'utf8')) as { dependencies?: object })
        .dependencies ?? {},
    )
    expect((await packages('list', '--store', `${store}?driver=better-sqlite3`)).filter((name) => !own.includes(name as string))).toEqual([
      'better-sqlite3',
    ])
  })

  it('every command has --help with examples', async () => {
    for (const command of ['demo', 'proxy', 'migrate', 'inspect', 'list', 'gc', 'evict', 'relay']) {
      const out = await cli(command, '--help')
      expect(out.code, command).toBe(0)
      expect(out.stdout, command).toContain('Examples:')
    }
    expect((await cli('--help')).stdout).toContain('Store URLs:')
  })

  it('unknown flags, bad durations and bad store URLs fail with what was expected', async () => {
    const flag = await cli('list', '--bogus')
    expect(flag.code).not.toBe(0)
    expect(flag.stderr).toContain("unknown option '--bogus'")
    const duration = await cli('list', '--older-than', '5 minutes', '--store', store)
    expect(duration.code).not.toBe(0)
    expect(duration.stderr).toMatch(/not a duration: use milliseconds or a number with a unit/)
    const url = await cli('list', '--store', 'mysql:/x')
    expect(url.code).not.toBe(0)
    expect(url.stderr).toContain('expected memory:, sqlite:PATH')
    const empty = await cli('gc', '--store', 'sqlite:')
    expect(empty.stderr).toContain('sqlite: needs a file path')
    const silent = await cli(
      'relay',
      '--from',
      'postgres://app@127.0.0.1:1/app',
      '--to',
      'nats://127.0.0.1:1',
      '--silent-connection-timeout',
      '1s',
    )
    expect(silent.code).not.toBe(0)
    expect(silent.stderr).toContain("option '--silent-connection-timeout <duration>' argument '1s' is invalid. must be at least 2s")
  })
})

const mysqlSkip = await serviceSkipReason('MariaDB', 3306)

describe('idemkey operator commands on MySQL/MariaDB (mysql:// store URL)', { skip: mysqlSkip !== undefined }, () => {
  const url = 'mysql://root@127.0.0.1:3306/test'
  const scope = `cli-${randomUUID()}`

  it('migrates, then inspects, lists, purges and evicts a record the store wrote', async () => {
    expect((await cli('migrate', '--store', url)).code).toBe(0)
    expect(json<{ result: string }>((await cli('migrate', '--store', url, '--json')).stdout).result).toContain('up to date')
    const store = new MySqlStore({ uri: url })
    try {
      const held = await store.acquire(scope, 'order-1', FP, 600_000)
      if (held.kind !== 'acquired') throw new Error(`setup: ${held.kind}`)
    } finally {
      await store.close()
    }
    const inspected = await cli('inspect', 'order-1', '--scope', scope, '--store', url, '--json')
    expect(inspected.code).toBe(0)
    expect(json<{ record: { status: string; token: number } }>(inspected.stdout).record).toMatchObject({ status: 'in_progress', token: 1 })
    const listed = json<Array<{ key: string }>>(
      (await cli('list', '--status', 'in_progress', '--scope', scope, '--store', url, '--json')).stdout,
    )
    expect(listed.map((r) => r.key)).toEqual(['order-1'])
    expect((await cli('gc', '--store', url)).code).toBe(0)
    expect(
      json<{ evicted: boolean }>((await cli('evict', 'order-1', '--scope', scope, '--store', url, '--yes', '--json')).stdout).evicted,
    ).toBe(true)
    expect((await cli('inspect', 'order-1', '--scope', scope, '--store', url)).code).toBe(1)
  })
})

const pgSkip = await serviceSkipReason('PostgreSQL', 5432)

/**
 * `idemkey inspect --inboxes`: each consumer of an inbox table with its oldest kept ID (time, age),
 * on the three SQL databases an inbox lives in; a consumer's oldest row is the one its class reports.
 */
describe('idemkey inspect --inboxes shows each inbox consumer and its oldest kept ID', () => {
  const hourAgo = Date.now() - 3_600_000
  type Report = {
    table: string
    inboxes: Array<{
      consumer: string
      oldest: { messageId: string; processedAt: string; ageMs: number } | null
      failing: Array<{ messageId: string; attempts: number; lastAttemptAt: string; ageMs: number }>
    }>
  }
  /** Without failures recorded: billing and shipping. With them, orders too, which keeps no ID (every message of it failed). */
  const expectReport = (out: CliResult, table: string, withFailures = false) => {
    expect(out.code, out.stderr).toBe(0)
    const report = json<Report>(out.stdout)
    expect(report.table).toBe(table)
    expect(report.inboxes.map((i) => [i.consumer, i.oldest?.messageId])).toEqual([
      ['billing', 'm-old'],
      ...(withFailures ? [['orders', undefined]] : []),
      ['shipping', 'm-new'],
    ])
    const billing = report.inboxes[0]?.oldest
    expect(Math.abs(Date.parse(billing?.processedAt ?? '') - hourAgo)).toBeLessThan(2_000)
    expect(billing?.ageMs).toBeGreaterThanOrEqual(3_590_000)
    expect(report.inboxes.map((i) => i.failing.map((f) => [f.messageId, f.attempts]))).toEqual(
      withFailures ? [[['m-bad', 2]], [['poison', 3]], []] : [[], []],
    )
    if (withFailures) {
      const bad = report.inboxes[0]?.failing[0]
      expect(Math.abs(Date.parse(bad?.lastAttemptAt ?? '') - Date.now())).toBeLessThan(60_000)
      expect(bad?.ageMs).toBeLessThan(60_000)
    }
  }
  /** Failed attempts: billing's m-bad twice, and three of orders' poison (a consumer that kept no ID). */
  const recordFailures = async (
    inbox: (consumer: string) => { recordFailure(message: { id: string; payload: string }): Promise<number> },
  ) => {
    for (let i = 0; i < 2; i++) await inbox('billing').recordFailure({ id: 'm-bad', payload: 'x' })
    for (let i = 0; i < 3; i++) await inbox('orders').recordFailure({ id: 'poison', payload: 'x' })
  }

  it('on SQLite, as a table and as JSON; a store that is not SQL is refused with what to pass', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'idemkey-cli-inbox-'))
    try {
      const path = join(dir, 'app.db')
      const db = new Database(path)
      db.exec(`CREATE TABLE idemkey_inbox (consumer TEXT NOT NULL, message_id TEXT NOT NULL, payload_hash TEXT NOT NULL,
        processed_at INTEGER NOT NULL, PRIMARY KEY (consumer, message_id))`)
      const insert = db.prepare('INSERT INTO idemkey_inbox VALUES (?, ?, ?, ?)')
      insert.run('billing', 'm-new', 'h', Date.now())
      insert.run('billing', 'm-old', 'h', hourAgo)
      insert.run('shipping', 'm-new', 'h', Date.now())
      db.close()
      // Made by hand, as an inbox before failures were recorded: no failures table, nothing failing.
      expectReport(await cli('inspect', '--inboxes', '--store', `sqlite:${path}`, '--json'), 'idemkey_inbox')
      const table = await cli('inspect', '--inboxes', '--store', `sqlite:${path}`)
      expect(table.stdout).toMatch(/billing\s+\S+Z\s+1h\S*\s+m-old/)
      expect(table.stdout).toContain('no message has attempts recorded')
      const migrated = new Database(path)
      new SqliteInbox({ database: migrated, consumer: 'billing' }).migrate()
      await recordFailures((consumer) => new SqliteInbox({ database: migrated, consumer }))
      migrated.close()
      expectReport(await cli('inspect', '--inboxes', '--store', `sqlite:${path}`, '--json'), 'idemkey_inbox', true)
      const failing = await cli('inspect', '--inboxes', '--store', `sqlite:${path}`)
      expect(failing.stdout).toMatch(/orders\s+3\s+\S+Z\s+\S+\s+poison/)
      expect((await cli('inspect', '--store', `sqlite:${path}`)).stderr).toContain('--inboxes')
      const redis = await cli('inspect', '--inboxes', '--store', 'redis://127.0.0.1:6379')
      expect(redis.code).toBe(2)
      expect(redis.stderr).toContain('Pass --store with the database your inbox writes to')
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it('on PostgreSQL, in a table named with --inbox-table', { skip: pgSkip !== undefined }, async () => {
    const { default: pg } = await import('pg')
    const url = 'postgres://root@127.0.0.1:5432/test'
    const table = `h2_inbox_${randomUUID().slice(0, 8)}`
    const pool = new pg.Pool({ connectionString: url, max: 1 })
    try {
      const { PgInbox } = await import('../src/backends/postgres/postgres-inbox.js')
      await new PgInbox({ pool, consumer: 'billing', table }).migrate()
      await pool.query(
        `INSERT INTO ${table} (consumer, message_id, payload_hash, processed_at) VALUES
           ('billing', 'm-new', 'h', now()), ('billing', 'm-old', 'h', to_timestamp($1 / 1000.0)), ('shipping', 'm-new', 'h', now())`,
        [hourAgo],
      )
      expectReport(await cli('inspect', '--inboxes', '--inbox-table', table, '--store', url, '--json'), table)
      await recordFailures((consumer) => new PgInbox({ pool, consumer, table }))
      expectReport(await cli('inspect', '--inboxes', '--inbox-table', table, '--store', url, '--json'), table, true)
      const missing = await cli('inspect', '--inboxes', '--inbox-table', `${table}_none`, '--store', url)
      expect(missing.code).toBe(1)
      expect(missing.stderr).toContain(`Could not read the inbox table "${table}_none"`)
    } finally {
      await pool.query(`DROP TABLE IF EXISTS ${table}, ${table}_failures`)
      await pool.end()
    }
  })

  it('on MySQL/MariaDB, in a table named with --inbox-table', { skip: mysqlSkip !== undefined }, async () => {
    const mysql = await import('mysql2/promise')
    const url = 'mysql://root@127.0.0.1:3306/test'
    const table = `h2_inbox_${randomUUID().slice(0, 8)}`
    const pool = mysql.createPool(url)
    try {
      const { MySqlInbox } = await import('../src/backends/mysql/mysql-inbox.js')
      await new MySqlInbox({ pool, consumer: 'billing', table }).migrate()
      const now = Date.now()
      await pool.query(
        `INSERT INTO ${table} (consumer, message_id, payload_hash, processed_at) VALUES (?, ?, ?, ?), (?, ?, ?, ?), (?, ?, ?, ?)`,
        ['billing', 'm-new', 'h', now, 'billing', 'm-old', 'h', hourAgo, 'shipping', 'm-new', 'h', now],
      )
      expectReport(await cli('inspect', '--inboxes', '--inbox-table', table, '--store', url, '--json'), table)
      await recordFailures((consumer) => new MySqlInbox({ pool, consumer, table }))
      expectReport(await cli('inspect', '--inboxes', '--inbox-table', table, '--store', url, '--json'), table, true)
    } finally {
      await pool.query(`DROP TABLE IF EXISTS ${table}, ${table}_failures, ${table}_meta`)
      await pool.end()
    }
  })
})

const postgresSkip = await serviceSkipReason('PostgreSQL', 5432)

describe('idemkey migrate --layout and gc on a partitioned PostgreSQL table', { skip: postgresSkip !== undefined }, () => {
  const table = `h3_cli_${randomUUID().slice(0, 8)}`
  const url = `postgres://root@127.0.0.1:5432/test?table=${table}`
  const scope = `cli-${randomUUID()}`
  afterAll(async () => {
    const pg = (await import('pg')).default
    const pool = new pg.Pool({ connectionString: 'postgres://root@127.0.0.1:5432/test' })
    await pool.query(`DROP TABLE IF EXISTS "${table}"`)
    await pool.end()
  })

  it('converts a plain table to 200 ms partitions, migrates and gcs it as it is without --layout (dropping the expired partitions), and converts back with the live record kept', async () => {
    expect((await cli('migrate', '--store', url)).code).toBe(0)
    const plain = new PostgresStore({ connectionString: url.replace(/\?.*/, ''), table })
    const old = await plain.acquire(scope, 'old', FP, 600_000)
    if (old.kind !== 'acquired') throw new Error(`setup: ${old.kind}`)
    await plain.complete(scope, 'old', old.token, { status: 'completed', response }, 1)
    await sleep(450) // "kept" is created in a later 200 ms slot than "old"
    const kept = await plain.acquire(scope, 'kept', FP, 600_000)
    if (kept.kind !== 'acquired') throw new Error(`setup: ${kept.kind}`)
    await plain.complete(scope, 'kept', kept.token, { status: 'completed', response }, 3_600_000)
    await plain.close()
    await sleep(250) // both slots have ended

    const converted = await cli('migrate', '--store', url, '--layout', 'partitioned', '--partition-interval', '200ms', '--json')
    expect(converted.code, converted.stderr).toBe(0)
    expect(json<{ from: string; to: string; records: number }>(converted.stdout)).toMatchObject({
      from: 'plain',
      to: 'partitioned',
      records: 2,
    })
    // Without ?layout=, each command finds the table's own: migrate upgrades it as it is (a store told
    // 'plain' refused it), and gc rotates partitions rather than deleting rows.
    const again = await cli('migrate', '--store', url)
    expect(again.code, again.stderr).toBe(0)
    expect(again.stdout).toContain('is up to date')
    const gc = json<{ layout: string; dropped: string[] }>((await cli('gc', '--store', url, '--json')).stdout)
    expect(gc.layout).toBe('partitioned')
    // Each record went to the partition of its creation: the one of "old" (expired) is dropped with
    // the empty ones that ended since, and "kept"'s stays.
    expect(gc.dropped.length).toBeGreaterThanOrEqual(1)
    const listed = json<Array<{ key: string }>>((await cli('list', '--scope', scope, '--store', url, '--json')).stdout)
    expect(listed.map((r) => r.key)).toEqual(['kept'])

    const back = await cli('migrate', '--store', url, '--layout', 'plain', '--json')
    expect(back.code, back.stderr).toBe(0)
    expect(json<{ from: string; to: string }>(back.stdout)).toMatchObject({ from: 'partitioned', to: 'plain' })
    const inspected = await cli('inspect', 'kept', '--scope', scope, '--store', url, '--json')
    expect(json<{ record: { status: string } }>(inspected.stdout).record.status).toBe('completed')
    expect((await cli('migrate', '--store', url, '--layout', 'sideways')).code).toBe(2)
  })

  it('refuses a --partition-interval it would not use (no --layout on a new or plain table, another span than the partitioned table has, --layout plain) before changing anything', async () => {
    const other = `${table}_iv`
    const otherUrl = url.replace(`table=${table}`, `table=${other}`)
    const pg = (await import('pg')).default
    const pool = new pg.Pool({ connectionString: 'postgres://root@127.0.0.1:5432/test' })
    const kind = async () => (await pool.query('SELECT relkind FROM pg_class WHERE relname = $1', [other])).rows[0]?.relkind
    try {
      const noLayout = await cli('migrate', '--store', otherUrl, '--partition-interval', '1h')
      expect(noLayout.code).toBe(2)
      expect(noLayout.stderr).toContain('has no table yet, and migrate would create a plain one: add --layout partitioned')
      expect(await kind()).toBeUndefined()

      const created = await cli('migrate', '--store', otherUrl, '--layout', 'partitioned', '--partition-interval', '1h')
      expect(created.code, created.stderr).toBe(0)
      expect(await kind()).toBe('p')
      const same = await cli('migrate', '--store', otherUrl, '--partition-interval', '60m')
      expect(same.code, same.stderr).toBe(0)

      const changed = await cli('migrate', '--store', otherUrl, '--layout', 'partitioned', '--partition-interval', '2h')
      expect(changed.code).toBe(2)
      expect(changed.stderr).toContain('is partitioned by 1h, and a partitioned table keeps the span it was created with')
      const toPlain = await cli('migrate', '--store', otherUrl, '--layout', 'plain', '--partition-interval', '1h')
      expect(toPlain.code).toBe(2)
      expect(toPlain.stderr).toContain('leave it out with --layout plain')
      expect(await kind()).toBe('p')

      await pool.query(`DROP TABLE "${other}"`)
      await pool.query(`CREATE TABLE "${other}" (id int)`)
      const plain = await cli('migrate', '--store', otherUrl, '--partition-interval', '1h')
      expect(plain.code).toBe(2)
      expect(plain.stderr).toContain('is plain: add --layout partitioned')
    } finally {
      await pool.query(`DROP TABLE IF EXISTS "${other}"`)
      await pool.end()
    }
  })
})

/** A loopback port nothing listens on (taken, then given back). */
async function closedPort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as AddressInfo).port
  await new Promise((resolve) => server.close(resolve))
  return port
}

/** Runs the built CLI; a process still running after `ms` is killed and reported with code `'hung'`. */
function cliWithin(ms: number, ...args: string[]): Promise<{ code: number | null | 'hung'; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    let hung = false
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk
    })
    const timer = setTimeout(() => {
      hung = true
      child.kill('SIGKILL')
    }, ms)
    child.on('error', reject)
    child.on('close', (code) => {
      clearTimeout(timer)
      resolve({ code: hung ? 'hung' : code, stderr })
    })
  })
}

describe('idemkey relay to a broker it cannot reach', () => {
  it('exits 1 with one line when the Redis broker refuses connections, rather than hang reconnecting', async () => {
    const port = await closedPort()
    const out = await cliWithin(
      15_000,
      'relay',
      '--from',
      'postgres://app@127.0.0.1:5432/app',
      '--to',
      `redis://127.0.0.1:${port}`,
      '--no-setup',
    )
    expect(out.code).toBe(1)
    expect(out.stderr).toMatch(new RegExp(`Could not connect to redis://127\\.0\\.0\\.1:${port}`))
    expect(out.stderr).not.toMatch(/Unhandled error event/)
  })
})

describe('idemkey operator commands on a Redis that accepts connections and never answers', () => {
  it('inspect reports the store unavailable and exits 1, rather than stay alive reconnecting after its answer', async () => {
    // A port that accepts and then says nothing: a hung Redis, or the URL of another service.
    const sockets: Socket[] = []
    const silent = createServer((socket) => {
      sockets.push(socket)
      socket.resume()
    })
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
    const port = (silent.address() as AddressInfo).port
    try {
      const out = await cliWithin(45_000, 'inspect', 'some-key', '--store', `redis://127.0.0.1:${port}`)
      expect(out.stderr).toMatch(/redis: get failed/)
      expect(out.code).toBe(1)
    } finally {
      for (const socket of sockets) socket.destroy()
      silent.close()
    }
  }, 60_000)
})

describe('idemkey migrate on a Redis it cannot reach', () => {
  it('exits 1 with the store error rather than report "needs no schema" as a success', async () => {
    const port = await closedPort()
    const out = await cliWithin(20_000, 'migrate', '--store', `redis://127.0.0.1:${port}`)
    expect(out.stderr).toMatch(/STORE_UNAVAILABLE/)
    expect(out.code).toBe(1)
  })
})
