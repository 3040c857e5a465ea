/**
 * The store contract (docs/ledger.md, "Writing your own store"). Every method is one atomic round trip to the store. Expected
 * outcomes come back as values; only bad input (`KEY_INVALID`, …) and an unreachable store
 * (`STORE_UNAVAILABLE`, with the driver's error as `cause`) throw.
 *
 * The state machine of one (scope, key), `now` being the store's clock:
 *
 * ```
 *   absent/expired ──acquire──▶ in_progress(token t, lockedUntil = now + lease)
 *   in_progress ──renew(t)───▶ in_progress(lockedUntil = now + lease)
 *   in_progress ──complete(t)▶ completed | failed (expiresAt = now + ttl) ──acquire, same fp──▶ replay
 *   in_progress ──release(t)─▶ in_progress(lockedUntil = now)   (lease ended: acquirable)
 *   in_progress, lease ended ──acquire──▶ in_progress(token t + 1)              (takeover)
 *   any live record, other fingerprint ──acquire──▶ mismatch (nothing changes)
 * ```
 * A record past `expiresAt` counts as absent. Acquiring over an expired record that is still
 * stored continues its token (t + 1), so a zombie holder stays fenced out until the row is purged.
 */

/** What a record is doing. */
export type RecordStatus = 'in_progress' | 'completed' | 'failed'

/** A stored response: what a replay sends back, byte for byte. */
export interface StoredResponse {
  /** HTTP status code (for non-HTTP intents: 200 for success, or what the caller chose). */
  status: number
  /** Lower-case header names; only the allowlisted ones are ever stored. */
  headers: Record<string, string>
  body: Uint8Array
}

/** What `complete` stores. */
export interface Outcome {
  status: 'completed' | 'failed'
  response: StoredResponse
  /** Optional pointer to what the operation created (an order ID, a charge ID). */
  resourceId?: string | null
}

/** The ledger's entry for one (scope, key). */
export interface StoredRecord {
  scope: string
  key: string
  /** Hex SHA-256 of the request, set when the record is acquired. */
  fingerprint: string
  status: RecordStatus
  /** Fencing token: 1 at first acquisition, +1 at each later acquisition of the same row. */
  token: number
  /** Lease end while `in_progress`; `null` once completed or failed. */
  lockedUntilMs: number | null
  /** The stored response for `completed` and `failed`; `null` while in progress. */
  response: StoredResponse | null
  resourceId: string | null
  /** How many times the record was acquired. */
  attempts: number
  createdAtMs: number
  updatedAtMs: number
  /** After this instant the record counts as absent and may be purged. */
  expiresAtMs: number
}

/** The result of {@link IdempotencyStore.acquire}: exactly one of four. */
export type AcquireResult =
  /**
   * `steps`: on a takeover (an acquire that continues an earlier attempt of the same record), the steps
   * that attempt recorded, read in the same round trip. Absent or empty on a fresh record, and from
   * stores without steps.
   */
  | { kind: 'acquired'; token: number; steps?: StepEntry[] }
  | { kind: 'in_progress'; lockedUntilMs: number }
  | { kind: 'replay'; record: StoredRecord }
  | { kind: 'mismatch' }

/**
 * One recorded step of an in-progress record (docs/steps.md). `result` is the step's value as JSON text,
 * or `null` for a step that was started (its marker recorded) but has no result yet.
 */
export interface StepEntry {
  name: string
  result: string | null
}

/** Filter for {@link IdempotencyStore.list}. */
export interface ListFilter {
  scope?: string
  status?: RecordStatus
  /** Only records created at or before this instant (epoch ms). */
  createdBeforeMs?: number
  /** Include records past `expiresAt` (not yet purged). @default false */
  includeExpired?: boolean
  /** @default 100 */
  limit?: number
}

/** Stops a {@link IdempotencyStore.watch} subscription. */
export type Unsubscribe = () => void

/**
 * How long an in-progress record whose lease ended (a crash, or a release) is kept after its
 * lease before it may be purged. While the row is kept its fencing token keeps counting, so a
 * holder paused longer than this could, after the purge, meet a new holder with its old token.
 */
export const DEFAULT_ABANDONED_RETENTION_MS = 24 * 60 * 60 * 1000

/** The interface every store implements; run `describeStore` from `idemkey/testing` against yours. */
export interface IdempotencyStore {
  /** Short name for messages and metrics, e.g. `postgres`. */
  readonly name: string
  /**
   * `true` when leases and expiry are decided by the store server's clock (PostgreSQL, Redis,
   * MySQL); `false` when by the injected clock (memory, SQLite).
   */
  readonly serverClock: boolean

