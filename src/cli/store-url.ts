import { type TableLayout, tableLayout } from '../backends/postgres/partitions.js'
import type { PgQueryable } from '../backends/postgres/pool.js'
import { redactUrl } from '../core/redact-url.js'
import type { IdempotencyStore } from '../core/store.js'
import { IdempotencyError } from '../errors.js'

/** The store every command uses when `--store` is not given. */
export const DEFAULT_STORE_URL = 'sqlite:idemkey.db'

/** Where a store keeps its records, when not where the store puts them by default. */
export interface StoreLocation {
  /** Table of the SQL stores (`?table=`). */
  table?: string
  /** PostgreSQL schema (`?schema=`). */
  schema?: string
  /** Redis key prefix (`?prefix=`). */
  prefix?: string
  /** PostgreSQL table layout, `plain` or `partitioned` (`?layout=`; docs/postgres.md, "Time partitions"). */
  layout?: string
  /** PostgreSQL partition interval of a partitioned table it creates (`?partitionInterval=1d`). */
  partitionInterval?: string
}

/** What the CLI understands of a store URL, before anything is opened. `url` is what the driver gets. */
export type StoreSpec =
  | { kind: 'memory'; url: string; location: StoreLocation }
  | { kind: 'sqlite'; url: string; path: string; location: StoreLocation; driver?: 'node:sqlite' | 'better-sqlite3' }
  | { kind: 'postgres'; url: string; location: StoreLocation }
  | { kind: 'redis'; url: string; location: StoreLocation }
  | { kind: 'mysql'; url: string; location: StoreLocation }
  | { kind: 'dynamodb'; url: string; location: StoreLocation }

const EXPECTED =
  'expected memory:, sqlite:PATH (e.g. sqlite:idemkey.db), postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB or redis://HOST:PORT (rediss:// for TLS), each optionally with ?table=NAME (?schema=NAME on PostgreSQL, ?prefix=P on Redis), or dynamodb://TABLE (?region=R, ?endpoint=URL, ?prefix=P)'

const LOCATION_NAMES = ['table', 'schema', 'prefix', 'layout', 'partitionInterval'] as const

/** The location parameters each kind of store takes in its URL's query. */
const LOCATION_PARAMS: Record<StoreSpec['kind'], Array<keyof StoreLocation>> = {
  memory: [],
  sqlite: ['table'],
  postgres: ['schema', 'table', 'layout', 'partitionInterval'],
  mysql: ['table'],
  redis: ['prefix'],
  dynamodb: ['prefix'],
}

/**
 * Reads a store URL without opening anything; throws `INVALID_OPTION` saying what is expected.
 * `?table=`, `?schema=` and `?prefix=` name where an app that does not use the defaults keeps its
 * records; they are taken out of the URL the driver gets.
 *
 * @example parseStoreUrl('sqlite:data/idemkey.db') // { kind: 'sqlite', path: 'data/idemkey.db', … }
 * @example parseStoreUrl('postgres://app@db:5432/app?schema=billing&table=idempotency')
 */
