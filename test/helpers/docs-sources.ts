/**
 * What the docs tests share (test/docs-examples.test.ts, test/docs-quick-starts.test.ts): the source file
 * behind every `idemkey/*` specifier, and a fresh database or a clean NATS for each example that runs.
 */
import { randomUUID } from 'node:crypto'
import { existsSync, readFileSync, rmdirSync, rmSync } from 'node:fs'
import { dirname, join } from 'node:path'
import mysql from 'mysql2/promise'
import { connect } from 'nats'
import pg from 'pg'
import { fromRoot } from '../fixtures/docs/examples.js'

const PG_ADMIN_URL = process.env.IDEMKEY_PG_URL ?? 'postgres://root@127.0.0.1:5432/test'
const MYSQL_ADMIN_URL = process.env.IDEMKEY_MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test'
const NATS_SERVER = '127.0.0.1:4222'

/** The JetStream streams docs/quick-starts/ create: test/docs-quick-starts.test.ts deletes each after its page ran. */
export const QUICK_START_STREAMS = ['DEMO']

/** The file an `exports` entry points an ESM importer at: a string, or its `import`, `types` or `default` condition, nested or not. */
export function builtFile(target: unknown): string | undefined {
  if (typeof target === 'string') return target
  if (typeof target !== 'object' || target === null) return undefined
  const conditions = target as Record<string, unknown>
  for (const condition of ['import', 'types', 'default', 'node']) {
    const found = builtFile(conditions[condition])
    if (found !== undefined) return found
  }
  return undefined
}

/** `idemkey` and `idemkey/<subpath>` → the source file behind each entry of package.json's `exports`. */
export function sourcePaths(ROOT: string): { paths: Record<string, string[]>; missing: string[] } {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { name: string; exports: Record<string, unknown> }
  const paths: Record<string, string[]> = {}
  const missing: string[] = []
  for (const [subpath, target] of Object.entries(pkg.exports)) {
    if (subpath === './package.json') continue
    const built = builtFile(target)
    const specifier = subpath === '.' ? pkg.name : `${pkg.name}/${subpath.slice(2)}`
    if (built === undefined) {
      missing.push(`${specifier}: no types, import or default condition in package.json's exports`)
      continue
    }
    const source = join(ROOT, built.replace(/^\.\/dist\/(?:cjs\/|esm\/)?/, 'src/').replace(/\.d\.[cm]?ts$|\.[cm]?js$/, '.ts'))
    if (!existsSync(source)) missing.push(`${specifier}: package.json exports ${built}, but ${fromRoot(ROOT, source)} does not exist`)
    paths[specifier] = [source]
  }
  return { paths, missing }
}

/** A new, empty database, and the way to drop it. */
export async function freshPostgresDatabase(): Promise<{ url: string; drop: () => Promise<void> }> {
  const database = `idemkey_docs_${randomUUID().replaceAll('-', '').slice(0, 12)}`
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: PG_ADMIN_URL })
    await client.connect()
    try {
      await client.query(sql)
    } finally {
      await client.end()
    }
  }
  await admin(`CREATE DATABASE ${database}`)
  const url = new URL(PG_ADMIN_URL)
  url.pathname = `/${database}`
  return { url: url.toString(), drop: () => admin(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`) }
}

/** A new, empty MySQL/MariaDB database, and the way to drop it. */
export async function freshMysqlDatabase(): Promise<{ url: string; drop: () => Promise<void> }> {
  const database = `idemkey_docs_${randomUUID().replaceAll('-', '').slice(0, 12)}`
  const admin = async (sql: string) => {
    const connection = await mysql.createConnection({ uri: MYSQL_ADMIN_URL })
    try {
      await connection.query(sql)
    } finally {
      await connection.end()
    }
  }
  await admin(`CREATE DATABASE \`${database}\``)
  const url = new URL(MYSQL_ADMIN_URL)
  url.pathname = `/${database}`
  return { url: url.toString(), drop: () => admin(`DROP DATABASE IF EXISTS \`${database}\``) }
}

/**
 * Notes the JetStream streams there are now; the function it returns deletes the streams created since,
 * except the IDEMKEY_… ones of the messaging suites and those the quick starts name (`keep`), which may be
 * in use by a test running beside this one.
 */
export async function deleteNewNatsStreams(keep: readonly string[] = QUICK_START_STREAMS): Promise<() => Promise<void>> {
  const streams = async () => {
    const connection = await connect({ servers: NATS_SERVER })
    const names: string[] = []
    const jsm = await connection.jetstreamManager()
    for await (const name of jsm.streams.names()) names.push(name)
    return { connection, jsm, names }
  }
  const before = await streams()
  await before.connection.close()
  return async () => {
    const after = await streams()
    const created = after.names.filter((name) => !before.names.includes(name) && !name.startsWith('IDEMKEY_') && !keep.includes(name))
    for (const name of created) await after.jsm.streams.delete(name)
    await after.connection.close()
  }
}

/** Deletes these JetStream streams, those that exist. */
export async function deleteNatsStreams(names: readonly string[]): Promise<void> {
  const connection = await connect({ servers: NATS_SERVER })
  try {
    const jsm = await connection.jetstreamManager()
    for (const name of names) await jsm.streams.delete(name).catch(() => false)
  } finally {
    await connection.close()
  }
}

/**
 * Removes a run's folder of written examples, and .docs-examples/ above it unless another run uses it;
 * `IDEMKEY_KEEP_DOCS_EXAMPLES=1` keeps them and says where (`what` names them in that line).
 */
export function removeExamplesDir(dir: string | undefined, what: string): void {
  if (!dir) return
  if (process.env.IDEMKEY_KEEP_DOCS_EXAMPLES === '1') {
    console.log(`${what} kept in ${dir}`)
    return
  }
  rmSync(dir, { recursive: true, force: true })
  try {
    rmdirSync(dirname(dir))
  } catch {}
}
