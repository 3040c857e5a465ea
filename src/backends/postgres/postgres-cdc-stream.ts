/**
 * The CDC relay's replication stream: one logical replication connection on a pgoutput slot, decoded
 * into a queue of outbox rows and transaction ends, and the standby status updates that tell the server
 * what the broker has confirmed.
 */
import type { LogicalReplicationService } from 'pg-logical-replication'
import { formatDuration } from '../../core/duration.js'
import { IdempotencyError } from '../../errors.js'
import type { OutboxMessage } from '../../messaging/message.js'
import type { PgConnectionConfig } from './pool.js'

/** How often the relay sends its status to the server, asking for a keepalive when idle. */
export const STATUS_INTERVAL_MS = 1_000

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

/** An item of the relay's queue: an outbox row, or the end of a transaction (the LSN to confirm once all before it is published). */
export type CdcItem = { message: OutboxMessage; ackLsn?: undefined } | { message?: undefined; ackLsn: string }

/** The parts of pgoutput's messages the relay reads. */
type PgoutputMessage =
  | { tag: 'begin' }
  | { tag: 'insert'; relation: { schema: string; name: string }; new: Record<string, unknown> }
  | { tag: 'commit'; commitEndLsn: string | null }
  | { tag: 'relation' | 'type' | 'origin' | 'update' | 'delete' | 'truncate' | 'message' }

export interface CdcStreamOptions {
  slot: string
  /** The outbox table's name without its schema: inserts into other tables are skipped. */
  tableName: string
  silentConnectionMs: number
  /** Reading pauses while more items than this wait for the broker (PostgreSQL keeps the rest). */
  highWater: number
  /** The slot's confirmed position when the connection opens. */
  confirmedLsn: string | null
  /** The confirmed position moved: everything before `lsn` is confirmed by the broker. */
  onConfirmed(lsn: string): void
  /** The connection went silent and is dropped. */
  onError(error: unknown): void
  /** The stream closed itself: sleeps waiting on it should end. */
  onClose(): void
}

/**
 * One replication connection, from open to close: what it received and not yet published (the
 * queue), and the position confirmed to the server. The publish loop takes from the queue and
 * calls {@link CdcStream.advance} once the broker confirmed a transaction.
 */
export class CdcStream {
  readonly service: LogicalReplicationService
  /** Set when the connection ended: the batch in flight stops retrying, its rows come again from the slot. */
  closed = false
  /** When the server last sent anything (data or keepalive). */
  heardAt = Date.now()
  /** Committed rows and transaction ends, oldest first, waiting for the publish loop. */
  readonly queue: CdcItem[] = []
  /** The publish loop has a batch with the broker. */
  inFlight = false
  readonly #options: CdcStreamOptions
  #transaction: OutboxMessage[] | undefined
  /**
   * Starts from what the slot already confirmed (another relay may have moved it): a status update
   * must never report less, or the server would replay more than needed.
   */
  #confirmed: bigint
  /** Wakes the publish loop when the queue gets items or the stream closes. */
  #wake: (() => void) | undefined

  constructor(service: LogicalReplicationService, options: CdcStreamOptions) {
    this.service = service
    this.#options = options
    this.#confirmed = options.confirmedLsn ? lsnToBigInt(options.confirmedLsn) : 0n
    service.on('error', () => {}) // the subscribe() promise carries the failure
    service.on('data', (_lsn: string, message: PgoutputMessage) => this.#receive(message))
    service.on('heartbeat', (lsn: string, _time: number, shouldRespond: boolean) => this.#heartbeat(lsn, shouldRespond))
  }

  /** Resolves when the queue may have items, or the stream closed. */
  nextItems(): Promise<void> {
    return new Promise<void>((resolve) => {
      this.#wake = () => {
        this.#wake = undefined
        resolve()
      }
    })
  }

  wake(): void {
    this.#wake?.()
  }

  /** Reads the socket again once the broker caught up. */
  resume(): void {
    socketOf(this.service)?.resume()
  }

  /** Nothing is buffered or in flight: everything received is done. */
  idle(): boolean {
    return this.queue.length === 0 && !this.inFlight
  }

  /** Every second: tell the server where we stand (asking for a keepalive when idle), and drop a connection gone silent. */
  tick(): void {
    const idle = this.idle()
    if (idle && Date.now() - this.heardAt > this.#options.silentConnectionMs) {
      this.#options.onError(
        new IdempotencyError(
          'STORE_UNAVAILABLE',
          `PgCdcRelay on slot "${this.#options.slot}": the replication connection answered nothing for ${formatDuration(this.#options.silentConnectionMs)} ` +
            '(silentConnectionTimeout), so it is taken as half-open; reconnecting.',
        ),
      )
      this.closed = true
      this.wake()
      this.#options.onClose()
      void this.service.stop().catch(() => {})
      return
    }
    this.#sendStatus(idle)
  }