export function parseStoreUrl(url: string): StoreSpec {
  const text = url.trim()
  if (text === 'memory:' || text === 'memory') return { kind: 'memory', url: 'memory:', location: {} }
  if (text.startsWith('sqlite:')) {
    // A query is read only when it holds nothing but known parameters: a file name may contain '?'.
    const query = /\?((?:table|schema|prefix|driver)=[^&?]*(?:&(?:table|schema|prefix|driver)=[^&?]*)*)$/.exec(text)
    const params = new URLSearchParams(query?.[1] ?? '')
    const driver = params.get('driver')
    params.delete('driver')
    if (driver !== null && driver !== 'node:sqlite' && driver !== 'better-sqlite3') {
      throw invalid(
        url,
        `?driver= is node:sqlite (the default, built into Node.js 22.16+, Bun and Deno) or better-sqlite3, not "${driver}"`,
      )
    }
    const location = readLocation(url, 'sqlite', params)
    const bare = query ? text.slice(0, query.index) : text
    const path = bare.slice('sqlite:'.length).replace(/^\/\/(?=\/)/, '')
    if (path.length === 0) throw invalid(url, 'sqlite: needs a file path after the colon, e.g. sqlite:idemkey.db or sqlite::memory:')
    return { kind: 'sqlite', url: bare, path, location, ...(driver ? { driver } : {}) }
  }
  let kind: 'postgres' | 'mysql' | 'redis' | 'dynamodb'
  if (/^postgres(ql)?:\/\//.test(text)) kind = 'postgres'
  else if (/^(mysql|mariadb):\/\//.test(text)) kind = 'mysql'
  else if (/^rediss?:\/\//.test(text)) kind = 'redis'
  // dynamodb://TABLE: the table is the host; region and credentials come from the environment unless given.
  else if (/^dynamodb:\/\//.test(text)) kind = 'dynamodb'
  else throw invalid(url, EXPECTED)
  const parsed = checkUrl(url, text)
  const location = readLocation(url, kind, parsed.searchParams)
  if (kind === 'mysql' && (parsed.pathname === '' || parsed.pathname === '/')) {
    // mysql2 would connect to no database, and every statement would fail with "No database selected".
    throw invalid(url, 'a mysql:// URL needs the database in its path, e.g. mysql://root@127.0.0.1:3306/app')
  }
  for (const name of LOCATION_NAMES) parsed.searchParams.delete(name)
  let driverUrl = parsed.toString()
  // mysql2 reads mysql:// URIs; mariadb:// is the same server to a user.
  if (kind === 'mysql') driverUrl = driverUrl.replace(/^mariadb:/, 'mysql:')
  return { kind, url: driverUrl, location }
}

function readLocation(url: string, kind: StoreSpec['kind'], params: URLSearchParams): StoreLocation {
  const location: StoreLocation = {}
  const allowed = LOCATION_PARAMS[kind]
  for (const name of LOCATION_NAMES) {
    const value = params.get(name)
    if (value === null) continue
    if (!allowed.includes(name)) {
      const takes = allowed.length ? `takes ${allowed.map((n) => `?${n}=`).join(' and ')}` : 'takes no parameters'
      throw invalid(url, `a ${kind} store ${takes}, not ?${name}=`)
    }
    if (value === '') throw invalid(url, `?${name}= needs a value`)
    location[name] = value
  }
  return location
}

function checkUrl(original: string, text: string): URL {
  let parsed: URL
  try {
    parsed = new URL(text)
  } catch {
    throw invalid(original, `it is not a valid URL with a host; ${EXPECTED}`)
  }
  if (!parsed.hostname) throw invalid(original, `it is not a valid URL with a host; ${EXPECTED}`)
  return parsed
}

function invalid(url: string, detail: string): IdempotencyError {
  // The URL is echoed so the user sees what was read, but never its password.
  return new IdempotencyError('INVALID_OPTION', `Store URL "${redactUrl(url)}" is not usable: ${detail}.`)
}

/** A store the CLI opened, with what it takes to set up its schema. */
export interface OpenedStore {
  store: IdempotencyStore
  spec: StoreSpec
  /** Creates or upgrades the schema; returns what it did, in words. */
  migrate(): Promise<string>
}

interface MigratableStore extends IdempotencyStore {
  migrate?: () => Promise<unknown>
}

/**
 * Opens the store a URL names. PostgreSQL, MySQL and Redis are loaded only when asked for, so the CLI
 * runs without `pg`, `mysql2` or `ioredis` installed; a missing driver says what to install.
 */
export async function openStore(url: string): Promise<OpenedStore> {
  const spec = parseStoreUrl(url)
  const store = await construct(spec)
  return {
    store,
    spec,
    migrate: async () => {
      const migratable = store as MigratableStore
      if (typeof migratable.migrate === 'function') {
        await migratable.migrate()
        return `schema of ${describeStore(spec)} is up to date`
      }
      if (spec.kind === 'redis') {
        // Nothing to create, but a deploy step that runs migrate learns whether the store answers:
        // a wrong port or host is an error here, not a success that the first request finds out.
        await store.get('idemkey', 'migrate-probe')
        return `${describeStore(spec)} needs no schema`
      }
      if (spec.kind === 'memory') return 'memory: keeps nothing between runs and needs no schema'
      // SqliteStore creates and upgrades its table when it opens the file.
      return `schema of ${describeStore(spec)} is up to date`
    },
  }
}

async function construct(spec: StoreSpec): Promise<IdempotencyStore> {
  const { location } = spec
  switch (spec.kind) {
    case 'memory': {
      const { MemoryStore } = await import('../backends/memory/index.js')
      return new MemoryStore()
    }
    case 'sqlite': {
      // node:sqlite is built in: nothing to load first. better-sqlite3 is loaded only when the URL asks for it.
      const mod = (await (spec.driver === 'better-sqlite3'
        ? importStore('../backends/sqlite/index.js', spec)
        : import('../backends/sqlite/index.js'))) as {
        SqliteStore: new (options: { path: string; table?: string; open?: (path: string) => unknown }) => IdempotencyStore
      }
      if (spec.driver !== 'better-sqlite3') return new mod.SqliteStore({ path: spec.path, ...location })
      const driver: string = STORE_DRIVERS.sqlite
      const Database = ((await import(driver)) as { default: new (path: string) => unknown }).default
      return new mod.SqliteStore({ path: spec.path, ...location, open: (path) => new Database(path) })
    }
    case 'postgres': {
      const mod = (await importStore('../backends/postgres/index.js', spec)) as {
        PostgresStore: new (options: {
          connectionString: string
          schema?: string
          table?: string
          layout?: 'plain' | 'partitioned'
          partitionInterval?: string
        }) => IdempotencyStore
      }
      const { layout: given, ...rest } = location
      // No ?layout=: the table's own, so `migrate` upgrades a partitioned table as it is (a store told
      // 'plain' refuses it) and `gc` rotates its partitions instead of deleting rows.
      const layout = given ?? (await existingPostgresTable(spec))?.layout
      return new mod.PostgresStore({
        connectionString: spec.url,
        ...rest,
        ...(layout === undefined ? {} : { layout: layout as 'plain' | 'partitioned' }),
      })
    }
    case 'mysql': {
      const mod = (await importStore('../backends/mysql/index.js', spec)) as {
        MySqlStore: new (options: { uri: string; table?: string }) => IdempotencyStore
      }
      return new mod.MySqlStore({ uri: spec.url, ...location })
    }
    case 'redis': {
      const mod = (await importStore('../backends/redis/index.js', spec)) as {
        RedisStore: new (options: { url: string; prefix?: string }) => IdempotencyStore
      }
      return new mod.RedisStore({ url: spec.url, ...location })
    }
    case 'dynamodb': {
      const mod = (await importStore('../backends/dynamodb/index.js', spec)) as {
        DynamoDbStore: new (options: { table: string; keyPrefix?: string; clientConfig?: Record<string, unknown> }) => IdempotencyStore
      }
      const parsed = new URL(spec.url)
      const clientConfig: Record<string, unknown> = {}
      const region = parsed.searchParams.get('region')
      const endpoint = parsed.searchParams.get('endpoint')
      if (region) clientConfig.region = region
      if (endpoint) clientConfig.endpoint = endpoint
      return new mod.DynamoDbStore({ table: parsed.hostname, clientConfig, ...(location.prefix ? { keyPrefix: location.prefix } : {}) })
    }
  }
}

/** The npm package each store's driver comes from (SQLite's default, node:sqlite, is built in; this is the alternative). */
export const STORE_DRIVERS = {
  sqlite: 'better-sqlite3',
  postgres: 'pg',
  mysql: 'mysql2',
  redis: 'ioredis',
  dynamodb: '@aws-sdk/client-dynamodb',
} as const

/**
 * The layout of the PostgreSQL table a `postgres://` store URL names (its `?schema=` and `?table=`),
 * or undefined when there is none, or no answer: the store's own first operation then reports why,
 * in its words. One short connection of its own.
 */
export async function existingPostgresTable(spec: StoreSpec): Promise<TableLayout | undefined> {
  if (spec.kind !== 'postgres') return undefined
  const driver: string = STORE_DRIVERS.postgres
  const pg = (await import(driver).catch((error: unknown) => {
    throw driverError('postgres', driver, error)
  })) as { default: { Client: new (config: object) => PgQueryable & PgConnection } }
  const client = new pg.default.Client({ connectionString: spec.url, connectionTimeoutMillis: 5_000 })
  try {
    await client.connect()
    return await tableLayout(client, spec.location.schema ?? 'public', spec.location.table ?? 'idemkey_records')
  } catch {
    return undefined
  } finally {
    await client.end().catch(() => {})
  }
}

interface PgConnection {
  connect(): Promise<unknown>
  end(): Promise<unknown>
}

/**
 * Loads a store module after its driver, so a missing driver is named with the command that installs
 * it, before any store code runs. Both are imported by a computed name: the CLI compiles and runs
 * without the optional drivers.
 */
async function importStore(modulePath: string, spec: StoreSpec & { kind: keyof typeof STORE_DRIVERS }): Promise<unknown> {
  const driver: string = STORE_DRIVERS[spec.kind]
  try {
    await import(driver)
  } catch (error) {
    throw driverError(spec.kind, driver, error)
  }
  const specifier: string = modulePath
  return import(specifier)
}

/** Says what to do about a driver that did not load: install it, or rebuild its native part. */
export function driverError(kind: string, driver: string, error: unknown): Error {
  const code = (error as { code?: string }).code
  const message = (error as Error).message ?? String(error)
  if ((code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') && message.includes(`'${driver}'`)) {
    return new IdempotencyError(
      'INVALID_OPTION',
      `The ${kind} store needs the ${driver} package, which is not installed where idemkey is. Install it beside idemkey: npm i ${driver} (or, for a one-off run: npx -p idemkey -p ${driver} idemkey …).`,
      { cause: error },
    )
  }
  if (/bindings file|NODE_MODULE_VERSION|\.node\b|invalid ELF|wrong ELF/i.test(message)) {
    return new IdempotencyError(
      'INVALID_OPTION',
      `The ${kind} store's driver ${driver} is installed, but its native module did not load (${message.split('\n')[0]}). Rebuild it for this Node.js (${process.version}): npm rebuild ${driver}.`,
      { cause: error },
    )
  }
  return error instanceof Error ? error : new Error(message)
}

/** A store URL without its password, for messages and logs, with its location parameters. */
export function describeStore(spec: StoreSpec): string {
  const query = new URLSearchParams(Object.entries(spec.location) as Array<[string, string]>).toString()
  const withQuery = (text: string) => (query ? `${text}?${query}` : text)
  if (spec.kind === 'memory' || spec.kind === 'sqlite') return withQuery(spec.url)
  try {
    const parsed = new URL(spec.url)
    if (parsed.password) parsed.password = '***'
    for (const [name, value] of Object.entries(spec.location)) parsed.searchParams.set(name, value as string)
    return parsed.toString()
  } catch {
    return `${spec.kind}://…`
  }
}

/** Whether the store decides time on its server (shared by several machines), from its URL alone. */
export function isServerClockStore(spec: StoreSpec): boolean {
  return spec.kind === 'postgres' || spec.kind === 'mysql' || spec.kind === 'redis'
}
