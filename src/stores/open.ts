import type { IdempotencyStore } from '../core/store.js'
import { IdempotencyError } from '../errors.js'

/** The store every command uses when `--store` is not given. */
export const DEFAULT_STORE_URL = 'sqlite:idemkey.db'

/** What the CLI understands of a store URL, before anything is opened. */
export type StoreSpec =
  | { kind: 'memory'; url: string }
  | { kind: 'sqlite'; url: string; path: string }
  | { kind: 'postgres'; url: string }
  | { kind: 'redis'; url: string }
  | { kind: 'mysql'; url: string }

const EXPECTED =
  'expected memory:, sqlite:PATH (e.g. sqlite:idemkey.db), postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB or redis://HOST:PORT (rediss:// for TLS)'

/**
 * Reads a store URL without opening anything; throws `INVALID_OPTION` saying what is expected.
 *
 * @example parseStoreUrl('sqlite:data/idemkey.db') // { kind: 'sqlite', path: 'data/idemkey.db', … }
 */
export function parseStoreUrl(url: string): StoreSpec {
  const text = url.trim()
  if (text === 'memory:' || text === 'memory') return { kind: 'memory', url: 'memory:' }
  if (text.startsWith('sqlite:')) {
    const path = text.slice('sqlite:'.length).replace(/^\/\/(?=\/)/, '')
    if (path.length === 0) throw invalid(url, 'sqlite: needs a file path after the colon, e.g. sqlite:idemkey.db or sqlite::memory:')
    return { kind: 'sqlite', url: text, path }
  }
  if (/^postgres(ql)?:\/\//.test(text)) {
    checkUrl(url, text)
    return { kind: 'postgres', url: text }
  }
  if (/^(mysql|mariadb):\/\//.test(text)) {
    checkUrl(url, text)
    // mysql2 reads mysql:// URIs; mariadb:// is the same server to a user.
    return { kind: 'mysql', url: text.replace(/^mariadb:/, 'mysql:') }
  }
  if (/^rediss?:\/\//.test(text)) {
    checkUrl(url, text)
    return { kind: 'redis', url: text }
  }
  throw invalid(url, EXPECTED)
}

function checkUrl(original: string, text: string): void {
  try {
    const parsed = new URL(text)
    if (!parsed.hostname) throw new Error('no host')
  } catch {
    throw invalid(original, `it is not a valid URL with a host; ${EXPECTED}`)
  }
}

function invalid(url: string, detail: string): IdempotencyError {
  return new IdempotencyError('INVALID_OPTION', `Store URL "${url}" is not usable: ${detail}.`)
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
      if (spec.kind === 'redis') return `${describeStore(spec)} needs no schema`
      if (spec.kind === 'memory') return 'memory: keeps nothing between runs and needs no schema'
      // SqliteStore creates and upgrades its table when it opens the file.
      return `schema of ${describeStore(spec)} is up to date`
    },
  }
}

async function construct(spec: StoreSpec): Promise<IdempotencyStore> {
  switch (spec.kind) {
    case 'memory': {
      const { MemoryStore } = await import('./memory/index.js')
      return new MemoryStore()
    }
    case 'sqlite': {
      const mod = (await importDriver('./sqlite/index.js', 'better-sqlite3', spec)) as {
        SqliteStore: new (options: { path: string }) => IdempotencyStore
      }
      return new mod.SqliteStore({ path: spec.path })
    }
    case 'postgres': {
      const mod = (await importDriver('./postgres/index.js', 'pg', spec)) as {
        PostgresStore: new (options: { connectionString: string }) => IdempotencyStore
      }
      return new mod.PostgresStore({ connectionString: spec.url })
    }
    case 'mysql': {
      const mod = (await importDriver('./mysql/index.js', 'mysql2', spec)) as {
        MySqlStore: new (options: { uri: string }) => IdempotencyStore
      }
      return new mod.MySqlStore({ uri: spec.url })
    }
    case 'redis': {
      const mod = (await importDriver('./redis/index.js', 'ioredis', spec)) as {
        RedisStore: new (options: { url: string }) => IdempotencyStore
      }
      return new mod.RedisStore({ url: spec.url })
    }
  }
}

/** The store modules are imported by a computed name, so the CLI compiles and runs without the optional ones. */
async function importDriver(modulePath: string, driver: string, spec: StoreSpec): Promise<unknown> {
  const specifier: string = modulePath
  try {
    return await import(specifier)
  } catch (error) {
    const code = (error as { code?: string }).code
    const message = (error as Error).message ?? String(error)
    if ((code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') && message.includes(driver)) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `The ${spec.kind} store needs the "${driver}" package, which is not installed. Run: npm install ${driver}`,
        { cause: error },
      )
    }
    if (code === 'ERR_MODULE_NOT_FOUND') {
      throw new IdempotencyError('INVALID_OPTION', `This build of idemkey has no ${spec.kind} store (${message}).`, { cause: error })
    }
    throw error
  }
}

/** A store URL without its password, for messages and logs. */
export function describeStore(spec: StoreSpec): string {
  if (spec.kind === 'memory' || spec.kind === 'sqlite') return spec.url
  try {
    const parsed = new URL(spec.url)
    if (parsed.password) parsed.password = '***'
    return parsed.toString()
  } catch {
    return `${spec.kind}://…`
  }
}

/** Whether the store decides time on its server (shared by several machines), from its URL alone. */
export function isServerClockStore(spec: StoreSpec): boolean {
  return spec.kind === 'postgres' || spec.kind === 'mysql' || spec.kind === 'redis'
}