  /** Moves the confirmed position forward (never back) and tells the server. */
  advance(lsn: string): void {
    const value = lsnToBigInt(lsn)
    if (value <= this.#confirmed) return
    this.#confirmed = value
    this.#sendStatus(false)
    this.#options.onConfirmed(lsn)
  }

  #receive(message: PgoutputMessage): void {
    if (this.closed) return
    this.heardAt = Date.now()
    if (message.tag === 'begin') this.#transaction = []
    else if (message.tag === 'insert' && message.relation.name === this.#options.tableName) this.#transaction?.push(toMessage(message.new))
    else if (message.tag === 'commit' && message.commitEndLsn) {
      for (const m of this.#transaction ?? []) this.queue.push({ message: m })
      this.queue.push({ ackLsn: message.commitEndLsn })
      this.#transaction = undefined
      this.wake()
      // Backpressure: stop reading the socket while the broker is behind (PostgreSQL keeps the rest).
      if (this.queue.length > this.#options.highWater) socketOf(this.service)?.pause()
    }
  }

  /** A keepalive: when nothing is buffered or in flight, everything the server sent is done, so its position is confirmed. */
  #heartbeat(lsn: string, shouldRespond: boolean): void {
    if (this.closed) return
    this.heardAt = Date.now()
    if (this.idle() && this.#transaction === undefined) this.advance(lsn)
    else if (shouldRespond) this.#sendStatus(false)
  }

  /**
   * A standby status update with the confirmed position exactly. The library's `acknowledge(lsn)`
   * reports `lsn + 1`, which would let the server skip a transaction whose commit record starts at
   * `lsn`; so it gets `lsn - 1`. `ping` asks for a keepalive back, which confirms an idle relay's
   * position up to the server's end of WAL (so writes to other tables do not count as lag).
   */
  #sendStatus(ping: boolean): void {
    if (this.closed || this.#confirmed === 0n) return
    void this.service.acknowledge(bigIntToLsn(this.#confirmed - 1n), ping).catch(() => {})
  }
}

/**
 * The replication connection's config: the server's `wal_sender_timeout` set to
 * `silentConnectionTimeout`, so that the server, too, ends a connection gone silent (the relay
 * sends its status every second). Without it a half-open connection's walsender would hold the slot
 * until the server's own timeout (60 s by default), and the relay's new connection would stand by.
 */
export function replicationConnection(connection: PgConnectionConfig, silentConnectionMs: number): PgConnectionConfig {
  const base = typeof connection.options === 'string' ? connection.options : process.env.PGOPTIONS
  const timeout = `-c wal_sender_timeout=${silentConnectionMs}`
  return { ...connection, options: base ? `${base} ${timeout}` : timeout }
}

/** PostgreSQL's "replication slot ... is active for PID ..." (object_in_use) becomes the typed standby error. */
export function slotError(slot: string, error: unknown): unknown {
  const code = (error as { code?: string })?.code
  if (code === '55006' || /is active for PID/i.test(String((error as Error)?.message))) return new ReplicationSlotInUseError(slot, error)
  return error
}

export async function loadReplication(): Promise<typeof import('pg-logical-replication')> {
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

/** The replication connection's socket (the library keeps it private), to pause reading while the broker is behind. */
function socketOf(service: LogicalReplicationService): { pause(): void; resume(): void } | undefined {
  return (service as unknown as { _connection?: { stream?: { pause(): void; resume(): void } } })._connection?.stream
}
