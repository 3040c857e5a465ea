/**
 * The CDC relay: publishes outbox inserts read from PostgreSQL's logical replication stream (a
 * pgoutput slot and a publication on the outbox table) instead of polling the table.
 */
import { hostname } from 'node:os'
import type { LogicalReplicationService } from 'pg-logical-replication'
import { type Duration, formatDuration, parseDuration, parsePositiveDuration } from '../../core/duration.js'
import { assertFunctions, assertMethods, assertOptionalPositiveInteger } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import { fitPgName, type OutboxMessage, type Publisher, type PublishResult, quoteName } from '../../messaging/message.js'
import type { RelayEvent } from '../../messaging/outbox/relay.js'
import type { PgConnectionConfig } from './pool.js'
import { DEFAULT_MAX_LAG_BYTES, slotProblem } from './slot-health.js'

/** What the CDC relay reports: the polling relay's events, plus where it stands on the slot. */
export type PgCdcRelayEvent =
  | Extract<RelayEvent, { type: 'published' | 'failed' | 'error' }>
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

/** Where the slot stands: what `/readyz` and the operator want to know. */
export interface PgCdcRelayHealth {
  slot: string
  /** False when the slot does not exist (dropped, or `setup()` never ran). */
  exists: boolean
  /** Some relay streams from the slot now (this one or another). */
  active: boolean
  /** This relay is the one streaming. */
  streaming: boolean
  confirmedLsn: string | null
  currentLsn: string
  /** WAL the slot keeps that the broker has not confirmed yet, in bytes (`pg_current_wal_lsn() - confirmed_flush_lsn`). */
  lagBytes: number
  /** `pg_replication_slots.wal_status`: `lost` means `max_slot_wal_keep_size` cut the slot off (events were skipped). */
  walStatus: string | null
}

/**
 * Another relay streams from this slot. PostgreSQL lets one connection at a time read a slot, so two
 * relays never both publish: this one stands by and takes over when the other stops. Code `IN_PROGRESS`.
 */
export class ReplicationSlotInUseError extends IdempotencyError {
  readonly slot: string
  constructor(slot: string, cause: unknown) {
    super(
      'IN_PROGRESS',
      `Replication slot "${slot}" is being read by another relay (${(cause as Error)?.message ?? cause}). ` +
        'Only one relay per slot publishes; this one stands by and takes over when the other stops.',
      { cause },
    )
    this.slot = slot
  }
}

/** `ready()`'s failure: the slot is missing, cut off, or lags more than `maxLagBytes`. Code `STORE_UNAVAILABLE`. */
export class ReplicationSlotLagError extends IdempotencyError {
  readonly health: PgCdcRelayHealth
  constructor(health: PgCdcRelayHealth, why: string) {
    super(
      'STORE_UNAVAILABLE',
      `CDC relay slot "${health.slot}" ${why}. Check that a relay is running and the broker confirms its publishes; ` +
        'set max_slot_wal_keep_size so a stuck slot cannot fill the disk (docs/messaging.md, "CDC relay").',
    )
    this.health = health
  }
}

/** An item of the relay's queue: an outbox row, or the end of a transaction (the LSN to confirm once all before it is published). */
type Item = { message: OutboxMessage; ackLsn?: undefined } | { message?: undefined; ackLsn: string }

interface Stream {
  service: LogicalReplicationService
  /** Set when the connection ended: the batch in flight stops retrying, its rows come again from the slot. */
  closed: boolean
  /** When the server last sent anything (data or keepalive). */
  heardAt: number
}

type PgModule = typeof import('pg')
type PgClient = InstanceType<PgModule['Client']>

/**
 * LSN text (`16/B374D848`) as a number of bytes, for comparing.
 *
 * @example lsnToBigInt('1/0') // 4294967296n
 */
export function lsnToBigInt(lsn: string): bigint {
  const [high, low] = lsn.split('/')
  return (BigInt(`0x${high}`) << 32n) + BigInt(`0x${low}`)
}

function bigIntToLsn(value: bigint): string {
  return `${(value >> 32n).toString(16).toUpperCase()}/${(value & 0xffffffffn).toString(16).toUpperCase()}`
}

