/**
 * idemkey: idempotency keys and a durable ledger, so each intent takes effect once.
 * The root entry is the core only: it imports no driver and no framework.
 */

export { type Clock, ManualClock, systemClock } from './core/clock.js'
export { type Duration, formatDuration, parseDuration } from './core/duration.js'
export { canonicalJson, canonicalJsonText, fingerprintOf, MAX_JSON_DEPTH, sha256Hex } from './core/fingerprint.js'
export {
  type Acquired,
  type Begun,
  DEFAULT_SCOPE,
  type ExecutedOutcome,
  type FailedWrites,
  type Intent,
  type IntentContext,
  Ledger,
  type LedgerEvent,
  type LedgerOptions,
  type RunOptions,
  type RunResult,
  type TransactionContext,
} from './core/ledger.js'
export { type Classification, classifyStatus, TRANSIENT_4XX } from './core/outcome.js'
export type { PgClientOfTool, SqlExecuteOptions, SqlOutcome, SqlTransactions, SqlValue } from './core/sql-transactions.js'
export {
  MAX_STEP_RESULT_BYTES,
  MAX_STEPS_PER_RECORD,
  type PendingStep,
  type Reconcile,
  type ReconcileContext,
  type StepContext,
  type StepMethods,
} from './core/steps.js'
export {
  type AcquireResult,
  DEFAULT_ABANDONED_RETENTION_MS,
  type IdempotencyStore,
  isTransactionalStore,
  type ListFilter,
  type Outcome,
  type RecordStatus,
  type SavepointCommand,
  type StepEntry,
  type StoredRecord,
  type StoredResponse,
  type TransactionalStore,
  type Unsubscribe,
} from './core/store.js'
export { assertFingerprint, assertKey, assertScope, MAX_KEY_LENGTH } from './core/validate.js'
export {
  HTTP_STATUS_BY_CODE,
  IdempotencyError,
  type IdempotencyErrorCode,
  InProgressError,
  isIdempotencyError,
} from './errors.js'
