/**
 * The inbox's control flow, shared by PostgreSQL, MySQL and SQLite: each dialect's class adds its SQL,
 * its error codes and its driver calls. Not part of the public API.
 */

import { type Duration, parsePositiveDuration } from '../../core/duration.js'
import { sha256Hex } from '../../core/fingerprint.js'
import type { SqlTransactions } from '../../core/sql-transactions.js'
import { assertFunctions } from '../../core/validate.js'
import { IdempotencyError } from '../../errors.js'
import type { Inbox, InboxBatchResult, InboxEvent, InboxMessage, InboxResult } from '../../messaging/inbox/types.js'
import { InboxMismatchError, isMissingTable, RolledBack } from '../../messaging/message.js'

/** What a message ID is to the inbox: new, known under the same payload, or known under another one. */
export type Seen = 'new' | 'duplicate' | 'mismatch'

/** Hex SHA-256 of a payload (bytes, or text as UTF-8). */
export function payloadHash(payload: Uint8Array | string): string {
  return sha256Hex(payload)
}

/** Throws `INVALID_ARGUMENT` for a message without an ID; `prefix` names who asks. */
export function assertMessageHasId(message: InboxMessage, prefix = 'inbox'): void {
  if (typeof message?.id !== 'string' || message.id.length === 0) {
    throw new IdempotencyError('INVALID_ARGUMENT', `${prefix}: the message has no ID. Producers must set one (the outbox always does).`)
  }
}

/** Runs the caller's effect: its errors are rethrown as they are, while the database's are the inbox's to wrap. */
export type RunEffect = <T>(effect: () => Promise<T> | T) => Promise<T>

/** Whether an effect is running now (`inEffect`) or has run at all (`ran`) in a transaction. */
export interface EffectTracker {
  run: RunEffect
  readonly inEffect: boolean
  readonly ran: boolean
}

export function trackEffects(): EffectTracker {
  let inEffect = false
  let ran = false
  return {
    run: async (effect) => {
      inEffect = true
      ran = true
      const value = await effect()
      inEffect = false
      return value
    },
    get inEffect() {
      return inEffect
    },
    get ran() {
      return ran
    },
  }
}

/**
 * What the inbox's transactions run: its statements go through `run`, the effect gets `tx` and runs
 * through `runEffect`. `rollback: true` ends the transaction without a commit.
 */
export type TransactionWork<Run, Tx, R> = (run: Run, tx: Tx, runEffect: RunEffect) => Promise<{ value: R; rollback?: boolean }>

/** The options every SQL inbox takes. */
export interface SqlInboxBasics {
  consumer: string
  retention?: Duration
  onEvent?: (event: InboxEvent) => void
}

/** Consumer, retention and events: what every SQL inbox keeps. */
export abstract class SqlInbox {
  readonly consumer: string
  readonly #retentionMs: number
  readonly #onEvent: (event: InboxEvent) => void

  /** `hooks`: the dialect's other function options, checked before `onEvent`. */
  protected constructor(name: string, options: SqlInboxBasics, hooks: Record<string, unknown> = {}) {
    this.consumer = options.consumer
    // A retention of 0 forgets each ID at the next purge: a redelivered copy would be applied again.
    this.#retentionMs = parsePositiveDuration(options.retention ?? '7d', 'retention')
    assertFunctions(name, { ...hooks, onEvent: options.onEvent })
    this.#onEvent = options.onEvent ?? (() => {})
  }

  /** How long processed IDs are kept (the dedup window). */
  get retentionMs(): number {
    return this.#retentionMs
  }

  protected emit(event: InboxEvent): void {
    try {
      this.#onEvent(event)
    } catch {
      // A throwing metrics hook must not change the outcome.
    }
  }

  /** Reports a known ID: `duplicate`, or throws for a mismatch. */
  protected seenBefore(seen: 'duplicate' | 'mismatch', messageId: string): { status: 'duplicate' } {
    if (seen === 'mismatch') {
      this.emit({ type: 'mismatch', consumer: this.consumer, messageId })
      throw new InboxMismatchError(this.consumer, messageId)
    }
    this.emit({ type: 'duplicate', consumer: this.consumer, messageId })
    return { status: 'duplicate' }
  }
}

/**
 * An inbox whose effects run in an asynchronous transaction on a pooled connection, or in the
 * transaction of the user's data layer (`transactions`). `Run` is how the inbox's own statements go
 * to the database inside such a transaction.
 */
export abstract class TransactionalSqlInbox<Tx, Run> extends SqlInbox implements Inbox<Tx> {
  protected readonly tool: SqlTransactions<Tx> | undefined

  protected constructor(name: string, options: SqlInboxBasics & { transactions?: SqlTransactions<Tx> | undefined }) {
    super(name, options)
    this.tool = options.transactions
  }

  /** Throws `INVALID_ARGUMENT` for an ID the dialect cannot keep. */
  protected abstract assertMessage(message: InboxMessage): void
  /** The inbox's statements in `tx`: the caller's transaction, or the tool's. */
  protected abstract statementsIn(tx: Tx): Run
  /** Records one ID. */
  protected abstract recordId(run: Run, messageId: string, hash: string): Promise<Seen>
  /** Records a batch's IDs (in an order that concurrent batches share): what each message is, in batch order. */
  protected abstract recordBatch(run: Run, messages: readonly InboxMessage[], hashes: string[]): Promise<Seen[]>
  /** One transaction on a connection of the dialect's pool. */
  protected abstract onPool<R>(label: string, work: TransactionWork<Run, Tx, R>): Promise<R>
  /** A database error of `label`, as the dialect reports it. */
  protected abstract failure(label: string, error: unknown): Error

  /** What {@link TransactionalSqlInbox.record} calls its operation in an error. */
  protected recordLabel(messageId: string): string {
    return `record ${messageId}`
  }