const HIGH_WATER_BATCHES = 8
const STATUS_INTERVAL_MS = 1_000
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
  readonly #publisher: Publisher
  readonly #table: string
  readonly #tableName: string
  readonly #batchSize: number
  readonly #maxAttempts: number
  readonly #backoffInitialMs: number
  readonly #backoffMaxMs: number
  readonly #standbyRetryMs: number
  readonly #silentConnectionMs: number
  readonly #onEvent: (event: PgCdcRelayEvent) => void
  #running: Promise<void> | undefined
  #stopping = false
  #stream: Stream | undefined
  #queue: Item[] = []
  #transaction: OutboxMessage[] | undefined
  #inFlight = false
  #confirmed = 0n
  /** Wakes the publish loop when the queue gets items or the stream closes. */
  #wake: (() => void) | undefined
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
    this.#publisher = options.publisher
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
    this.#maxAttempts = options.maxAttempts ?? 10
    // A first delay of 0 doubles to 0: every reconnect and retry would follow at once.
    this.#backoffInitialMs = parsePositiveDuration(options.backoffInitial ?? '200ms', 'backoffInitial')
    this.#backoffMaxMs = parseDuration(options.backoffMax ?? '30s', 'backoffMax')
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
   * when the last of them ends, so a script that only calls them exits by itself (it was held open until
   * a stop() such a script never calls). A running relay keeps it for its own queries.
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
    // Start from what the slot already confirmed (another relay may have moved it): a status update
    // must never report less, or the server would replay more than needed.
    const slot = await this.health()
    this.#confirmed = slot.confirmedLsn ? lsnToBigInt(slot.confirmedLsn) : 0n
    // Acknowledgements are ours alone: the library's automatic ones would confirm what the broker has not.
    const service = new LogicalReplicationService(
      this.#replicationConnection() as ConstructorParameters<typeof LogicalReplicationService>[0],
      {
        acknowledge: { auto: false, timeoutSeconds: 0 },
      },
    )
    const stream: Stream = { service, closed: false, heardAt: Date.now() }
    this.#stream = stream
    this.#queue = []
    this.#transaction = undefined
    service.on('error', () => {}) // the subscribe() promise carries the failure
    service.on('data', (_lsn: string, message: PgoutputMessage) => this.#receive(stream, message))
    service.on('heartbeat', (lsn: string, _time: number, shouldRespond: boolean) => this.#heartbeat(stream, lsn, shouldRespond))
    service.on('start', () => this.#emit({ type: 'streaming', relayId: this.relayId, slot: this.slot }))
    const plugin = new PgoutputPlugin({ protoVersion: 1, publicationNames: [this.publication] })
    const publishing = this.#publishLoop(stream)
    const status = setInterval(() => this.#tick(stream), STATUS_INTERVAL_MS)
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

  /**
   * The replication connection's config: the server's `wal_sender_timeout` set to
   * `silentConnectionTimeout`, so that the server, too, ends a connection gone silent (the relay
   * sends its status every second). Without it a half-open connection's walsender would hold the slot
   * until the server's own timeout (60 s by default), and the relay's new connection would stand by.
   */
  #replicationConnection(): PgConnectionConfig {
    const base = typeof this.#connection.options === 'string' ? this.#connection.options : process.env.PGOPTIONS
    const timeout = `-c wal_sender_timeout=${this.#silentConnectionMs}`
    return { ...this.#connection, options: base ? `${base} ${timeout}` : timeout }
  }

  /** Every second: tell the server where we stand (asking for a keepalive when idle), and drop a connection gone silent. */
  #tick(stream: Stream): void {
    const idle = this.#idle()
    if (idle && Date.now() - stream.heardAt > this.#silentConnectionMs) {
      this.#emit({
        type: 'error',
        relayId: this.relayId,
        error: new IdempotencyError(
          'STORE_UNAVAILABLE',
          `PgCdcRelay on slot "${this.slot}": the replication connection answered nothing for ${formatDuration(this.#silentConnectionMs)} ` +
            '(silentConnectionTimeout), so it is taken as half-open; reconnecting.',
        ),
      })
      stream.closed = true
      this.#wakeAll()
      void stream.service.stop().catch(() => {})
      return
    }
    this.#sendStatus(stream, idle)
  }

  #receive(stream: Stream, message: PgoutputMessage): void {
    if (stream.closed) return
    stream.heardAt = Date.now()
    if (message.tag === 'begin') this.#transaction = []
    else if (message.tag === 'insert' && message.relation.name === this.#tableName) this.#transaction?.push(toMessage(message.new))
    else if (message.tag === 'commit' && message.commitEndLsn) {
      for (const m of this.#transaction ?? []) this.#queue.push({ message: m })
      this.#queue.push({ ackLsn: message.commitEndLsn })
      this.#transaction = undefined
      this.#wake?.()
      // Backpressure: stop reading the socket while the broker is behind (PostgreSQL keeps the rest).
      if (this.#queue.length > HIGH_WATER_BATCHES * this.#batchSize) socketOf(stream.service)?.pause()
    }
  }

  /** A keepalive: when nothing is buffered or in flight, everything the server sent is done, so its position is confirmed. */
  #heartbeat(stream: Stream, lsn: string, shouldRespond: boolean): void {
    if (stream.closed) return
    stream.heardAt = Date.now()
    if (this.#idle() && this.#transaction === undefined) this.#advance(stream, lsn)
    else if (shouldRespond) this.#sendStatus(stream, false)
  }

  #idle(): boolean {
    return this.#queue.length === 0 && !this.#inFlight
  }

  async #publishLoop(stream: Stream): Promise<void> {
    while (!stream.closed) {
      if (this.#queue.length === 0) {
        await new Promise<void>((resolve) => {
          this.#wake = resolve
        })
        this.#wake = undefined
        continue
      }
      const items = this.#takeBatch()
      if (this.#queue.length <= this.#batchSize) socketOf(stream.service)?.resume()
      this.#inFlight = true
      try {
        const messages = items.flatMap((item) => (item.message ? [item.message] : []))
        const delivered = await this.#deliver(stream, messages)
        const ack = items.findLast((item) => item.ackLsn !== undefined)?.ackLsn
        if (delivered && ack) this.#advance(stream, ack)
      } catch (error) {
        this.#emit({ type: 'error', relayId: this.relayId, error })
      } finally {
        this.#inFlight = false
      }
    }
  }

  /** Up to `batchSize` messages from the front of the queue, with the transaction ends among them. */
  #takeBatch(): Item[] {
    let count = 0
    let end = 0
    while (end < this.#queue.length) {
      const item = this.#queue[end] as Item
      if (item.message) {
        if (count === this.#batchSize) break
        count++
      }
      end++
    }
    return this.#queue.splice(0, end)
  }

  /**
   * Publishes in waves: every message without a partition key at once, and the head of each
   * partition's chain; a retryable failure holds its chain (and the confirmed position) and is retried
   * with backoff, so a later event never overtakes an earlier one. Returns false when the connection
   * closed first: the slot will stream those rows again.
   */
  async #deliver(stream: Stream, batch: OutboxMessage[]): Promise<boolean> {
    const chains: OutboxMessage[][] = []
    const byKey = new Map<string, OutboxMessage[]>()
    for (const message of batch) {
      if (message.partitionKey === null) chains.push([message])
      else {
        const chain = byKey.get(message.partitionKey)
        if (chain) chain.push(message)
        else {
          const fresh = [message]
          byKey.set(message.partitionKey, fresh)
          chains.push(fresh)
        }
      }
    }
    const attempts = new Map<string, number>()
    const sent: OutboxMessage[] = []
    let retries = 0
    for (;;) {
      const active = chains.filter((chain) => chain.length > 0)
      if (active.length === 0) break
      const heads = active.map((chain) => chain[0] as OutboxMessage)
      const results = await this.#publish(heads.map((m) => ({ ...m, attempts: (attempts.get(m.id) ?? 0) + 1 })))
      let failed = false
      for (const [i, message] of heads.entries()) {
        const result = results[i] ?? { ok: false, error: new Error('the publisher returned no result for this message'), retryable: true }
        const chain = active[i] as OutboxMessage[]
        if (result.ok) {
          sent.push(message)
          chain.shift()
          continue
        }
        const tries = (attempts.get(message.id) ?? 0) + 1
        attempts.set(message.id, tries)
        const dead = !result.retryable || tries >= this.#maxAttempts
        const retryInMs = dead ? 0 : this.#backoff(retries + 1)
        this.#emit({
          type: 'failed',
          relayId: this.relayId,
          message: { ...message, attempts: tries },
          error: result.error,
          dead,
          retryInMs,
        })
        if (dead) {
          chain.shift()
          await this.#markDead(message, result.error)
        } else failed = true
      }
      if (!failed) continue
      if (stream.closed || this.#stopping) return false
      await this.#sleep(this.#backoff(++retries))
    }
    if (sent.length > 0) this.#emit({ type: 'published', relayId: this.relayId, messages: sent })
    return true
  }

  async #publish(messages: OutboxMessage[]): Promise<PublishResult[]> {
    try {
      return await this.#publisher.publish(messages)
    } catch (error) {
      const err = error instanceof Error ? error : new Error(String(error))
      return messages.map(() => ({ ok: false, error: err, retryable: true }))
    }
  }

  /** The row stays in the table as the polling relay's dead letters do, for an operator to see; the stream moves on. */
  async #markDead(message: OutboxMessage, error: Error): Promise<void> {
    await this.#query(`UPDATE ${this.#table} SET status = 'dead', last_error = $2 WHERE id = $1`, [message.id, error.message]).catch(
      (cause: unknown) => this.#emit({ type: 'error', relayId: this.relayId, error: cause }),
    )
  }

  /** Moves the confirmed position forward (never back) and tells the server. */
  #advance(stream: Stream, lsn: string): void {
    const value = lsnToBigInt(lsn)
    if (value <= this.#confirmed) return
    this.#confirmed = value
    this.#sendStatus(stream, false)
    this.#emit({ type: 'confirmed', relayId: this.relayId, lsn })
  }

  /**
   * A standby status update with the confirmed position exactly. The library's `acknowledge(lsn)`
   * reports `lsn + 1`, which would let the server skip a transaction whose commit record starts at
   * `lsn`; so it gets `lsn - 1`. `ping` asks for a keepalive back, which confirms an idle relay's
   * position up to the server's end of WAL (so writes to other tables do not count as lag).
   */
  #sendStatus(stream: Stream, ping: boolean): void {
    if (stream.closed || this.#confirmed === 0n) return
    void stream.service.acknowledge(bigIntToLsn(this.#confirmed - 1n), ping).catch(() => {})
  }

  async #closeStream(): Promise<void> {
    const stream = this.#stream
    if (!stream) return
    // Let the batch in flight finish (and confirm) before the connection goes.
    while (this.#inFlight) await new Promise((resolve) => setTimeout(resolve, 10))
    stream.closed = true
    this.#wakeAll()
    await stream.service.stop().catch(() => {})
  }

  #wakeAll(): void {
    this.#wake?.()
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

  #backoff(attempt: number): number {
    const ceiling = Math.min(this.#backoffMaxMs, this.#backoffInitialMs * 2 ** Math.max(0, attempt - 1))
    return Math.round(ceiling / 2 + (Math.random() * ceiling) / 2)
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

/** The parts of pgoutput's messages the relay reads. */
type PgoutputMessage =
  | { tag: 'begin' }
  | { tag: 'insert'; relation: { schema: string; name: string }; new: Record<string, unknown> }
  | { tag: 'commit'; commitEndLsn: string | null }
  | { tag: 'relation' | 'type' | 'origin' | 'update' | 'delete' | 'truncate' | 'message' }

function toMessage(row: Record<string, unknown>): OutboxMessage {
  return {
    seq: Number(row.seq),
    id: String(row.id),
    topic: String(row.topic),
    partitionKey: (row.partition_key as string | null) ?? null,
    payload: row.payload as Buffer,
    contentType: String(row.content_type),
    headers: JSON.parse(String(row.headers ?? '{}')) as Record<string, string>,
    attempts: 1,
    createdAtMs: row.created_at instanceof Date ? row.created_at.getTime() : Date.parse(String(row.created_at)),
  }
}

function ignoreDuplicate(error: unknown): void {
  // Another process created it between our check and our CREATE.
  const code = ((error as { cause?: { code?: string } }).cause ?? (error as { code?: string }))?.code
  if (code !== '42710') throw error
}

/** PostgreSQL's "replication slot ... is active for PID ..." (object_in_use) becomes the typed standby error. */
function slotError(slot: string, error: unknown): unknown {
  const code = (error as { code?: string })?.code
  if (code === '55006' || /is active for PID/i.test(String((error as Error)?.message))) return new ReplicationSlotInUseError(slot, error)
  return error
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

/** The replication connection's socket (the library keeps it private), to pause reading while the broker is behind. */
function socketOf(service: LogicalReplicationService): { pause(): void; resume(): void } | undefined {
  return (service as unknown as { _connection?: { stream?: { pause(): void; resume(): void } } })._connection?.stream
}

async function loadPg(): Promise<PgModule> {
  try {
    const mod = (await import('pg')) as unknown as { default?: PgModule } & PgModule
    return mod.default ?? mod
  } catch (error) {
    throw new IdempotencyError('INVALID_OPTION', 'PgCdcRelay needs the pg package: npm install pg', { cause: error })
  }
}

async function loadReplication(): Promise<typeof import('pg-logical-replication')> {
  try {
    const mod = (await import('pg-logical-replication')) as unknown as {
      default?: typeof import('pg-logical-replication')
    } & typeof import('pg-logical-replication')
    return mod.LogicalReplicationService ? mod : (mod.default as typeof import('pg-logical-replication'))
  } catch (error) {
    throw new IdempotencyError(
      'INVALID_OPTION',
      'PgCdcRelay needs the pg-logical-replication package: npm install pg-logical-replication',
      {
        cause: error,
      },
    )
  }
}
