/**
 * How a CDC relay's slot is judged, shared by `PgCdcRelay.ready()` and the operator page (which must
 * not load the relay and its drivers to draw a row).
 */

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
