/**
 * `idemkey doctor`'s reading: connects to the server a store URL names (its driver loaded on demand, one
 * short connection, bounded by a timeout) and hands it to that backend's durability reader. A server
 * that does not answer gives a report with every failure unchecked, never an error that hides which.
 */
import { existsSync } from 'node:fs'
import { dynamoDbDurabilityReport } from '../../backends/dynamodb/durability-report.js'
import { mysqlDurabilityReport } from '../../backends/mysql/durability-report.js'
import { postgresDurabilityReport } from '../../backends/postgres/durability-report.js'
import { redisDurabilityReport } from '../../backends/redis/durability-report.js'
import { type SqliteDurabilityOptions, sqliteDurabilityReport } from '../../backends/sqlite/durability-report.js'
import { type DurabilityReport, FAILURES, finding, unreachableReport } from '../../core/durability.js'
import { CliError } from '../run.js'
import { driverError, STORE_DRIVERS, type StoreSpec } from '../store-url.js'

/** What the doctor needs besides the URL. */
export interface ReadOptions {
  /** Replicas the app's RedisStore waits for (its durability option). */
  waitReplicas?: number
  /** The synchronous level of the app's SQLite connection. */
  synchronous?: SqliteDurabilityOptions['synchronous']
  /** How long to wait for the server. @default 5000 */
  timeoutMs?: number
}

/** The report for the store `spec` names; a server that cannot be reached gives every row unchecked. */
export async function readDurability(spec: StoreSpec, options: ReadOptions = {}): Promise<DurabilityReport> {
  const timeoutMs = options.timeoutMs ?? 5_000
  switch (spec.kind) {
    case 'memory':
      return {
        store: 'memory',
        findings: FAILURES.map((failure) =>
          failure === 'expiry'
            ? finding(failure, 'safe', 'records leave only after their ttl')
            : finding(
                failure,
                failure === 'eviction' ? 'n/a' : 'loses',
                'every record: memory: keeps nothing outside the process',
                'a server store (postgres://, mysql://, redis://) or sqlite:PATH',
              ),
        ),
        unchecked: [],
        notes: [],
      }
    case 'sqlite':
      return readSqlite(spec.path, options)
    case 'redis':
      return reach('redis', () => readRedis(spec.url, options, timeoutMs))
    case 'postgres':
      return reach('postgres', () => readPostgres(spec, timeoutMs))
    case 'mysql':
      return reach('mysql', () => readMysql(spec.url, timeoutMs))
    case 'dynamodb':
      return reach('dynamodb', () => readDynamoDb(spec, timeoutMs))
  }
}

/** Runs a reader; a failure to connect (not a missing driver) becomes an all-unchecked report. */
async function reach(store: string, read: () => Promise<DurabilityReport>): Promise<DurabilityReport> {
  try {
    return await read()
  } catch (error) {
    if (error instanceof CliError) throw error
    const message = error instanceof Error ? error.message || (error as { code?: string }).code || error.name : String(error)
    return unreachableReport(store, `could not reach the server (${message})`)
  }
}

async function load<T>(kind: keyof typeof STORE_DRIVERS, name: string = STORE_DRIVERS[kind]): Promise<T> {
  try {
    return (await import(name)) as T
  } catch (error) {
    const failure = driverError(kind, name, error)
    throw new CliError(failure.message, 2)
  }
}

function readSqlite(path: string, options: ReadOptions): Promise<DurabilityReport> {
  if (path === ':memory:' || !existsSync(path)) {
    throw new CliError(
      `No SQLite file at ${path}: the doctor reads an existing store (idemkey migrate --store sqlite:${path} creates one).`,
      2,
    )
  }
  return import('node:sqlite').then(({ DatabaseSync }) => {
    const db = new DatabaseSync(path, { readOnly: true })
    try {
      const row = db.prepare('PRAGMA journal_mode').get() as { journal_mode: string }
      return sqliteDurabilityReport(row.journal_mode, options.synchronous ? { synchronous: options.synchronous } : {})
    } finally {
      db.close()
    }
  })
}

