/**
 * A CDC relay's slot health and how it is judged, shared by `PgCdcRelay.ready()` and the operator page
 * (which must not load the relay and its drivers to draw a row).
 */
import { IdempotencyError } from '../../errors.js'

/** `PgCdcRelay`'s `maxLagBytes` unless given: 256 MiB. */
export const DEFAULT_MAX_LAG_BYTES = 256 * 1024 * 1024

/** Why `ready()` fails on a slot: it does not exist, lost WAL it needed, or holds more than `maxLagBytes`. */
export type SlotProblem = 'missing' | 'lost' | 'lagging'

/** The problem of a slot in this state, or `null` when `ready()` passes. */
export function slotProblem(
  health: { exists: boolean; walStatus: string | null; lagBytes: number },
  maxLagBytes: number,
): SlotProblem | null {
  if (!health.exists) return 'missing'
  if (health.walStatus === 'lost') return 'lost'
  return health.lagBytes > maxLagBytes ? 'lagging' : null
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