  /** Atomically claims the record, or says why not. */
  acquire(scope: string, key: string, fingerprint: string, leaseMs: number): Promise<AcquireResult>
  /** Extends the lease to `now + leaseMs` if `token` is current. */
  renew(scope: string, key: string, token: number, leaseMs: number): Promise<boolean>
  /** Stores the outcome, kept for `ttlMs`, if `token` is current and the record is in progress. */
  complete(scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean>
  /** Ends the lease now, so the next acquire runs afresh, if `token` is current and the record is in progress. */
  release(scope: string, key: string, token: number): Promise<boolean>
  /** The live record, or `null` when absent or expired. */
  get(scope: string, key: string): Promise<StoredRecord | null>
  /** Records for operators, oldest first. */
  list(filter?: ListFilter): Promise<StoredRecord[]>
  /** Deletes up to `limit` expired records; returns how many. Call again until it returns less than `limit`. */
  purgeExpired(limit: number): Promise<number>
  /** An operator's deliberate reset: deletes the record whatever its state. Returns whether one existed. */
  evict(scope: string, key: string): Promise<boolean>
  /**
   * Stores one step of the record (docs/steps.md) if `token` is current and the record is in progress:
   * `result` is the step's value as JSON text, or `null` for a "started" marker. A result replaces a
   * marker of the same name; a marker never replaces a result. The steps live and die with the record
   * (a fresh acquire, a purge or an evict drops them) and come back with `acquire` on a takeover.
   * Optional: without it, `ctx.step` and the captured values fail with `INVALID_OPTION`.
   */
  recordStep?(scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean>
  /**
   * For operators (`idemkey list`, the operator page): per record, in the order given, whether an open
   * database transaction holds its row now. A holder inside `runInTransaction` holds it from its first step
   * on, and does not renew its lease (docs/steps.md): past its lease, such a holder is alive, not stuck.
   * Asks without waiting for any lock, in its own short transaction. Optional: stores without transactional
   * holders (Redis, DynamoDB, memory, SQLite) leave it out.
   */
  heldInTransaction?(records: ReadonlyArray<{ scope: string; key: string }>): Promise<boolean[]>
  /**
   * Calls `onChange` when the record may have changed (completed, released, evicted). Optional:
   * without it the ledger polls. Notifications may be lost; waiters always poll as well.
   */
  watch?(scope: string, key: string, onChange: () => void): Unsubscribe
  /** Closes what the store opened (not a pool or client the user passed in). */
  close(): Promise<void>
}

/**
 * A store that can run the caller's work in a database transaction that also completes the record
 * (docs/postgres.md): the business writes and the completion commit together, and a fenced-out holder's
 * writes roll back.
 */
export interface TransactionalStore<Tx> extends IdempotencyStore {
  /** Runs `fn` in a transaction: commits when it resolves, rolls back when it throws. */
  transaction<R>(fn: (tx: Tx) => Promise<R>): Promise<R>
  /** `complete` inside `tx`; `false` (the caller must roll back) when the token is no longer current. */
  completeInTransaction(tx: Tx, scope: string, key: string, token: number, outcome: Outcome, ttlMs: number): Promise<boolean>
  /** `recordStep` inside `tx`: the step commits (or rolls back) with the transaction's business writes. */
  recordStepInTransaction?(tx: Tx, scope: string, key: string, token: number, name: string, result: string | null): Promise<boolean>
  /**
   * Sets (`'set'`) the savepoint the ledger takes before the work inside `tx`, or rolls `tx` back to it
   * (`'rollback'`), so that a final failure the work returned is recorded without the work's writes
   * (`RunOptions.failedWrites`). Without it, `runInTransaction` needs `failedWrites: 'commit'`.
   */
  savepointInTransaction?(tx: Tx, command: SavepointCommand): Promise<void>
}

/** What {@link TransactionalStore.savepointInTransaction} does: set the work's savepoint, or roll back to it. */
export type SavepointCommand = 'set' | 'rollback'

/** True when the store implements {@link TransactionalStore}. */
export function isTransactionalStore(store: IdempotencyStore): store is TransactionalStore<unknown> {
  const candidate = store as Partial<TransactionalStore<unknown>>
  return typeof candidate.transaction === 'function' && typeof candidate.completeInTransaction === 'function'
}