interface IoRedis {
  call(command: string, ...args: string[]): Promise<unknown>
  connect(): Promise<void>
  disconnect(): void
  on(event: 'error', listener: (error: Error) => void): unknown
}

async function readRedis(url: string, options: ReadOptions, timeoutMs: number): Promise<DurabilityReport> {
  const mod = await load<{ Redis: new (url: string, options: object) => IoRedis }>('redis')
  const redis = new mod.Redis(url, {
    lazyConnect: true,
    connectTimeout: timeoutMs,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    enableOfflineQueue: false,
  })
  // ioredis reports a refused connection as "Connection is closed."; the error event says why.
  let cause: Error | undefined
  redis.on('error', (error: Error) => {
    cause ??= error
  })
  try {
    await redis.connect().catch((error: Error) => {
      throw cause ?? error
    })
    return await redisDurabilityReport((command, ...args) => redis.call(command, ...args), {
      ...(options.waitReplicas === undefined ? {} : { waitReplicas: options.waitReplicas }),
    })
  } finally {
    redis.disconnect()
  }
}

async function readPostgres(spec: StoreSpec, timeoutMs: number): Promise<DurabilityReport> {
  type Client = { connect(): Promise<unknown>; end(): Promise<unknown>; on(e: 'error', l: () => void): unknown }
  const pg = await load<{ default: { Client: new (config: object) => Client } }>('postgres')
  const client = new pg.default.Client({ connectionString: spec.url, connectionTimeoutMillis: timeoutMs })
  client.on('error', () => {})
  try {
    await client.connect()
    return await postgresDurabilityReport(client as never, {
      ...(spec.location.schema ? { schema: spec.location.schema } : {}),
      ...(spec.location.table ? { table: spec.location.table } : {}),
    })
  } finally {
    await client.end().catch(() => {})
  }
}

async function readMysql(url: string, timeoutMs: number): Promise<DurabilityReport> {
  type Connection = { query(sql: string): Promise<[unknown, unknown]>; end(): Promise<void> }
  const mysql = await load<{ default: { createConnection(config: object): Promise<Connection> } }>('mysql', 'mysql2/promise')
  const connection = await mysql.default.createConnection({ uri: url, connectTimeout: timeoutMs })
  try {
    return await mysqlDurabilityReport(async (sql) => (await connection.query(sql))[0] as Array<Record<string, unknown>>)
  } finally {
    await connection.end().catch(() => {})
  }
}

async function readDynamoDb(spec: StoreSpec, timeoutMs: number): Promise<DurabilityReport> {
  type Sdk = Record<string, new (input: object) => unknown> & {
    DynamoDBClient: new (config: object) => { send(command: unknown): Promise<Record<string, unknown>>; destroy(): void }
  }
  const sdk = await load<Sdk>('dynamodb')
  const parsed = new URL(spec.url)
  const region = parsed.searchParams.get('region')
  const endpoint = parsed.searchParams.get('endpoint')
  const client = new sdk.DynamoDBClient({
    ...(region ? { region } : {}),
    ...(endpoint ? { endpoint } : {}),
    maxAttempts: 1,
    requestHandler: { connectionTimeout: timeoutMs, requestTimeout: timeoutMs },
  })
  try {
    // DescribeTable first: an endpoint that does not answer is unreachable, not three unchecked calls.
    await client
      .send(new (sdk.DescribeTableCommand as new (input: object) => unknown)({ TableName: parsed.hostname }))
      .catch((error: Error) => {
        const code = (error as { code?: string }).code ?? ''
        if (
          /^E[A-Z]+$/.test(code) ||
          /\b(ECONNREFUSED|ENOTFOUND|ETIMEDOUT|ECONNRESET)\b/.test(error.message) ||
          error.name === 'TimeoutError'
        ) {
          throw error
        }
      })
    return await dynamoDbDurabilityReport(
      (operation, input) => client.send(new (sdk[`${operation}Command`] as new (input: object) => unknown)(input)),
      { table: parsed.hostname },
    )
  } finally {
    client.destroy()
  }
}