  /**
   * Runs `effect` in a transaction that also records the message ID, unless the ID was processed
   * already. An error from `effect` rolls both back and is rethrown (do not ack: let the broker
   * redeliver). Database errors become `STORE_UNAVAILABLE`. `tx` is a connection of the pool, or with
   * the `transactions` option, the tool's own transaction.
   */
  async handle<T>(message: InboxMessage, effect: (tx: Tx, message: InboxMessage) => Promise<T> | T): Promise<InboxResult<T>> {
    this.assertMessage(message)
    const hash = payloadHash(message.payload)
    type Outcome = { seen: 'duplicate' | 'mismatch' } | { applied: Awaited<T> }
    const outcome = await this.transaction<Outcome>(`handle ${message.id}`, async (run, tx, runEffect) => {
      const seen = await this.recordId(run, message.id, hash)
      if (seen !== 'new') return { rollback: true, value: { seen } }
      return { value: { applied: await runEffect(() => effect(tx, message)) } }
    })
    if ('seen' in outcome) return this.seenBefore(outcome.seen, message.id)
    this.emit({ type: 'applied', consumer: this.consumer, messageId: message.id })
    return { status: 'applied', value: outcome.applied }
  }

  /**
   * Several messages in one transaction (what the consumer helpers use under load): their IDs recorded
   * (in sorted order, so concurrent batches lock alike), then each new message's effect in the given
   * order, then one COMMIT. A message seen before is `duplicate`, or `mismatch` with another payload
   * (reported, not thrown); an ID twice in the batch is applied once. Any error rolls the whole batch
   * back and is thrown (retry the messages one by one with `handle`). Events are reported after the commit.
   */
  async handleBatch<T>(
    messages: readonly InboxMessage[],
    effect: (tx: Tx, message: InboxMessage) => Promise<T> | T,
  ): Promise<Array<InboxBatchResult<T>>> {
    for (const message of messages) this.assertMessage(message)
    const hashes = messages.map((m) => payloadHash(m.payload))
    const { results, events } = await this.transaction(`handleBatch of ${messages.length}`, async (run, tx, runEffect) => {
      const seen = await this.recordBatch(run, messages, hashes)
      const results: Array<InboxBatchResult<T>> = []
      const events: InboxEvent[] = []
      for (const [i, message] of messages.entries()) {
        if (seen[i] === 'new') {
          results.push({ status: 'applied', value: await runEffect(() => effect(tx, message)) })
          events.push({ type: 'applied', consumer: this.consumer, messageId: message.id })
        } else if (seen[i] === 'mismatch') {
          results.push({ status: 'mismatch', error: new InboxMismatchError(this.consumer, message.id) })
          events.push({ type: 'mismatch', consumer: this.consumer, messageId: message.id })
        } else {
          results.push({ status: 'duplicate' })
          events.push({ type: 'duplicate', consumer: this.consumer, messageId: message.id })
        }
      }
      return { value: { results, events } }
    })
    for (const event of events) this.emit(event)
    return results
  }

  /**
   * Records the message ID inside a transaction *you* run (your begin, your effect, your commit), for
   * when the effect already has its own transaction. Returns `new` (apply the effect, then commit) or
   * `duplicate` (skip the effect; rolling back or committing is the same). Throws
   * {@link InboxMismatchError} for the same ID with another payload.
   */
  async record(tx: Tx, message: InboxMessage): Promise<'new' | 'duplicate'> {
    this.assertMessage(message)
    const hash = payloadHash(message.payload)
    let seen: Seen
    try {
      seen = await this.recordId(this.statementsIn(tx), message.id, hash)
    } catch (error) {
      throw this.failure(this.recordLabel(message.id), error)
    }
    if (seen === 'new') {
      this.emit({ type: 'recorded', consumer: this.consumer, messageId: message.id })
      return 'new'
    }
    this.seenBefore(seen, message.id)
    return 'duplicate'
  }

  /**
   * One transaction, shared by `handle` and `handleBatch`: the tool's with the `transactions` option,
   * else the dialect's on its pool. The effect's errors are rethrown as they are, the database's
   * reported by {@link TransactionalSqlInbox.failure}; either rolls back.
   */
  protected async transaction<R>(label: string, work: TransactionWork<Run, Tx, R>): Promise<R> {
    const tool = this.tool
    if (!tool) return this.onPool(label, work)
    const effects = trackEffects()
    try {
      return await tool.transaction(async (tx) => {
        const { value, rollback } = await work(this.statementsIn(tx), tx, effects.run)
        // A tool rolls back when its function throws: this carries the value out.
        if (rollback) throw new RolledBack(value)
        return value
      })
    } catch (error) {
      if (error instanceof RolledBack) return error.value as R
      if (effects.inEffect || error instanceof IdempotencyError) throw error
      throw this.failure(label, error)
    }
  }

  /**
   * Deletes this consumer's rows older than the retention with `deleteBatch` (one short statement of
   * at most `batchSize` rows a call): processed IDs, then failed attempts (none to purge when their
   * table is missing). Returns how many IDs.
   */
  protected async purgeInBatches(
    batchSize: number,
    tables: { ids: string; failures: string },
    deleteBatch: (table: string, column: string) => Promise<number>,
  ): Promise<number> {
    const older = async (table: string, column: string): Promise<number> => {
      let total = 0
      for (;;) {
        const deleted = await deleteBatch(table, column)
        total += deleted
        if (deleted < batchSize) return total
      }
    }
    const total = await older(tables.ids, 'processed_at')
    // Not migrated since failures were recorded: nothing of theirs to purge.
    await older(tables.failures, 'failed_at').catch((error: unknown) => {
      if (!isMissingTable(error)) throw error
    })
    return total
  }
}
