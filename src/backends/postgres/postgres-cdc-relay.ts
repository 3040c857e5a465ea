/**
 * The CDC relay: publishes outbox inserts read from PostgreSQL's logical replication stream (a
 * pgoutput slot and a publication on the outbox table) instead of polling the table.
 */
import { hostname } from 'node:os'
import { type Duration, formatDuration, parseDuration, parsePositiveDuration } from '../../core/duration.js'
import { assertFunctions, assertMethods, assertOptionalPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { fitPgName, type OutboxMessage, type Publisher, quoteName } from '../../messaging/message.js'
import type { PgConnectionConfig } from './pool.js'
import { type CdcPublishEvent, CdcPublishLoop } from './postgres-cdc-publish-loop.js'
import {
  CdcStream,
  loadReplication,
  lsnToBigInt,
  ReplicationSlotInUseError,
  replicationConnection,
  STATUS_INTERVAL_MS,
  slotError,
} from './postgres-cdc-stream.js'
import { DEFAULT_MAX_LAG_BYTES, type PgCdcRelayHealth, ReplicationSlotLagError, slotProblem } from './slot-health.js'

/** What the CDC relay reports: the polling relay's events, plus where it stands on the slot. */
export type PgCdcRelayEvent =
  | CdcPublishEvent
  /** This relay holds the slot and streams from it. */
  | { type: 'streaming'; relayId: string; slot: string }
  /** Another relay holds the slot: this one waits and tries again every `standbyRetry`. */
  | { type: 'standby'; relayId: string; slot: string; error: ReplicationSlotInUseError }
  /** The slot's confirmed position moved: everything before `lsn` is confirmed by the broker. */
  | { type: 'confirmed'; relayId: string; lsn: string }

/**
 * A `pg` client config.
 * @deprecated The same as `PgConnectionConfig` of `idemkey/postgres`.
 */
export type PgCdcConnectionConfig = PgConnectionConfig

/** Options of {@link PgCdcRelay}. */
export interface PgCdcRelayOptions {
  /** How to reach PostgreSQL: a URL or a `pg` client config. The relay opens its own connections (one replication, one plain). */
  connection: string | PgConnectionConfig
  publisher: Publisher
  /** The outbox table (`PgOutbox`'s `table`), optionally `schema.table`. @default 'idemkey_outbox' */
  table?: string
  /** Replication slot name (lowercase letters, digits, underscore). @default 'idemkey_cdc_<table>' */
  slot?: string
  /** Publication name. @default the slot name */
  publication?: string
  /** Most messages published per broker round trip. @default 256 */
  batchSize?: number
  /** Publish attempts before a message the broker keeps refusing is dead-lettered. @default 10 */
  maxAttempts?: number
  /** First retry delay; doubles per attempt, with jitter. @default '200ms' */
  backoffInitial?: Duration
  /** Longest retry delay. @default '30s' */
  backoffMax?: Duration
  /** How often a standby relay tries to take the slot, and a lost connection is retried. @default '2s' */
  standbyRetry?: Duration
  /**
   * How long a connection may answer nothing before the relay calls it half-open (a peer or network
   * gone without closing it) and replaces it. An idle relay asks the server for a keepalive every
   * second, so a healthy replication connection is never silent this long; the relay's own queries
   * (`health()`, `ready()`, dead-lettering) fail after it instead of hanging. At least `'2s'` (two
   * pings). @default '30s'
   */
  silentConnectionTimeout?: Duration
  /** `ready()` fails when the slot holds more WAL than this, in bytes. @default 268435456 (256 MiB) */
  maxLagBytes?: number
  /** Names this relay in events. @default '<hostname>:<pid>:<random>' */
  relayId?: string
  onEvent?: (event: PgCdcRelayEvent) => void
}

export { lsnToBigInt, type PgCdcRelayHealth, ReplicationSlotInUseError, ReplicationSlotLagError }

type PgModule = typeof import('pg')
type PgClient = InstanceType<PgModule['Client']>

/** Reading the slot pauses while this many batches wait for the broker. */
const HIGH_WATER_BATCHES = 8
/** An idle relay pings every second; by default a connection that has answered nothing for 30 s is half-open, and replaced. */
const SILENT_CONNECTION_MS = 30_000

/**
 * Publishes outbox rows from PostgreSQL's logical replication stream: no claim query, no "sent"
 * UPDATE, no poll interval. Each committed insert on the outbox table goes to the publisher with its
 * message ID, in commit order, rows of one partition key one after another; rolled-back rows never
 * reach the stream. The slot's confirmed position moves past a transaction only after the broker
 * confirmed all of it and everything before it, so a relay that dies replays from there and the
 * broker's dedup and the consumer's inbox absorb the repeats.
 *
 * Needs `wal_level = logical` and the optional peer `pg-logical-replication`. One relay per slot
 * streams; others stand by ({@link ReplicationSlotInUseError}) and take over when it stops.
 *
 * @example
 * const relay = new PgCdcRelay({ connection: process.env.DATABASE_URL, publisher: new NatsPublisher({ connection: nc }) })
 * await relay.setup() // publication + slot; before the app writes events it must not miss
 * relay.start()
 * // on shutdown
 * await relay.stop()
 */
export class PgCdcRelay {
  readonly relayId: string
  readonly slot: string
  readonly publication: string
  /** `ready()` fails past this lag, in bytes (the option); the operator page marks the slot past it too. */
  readonly maxLagBytes: number
  readonly #connection: PgConnectionConfig
  readonly #table: string
  readonly #tableName: string
  readonly #batchSize: number
  readonly #standbyRetryMs: number
  readonly #silentConnectionMs: number
  readonly #onEvent: (event: PgCdcRelayEvent) => void
  #running: Promise<void> | undefined
  #stopping = false
  #stream: CdcStream | undefined
  readonly #publishLoop: CdcPublishLoop
  /** Backoff and standby sleeps, cut short by stop() or a closed stream. */
  readonly #sleepers = new Set<() => void>()
  #pg: Promise<PgModule> | undefined
  #queries: PgClient | undefined
  /** setup(), drop() and health() calls under way: the last to end outside start()/stop() closes #queries. */
  #outsideCalls = 0

  constructor(options: PgCdcRelayOptions) {
    if (!options?.connection || !options.publisher) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'PgCdcRelay needs { connection, publisher }: a PostgreSQL URL or pg config, and a publisher.',
      )
    }
    // A server that does not answer (down, or a black-holed address) fails the attempt instead of hanging it.
    this.#connection = {
      connectionTimeoutMillis: 10_000,
      ...(typeof options.connection === 'string' ? { connectionString: options.connection } : options.connection),
    }
    assertMethods('PgCdcRelay', 'publisher', options.publisher, ['publish'])
    assertFunctions('PgCdcRelay', { onEvent: options.onEvent })
    const table = options.table ?? 'idemkey_outbox'
    this.#table = quoteName(table, 'PgCdcRelay table')
    this.#tableName = table.slice(table.lastIndexOf('.') + 1)
    this.slot = options.slot ?? fitPgName('idemkey_cdc', table.replace('.', '_').toLowerCase(), table)
    if (!/^[a-z0-9_]{1,63}$/.test(this.slot)) {
      throw new IdempotencyError('INVALID_OPTION', `PgCdcRelay slot "${this.slot}" must be 1-63 lowercase letters, digits or underscores.`)
    }
    this.publication = options.publication ?? this.slot
    quoteName(this.publication, 'PgCdcRelay publication')
    assertOptionalPositiveInteger(options.batchSize, 'PgCdcRelay batchSize')
    assertOptionalPositiveInteger(options.maxAttempts, 'PgCdcRelay maxAttempts')
    this.#batchSize = options.batchSize ?? 256
    const maxAttempts = options.maxAttempts ?? 10
    // A first delay of 0 doubles to 0: every reconnect and retry would follow at once.
    const backoffInitialMs = parsePositiveDuration(options.backoffInitial ?? '200ms', 'backoffInitial')
    const backoffMaxMs = parseDuration(options.backoffMax ?? '30s', 'backoffMax')
    this.#standbyRetryMs = parsePositiveDuration(options.standbyRetry ?? '2s', 'standbyRetry')
    this.#silentConnectionMs = parseDuration(options.silentConnectionTimeout ?? SILENT_CONNECTION_MS, 'silentConnectionTimeout')
    if (this.#silentConnectionMs < 2 * STATUS_INTERVAL_MS) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        `PgCdcRelay silentConnectionTimeout must be at least ${2 * STATUS_INTERVAL_MS} ms (two of the relay's 1 s keepalive requests), ` +
          `got ${this.#silentConnectionMs} ms: a shorter one would replace healthy connections.`,
      )
    }
    this.maxLagBytes = options.maxLagBytes ?? DEFAULT_MAX_LAG_BYTES
    this.relayId = options.relayId ?? `${hostname()}:${process.pid}:${Math.random().toString(36).slice(2, 8)}`
    this.#onEvent = options.onEvent ?? (() => {})
    this.#publishLoop = new CdcPublishLoop({
      relayId: this.relayId,
      publisher: options.publisher,
      batchSize: this.#batchSize,
      maxAttempts,
      backoffInitialMs,
      backoffMaxMs,
      emit: (event) => this.#emit(event),
      markDead: (message, error) => this.#markDead(message, error),
      sleep: (ms) => this.#sleep(ms),
      stopping: () => this.#stopping,
    })
  }

  /**
   * Creates the publication (inserts only) and the slot when missing. Idempotent, safe from several
   * processes. Events committed before the slot exists are not streamed: run it before the app
   * writes events (or drain older rows with the polling relay once). Throws `STORE_SCHEMA` when
   * `wal_level` is not `logical`.
   */
  setup(): Promise<void> {
    return this.#closingAfter(() => this.#setup())
  }

  async #setup(): Promise<void> {
    const { rows } = await this.#query<{ wal_level: string }>('SHOW wal_level')
    if (rows[0]?.wal_level !== 'logical') {
      throw new IdempotencyError(
        'STORE_SCHEMA',
        `PgCdcRelay needs wal_level = logical, the server runs wal_level = ${rows[0]?.wal_level}. Set it (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL.`,
      )
    }
    const publication = await this.#query('SELECT 1 FROM pg_publication WHERE pubname = $1', [this.publication])
    if (publication.rows.length === 0) {
      await this.#query(
        `CREATE PUBLICATION ${quoteName(this.publication, 'publication')} FOR TABLE ${this.#table} WITH (publish = 'insert')`,
        [],
        true,
      ).catch(ignoreDuplicate)
    }
    const slot = await this.#query('SELECT 1 FROM pg_replication_slots WHERE slot_name = $1', [this.slot])
    if (slot.rows.length === 0) {
      await this.#query(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, [this.slot], true).catch(ignoreDuplicate)
    }
  }

  /**
   * Drops the slot and the publication: do it when retiring the relay, or the slot keeps WAL
   * forever. Fails while a relay streams from the slot.
   */
  drop(): Promise<void> {
    return this.#closingAfter(async () => {
      await this.#query('SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1', [this.slot], true)
      await this.#query(`DROP PUBLICATION IF EXISTS ${quoteName(this.publication, 'publication')}`, [], true)
    })
  }

  /** Starts streaming in the background; connection losses and a busy slot are retried. Errors go to `onEvent`. */
  start(): void {
    if (this.#running) return
    this.#stopping = false
    this.#running = this.#loop()
  }

  /** Finishes the batch in flight, confirms it, and stops. What was not published comes again from the slot. */
  async stop(): Promise<void> {
    this.#stopping = true
    this.#wakeAll()
    await this.#closeStream()
    await this.#running
    this.#running = undefined
    const queries = this.#queries
    this.#queries = undefined
    if (queries) await endWithin(queries, this.#silentConnectionMs)
  }

  /** The slot's lag and state (`pg_replication_slots`). */
  health(): Promise<PgCdcRelayHealth> {
    return this.#closingAfter(() => this.#health())
  }

  /**
   * Runs setup(), drop() or health(). Outside start()/stop(), the plain connection they open is closed
   * when the last of them ends, so a script that only calls them exits by itself. A running relay keeps
   * it for its own queries.
   */
  async #closingAfter<T>(work: () => Promise<T>): Promise<T> {
    this.#outsideCalls++
    try {
      return await work()
    } finally {
      this.#outsideCalls--
      const queries = this.#queries
      if (this.#outsideCalls === 0 && this.#running === undefined && queries) {
        this.#queries = undefined
        await endWithin(queries, this.#silentConnectionMs)
      }
    }
  }

  async #health(): Promise<PgCdcRelayHealth> {
    const { rows } = await this.#query<{
      active: boolean | null
      confirmed: string | null
      current: string
      lag: string | null
      wal_status: string | null
    }>(
      `SELECT s.active, s.confirmed_flush_lsn::text AS confirmed, pg_current_wal_lsn()::text AS current,
              pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint::text AS lag, s.wal_status
       FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`,
      [this.slot],
    )
    const row = rows[0]
    return {
      slot: this.slot,
      exists: row?.active !== null && row?.active !== undefined,
      active: row?.active === true,
      streaming: this.#stream !== undefined && !this.#stream.closed,
      confirmedLsn: row?.confirmed ?? null,
      currentLsn: row?.current ?? '0/0',
      lagBytes: Number(row?.lag ?? 0),
      walStatus: row?.wal_status ?? null,
    }
  }

  /**
   * Resolves when the slot exists, is not cut off, and lags at most `maxLagBytes`; rejects with a
   * {@link ReplicationSlotLagError} saying which. Pass it as `/readyz`'s probe.
   */
  async ready(): Promise<void> {
    const health = await this.health()
    const problem = slotProblem(health, this.maxLagBytes)
    if (problem === 'missing') throw new ReplicationSlotLagError(health, 'does not exist (run relay.setup())')
    if (problem === 'lost') throw new ReplicationSlotLagError(health, 'lost WAL it still needed (max_slot_wal_keep_size cut it off)')
    if (problem === 'lagging') {
      throw new ReplicationSlotLagError(health, `lags ${health.lagBytes} bytes of WAL, more than maxLagBytes (${this.maxLagBytes})`)
    }
  }

  async #loop(): Promise<void> {
    while (!this.#stopping) {
      try {
        await this.#streamOnce()
      } catch (error) {
        if (this.#stopping) break
        if (error instanceof ReplicationSlotInUseError) this.#emit({ type: 'standby', relayId: this.relayId, slot: this.slot, error })
        else this.#emit({ type: 'error', relayId: this.relayId, error })
      }
      if (!this.#stopping) await this.#sleep(this.#standbyRetryMs)
    }
  }

  /** One replication connection, from open to close: stream into the queue, publish from it. */
  async #streamOnce(): Promise<void> {
    const { LogicalReplicationService, PgoutputPlugin } = await loadReplication()
    const slot = await this.health()
    // Acknowledgements are ours alone: the library's automatic ones would confirm what the broker has not.
    const service = new LogicalReplicationService(
      replicationConnection(this.#connection, this.#silentConnectionMs) as ConstructorParameters<typeof LogicalReplicationService>[0],
      {
        acknowledge: { auto: false, timeoutSeconds: 0 },
      },
    )
    const stream = new CdcStream(service, {
      slot: this.slot,
      tableName: this.#tableName,
      silentConnectionMs: this.#silentConnectionMs,
      highWater: HIGH_WATER_BATCHES * this.#batchSize,
      confirmedLsn: slot.confirmedLsn,
      onConfirmed: (lsn) => this.#emit({ type: 'confirmed', relayId: this.relayId, lsn }),
      onError: (error) => this.#emit({ type: 'error', relayId: this.relayId, error }),
      onClose: () => this.#wakeAll(),
    })
    this.#stream = stream
    service.on('start', () => this.#emit({ type: 'streaming', relayId: this.relayId, slot: this.slot }))
    const plugin = new PgoutputPlugin({ protoVersion: 1, publicationNames: [this.publication] })
    const publishing = this.#publishLoop.run(stream)
    const status = setInterval(() => stream.tick(), STATUS_INTERVAL_MS)
    try {
      // '0/0': start at the slot's confirmed position. The library would resume from the last LSN it
      // received, which skips what was received but never confirmed by the broker.
      await service.subscribe(plugin, this.slot, '0/0')
    } catch (error) {
      if (!this.#stopping) throw slotError(this.slot, error)
    } finally {
      clearInterval(status)
      stream.closed = true
      this.#wakeAll()
      await publishing
      await service.stop().catch(() => {})
      if (this.#stream === stream) this.#stream = undefined
    }
  }

  /** The row stays in the table as the polling relay's dead letters do, for an operator to see; the stream moves on. */
  async #markDead(message: OutboxMessage, error: Error): Promise<void> {
    await this.#query(`UPDATE ${this.#table} SET status = 'dead', last_error = $2 WHERE id = $1`, [message.id, error.message]).catch(
      (cause: unknown) => this.#emit({ type: 'error', relayId: this.relayId, error: cause }),
    )
  }

  async #closeStream(): Promise<void> {
    const stream = this.#stream
    if (!stream) return
    // Let the batch in flight finish (and confirm) before the connection goes.
    while (stream.inFlight) await new Promise((resolve) => setTimeout(resolve, 10))
    stream.closed = true
    this.#wakeAll()
    await stream.service.stop().catch(() => {})
  }

  #wakeAll(): void {
    this.#stream?.wake()
    for (const wake of [...this.#sleepers]) wake()
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer)
        this.#sleepers.delete(done)
        resolve()
      }
      const timer = setTimeout(done, ms)
      this.#sleepers.add(done)
    })
  }

  /**
   * A query on the relay's plain connection. One that gets no answer within `silentConnectionTimeout`
   * fails and its connection is replaced (a half-open one would hang it, and `stop()` behind it, for
   * ever); `untimed` is for DDL that may rightly wait (slot creation waits for running transactions).
   */
  async #query<R = Record<string, unknown>>(
    sql: string,
    values?: unknown[],
    untimed = false,
  ): Promise<{ rows: R[]; rowCount: number | null }> {
    try {
      if (!this.#queries) {
        this.#pg ??= loadPg()
        const pg = await this.#pg
        const client = new pg.Client(this.#connection as ConstructorParameters<PgModule['Client']>[0])
        client.on('error', () => {
          if (this.#queries === client) this.#queries = undefined
        })
        this.#queries = client
        await client.connect().catch((error: unknown) => {
          this.#queries = undefined
          throw error
        })
      }
      const query = { text: sql, values, query_timeout: untimed ? undefined : this.#silentConnectionMs }
      return (await this.#queries.query(query)) as unknown as { rows: R[]; rowCount: number | null }
    } catch (error) {
      const client = this.#queries
      this.#queries = undefined
      await client?.end().catch(() => {})
      if (error instanceof IdempotencyError) throw error
      const why =
        (error as Error)?.message === 'Query read timeout'
          ? `got no answer within ${formatDuration(this.#silentConnectionMs)} (silentConnectionTimeout); the connection is taken as half-open and replaced`
          : `failed: ${(error as Error).message}`
      throw new IdempotencyError('STORE_UNAVAILABLE', `PgCdcRelay on slot "${this.slot}": ${sql.split(/\s/)[0]} ${why}.`, { cause: error })
    }
  }

  #emit(event: PgCdcRelayEvent): void {
    try {
      this.#onEvent(event)
    } catch {
      // A throwing metrics hook must not stop the relay.
    }
  }
}

function ignoreDuplicate(error: unknown): void {
  // Another process created it between our check and our CREATE.
  const code = ((error as { cause?: { code?: string } }).cause ?? (error as { code?: string }))?.code
  if (code !== '42710') throw error
}

/**
 * Ends a client politely, or drops its socket when the server does not see the goodbye through: on a
 * half-open connection `end()` waits for ever for the server's close.
 */
async function endWithin(client: PgClient, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined
  const ended = await Promise.race([
    client.end().then(
      () => true,
      () => true,
    ),
    new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), ms)
    }),
  ])
  clearTimeout(timer)
  if (!ended) (client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy()
}

async function loadPg(): Promise<PgModule> {
  try {
    const mod = (await import('pg')) as unknown as { default?: PgModule } & PgModule
    return mod.default ?? mod
  } catch (error) {
    throw new IdempotencyError('INVALID_OPTION', 'PgCdcRelay needs the pg package: npm install pg', { cause: error })
  }
}
