import type { Duration } from '../../core/duration.js'
import { assertSqlTransactions, type SqlTransactions, type SqlValue } from '../../core/sql-transactions.js'
import { assertPositiveInteger } from '../../core/validate.js'
import { IdempotencyError, storeUnavailable } from '../../errors.js'
import type { InboxEvent, InboxFailure, InboxMessage, InboxOldestRecord } from '../../messaging/inbox/types.js'
import { besideTable, fitPgName, isMissingTable, purgeBatchSize, quoteName } from '../../messaging/message.js'
import { assertMessageHasId, type Seen, TransactionalSqlInbox, type TransactionWork, trackEffects } from '../sql/inbox.js'
import { type PgClientLike, type PgPoolLike, type PgQueryable, rowsOf, withPoolClient } from './messaging.js'
import type { PgQueryConfig } from './pool.js'

export { payloadHash } from '../sql/inbox.js'

/** Options of {@link PgInbox}. */
export interface PgInboxOptions<Tx = PgClientLike> {
  /** The user's `pg.Pool`; each message runs in a transaction on one of its clients. */
  pool: PgPoolLike
  /** This consumer's name: the same message ID is processed once per consumer name. */
  consumer: string
  /** Table name, optionally `schema.table`. @default 'idemkey_inbox' */
  table?: string
  /**
   * How long a processed ID is remembered by {@link PgInbox.purge}. Must exceed the longest time
   * after which a broker (or a relay) may still deliver a copy: see docs/messaging.md. @default '7d'
   */
  retention?: Duration
  onEvent?: (event: InboxEvent) => void
  /**
   * Your data layer (docs/orm.md): `handle` and `handleBatch` then run the effect in the tool's own
   * transaction (the effect's `tx` is the tool's transaction object, and so is the consumer helpers'),
   * and `record(tx, …)` takes one.
   * @example new PgInbox({ pool, consumer: 'billing', transactions: drizzleTransactions(db) })
   */
  transactions?: SqlTransactions<Tx>
}

/** The inbox's statements inside a tool's transaction. Only the number of rows comes back, which is all #record reads. */
function throughTool<Tx>(tool: SqlTransactions<Tx>, tx: Tx): PgQueryable {
  return {
    query: async (text: string | PgQueryConfig, values?: unknown[]) => {
      const sql = typeof text === 'string' ? text : text.text
      const { count } = await tool.execute(tx, sql, (values ?? []) as SqlValue[])
      return { rows: Array.from({ length: count }, () => ({})), rowCount: count }
    },
  }
}

function assertMessageId(message: InboxMessage): void {
  assertMessageHasId(message)
  // PostgreSQL text cannot hold NUL: the INSERT would fail on every redelivery, as if the database were down.
  if (message.id.includes('\0')) {
    throw new IdempotencyError(
      'INVALID_ARGUMENT',
      'inbox: the message ID holds a NUL character, which PostgreSQL text cannot store. Producers must set IDs without one.',
    )
  }
}

/** The COMMIT of {@link PgInbox}'s transaction rolled it back: a statement in it had failed and its error was caught. */
function abortedAtCommit(label: string): IdempotencyError {
  return new IdempotencyError(
    'STORE_UNAVAILABLE',
    `PgInbox: ${label}: the transaction was rolled back at COMMIT, because a statement in it failed and the effect caught that error and went on (PostgreSQL aborts the whole transaction on a failed statement). Neither the effect's writes nor the message ID were kept: do not ack; the redelivery runs the effect again. Let the effect's database errors propagate, or run the statement that may fail under a SAVEPOINT.`,
  )
}

function compareIds(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0
}

/**
 * The inbox on PostgreSQL: records each message ID in the same transaction as the effect, so the
 * effect is applied once however often the broker redelivers. A redelivered ID is reported as
 * `duplicate` (acknowledge it); the same ID with another payload throws {@link InboxMismatchError}.
 * Two consumers handling the same ID at once: the second waits on the row lock and then sees a duplicate.
 * `tx` is a client of the pool, or with the `transactions` option, the tool's own transaction.
 *
 * @example
 * const inbox = new PgInbox({ pool, consumer: 'billing' })
 * await inbox.migrate()
 * const result = await inbox.handle({ id, payload }, async (tx) => {
 *   await tx.query('UPDATE accounts SET balance = balance + $1 WHERE id = $2', [amount, account])
 * })
 * ack() // applied or duplicate: either way the broker may forget it
 *
 * @example
 * // In a transaction you run, e.g. the idempotency store's (`ledger.runInTransaction`, docs/postgres.md):
 * await client.query('BEGIN')
 * if ((await inbox.record(client, message)) === 'new') await applyEffect(client)
 * await client.query('COMMIT')
 */
export class PgInbox<Tx = PgClientLike> extends TransactionalSqlInbox<Tx, PgQueryable> {
  readonly #pool: PgPoolLike
  readonly #table: string
  readonly #name: string
  /** Failed attempts by message (`recordFailure`), for `maxAttempts` across processes. */
  readonly #failures: string

  constructor(options: PgInboxOptions<Tx>) {
    if (typeof options?.pool?.connect !== 'function') {
      throw new IdempotencyError('INVALID_OPTION', 'PgInbox needs { pool }: a pg.Pool (or anything with query() and connect()).')
    }
    if (typeof options.consumer !== 'string' || options.consumer.length === 0 || options.consumer.includes('\0')) {
      throw new IdempotencyError(
        'INVALID_OPTION',
        'PgInbox needs { consumer }: a non-empty name for this consumer without NUL characters, e.g. "billing".',
      )
    }
    if (options.transactions !== undefined) assertSqlTransactions(options.transactions, 'PgInbox', 'postgres')
    const name = options.table ?? 'idemkey_inbox'
    const table = quoteName(name, 'PgInbox table')
    const failures = besideTable(name, 'failures', 'PgInbox table')
    super('PgInbox', options)
    this.#pool = options.pool
    this.#name = name
    this.#table = table
    this.#failures = failures
  }

  /** Creates the table. Idempotent; safe to run from several processes at once. */
  async migrate(): Promise<void> {
    await withPoolClient(this.#pool, async (client) => {
      try {
        await client.query('BEGIN')
        await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`idemkey_inbox:${this.#name}:migrate`])
        await client.query(`CREATE TABLE IF NOT EXISTS ${this.#table} (
        consumer text NOT NULL,
        message_id text NOT NULL,
        payload_hash text NOT NULL,
        processed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, message_id))`)
        // fitPgName: `<table>_processed_at` as always, shortened with a hash only past 63 bytes (refused before).
        const index = quoteName(fitPgName(this.#name.split('.').pop() as string, 'processed_at', this.#name), 'index')
        await client.query(`CREATE INDEX IF NOT EXISTS ${index} ON ${this.#table} (processed_at)`)
        await client.query(`CREATE TABLE IF NOT EXISTS ${this.#failures} (
        consumer text NOT NULL,
        message_id text NOT NULL,
        failures integer NOT NULL,
        failed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, message_id))`)
        await client.query('COMMIT')
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {})
        throw new IdempotencyError('STORE_SCHEMA', `PgInbox.migrate on ${this.#name} failed: ${(error as Error).message}.`, {
          cause: error,
        })
      }
    })
  }

  protected assertMessage(message: InboxMessage): void {
    assertMessageId(message)
  }

  protected statementsIn(tx: Tx): PgQueryable {
    return this.tool ? throughTool(this.tool, tx) : (tx as PgQueryable)
  }

  protected failure(label: string, error: unknown): IdempotencyError {
    return storeUnavailable('PgInbox', label, error)
  }

  /**
   * What each message of a batch is: the first copy of a new ID `new`, an ID known under the same
   * payload (or a second copy of the same in the batch) `duplicate`, under another one `mismatch`.
   * The IDs go in sorted (a stable sort: an ID's copies keep their batch order, so its first copy is
   * the one inserted), so two consumers' batches of the same IDs lock them in one order and cannot
   * deadlock on each other. Through a tool only the count of rows comes back: each ID is recorded
   * alone, in the same order.
   */
  protected async recordBatch(on: PgQueryable, messages: readonly InboxMessage[], hashes: string[]): Promise<Seen[]> {
    const sorted = messages.map((_, i) => i).sort((a, b) => compareIds((messages[a] as InboxMessage).id, (messages[b] as InboxMessage).id))
    if (this.tool) {
      const seen: Seen[] = []
      for (const i of sorted) seen[i] = await this.recordId(on, (messages[i] as InboxMessage).id, hashes[i] as string)
      return seen
    }
    return this.#recordAll(on, messages, hashes, sorted)
  }

  /** One INSERT of all the IDs in `sorted` order, one SELECT of the known ones. */
  async #recordAll(client: PgQueryable, messages: readonly InboxMessage[], hashes: string[], sorted: number[]): Promise<Seen[]> {
    const inserted = await client.query(
      `INSERT INTO ${this.#table} (consumer, message_id, payload_hash)
         SELECT $1, id, hash FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS m(id, hash, n) ORDER BY n
         ON CONFLICT DO NOTHING RETURNING message_id`,
      [this.consumer, sorted.map((i) => (messages[i] as InboxMessage).id), sorted.map((i) => hashes[i] as string)],
    )
    const fresh = new Set(rowsOf<{ message_id: string }>(inserted).map((r) => r.message_id))
    // The hash each ID is known under: stored before this batch, or taken by its first copy here.
    const known = new Map<string, string>()
    const old = messages.filter((m) => !fresh.has(m.id)).map((m) => m.id)
    if (old.length > 0) {
      const found = await client.query(
        `SELECT message_id, payload_hash FROM ${this.#table} WHERE consumer = $1 AND message_id = ANY($2::text[])`,
        [this.consumer, old],
      )
      for (const row of rowsOf<{ message_id: string; payload_hash: string }>(found)) known.set(row.message_id, row.payload_hash)
    }
    return messages.map((message, i) => {
      if (fresh.has(message.id) && !known.has(message.id)) {
        known.set(message.id, hashes[i] as string)
        return 'new'
      }
      const hash = known.get(message.id)
      return hash !== undefined && hash !== hashes[i] ? 'mismatch' : 'duplicate'
    })
  }

  /** A transaction on a pooled client (`BEGIN` ... `COMMIT`). */
  protected async onPool<R>(label: string, work: TransactionWork<PgQueryable, Tx, R>): Promise<R> {
    const effects = trackEffects()
    const transaction = async (client: PgClientLike): Promise<R> => {
      let inTransaction = false
      try {
        await client.query('BEGIN')
        inTransaction = true
        const { value, rollback } = await work(client, client as unknown as Tx, effects.run)
        const ended = await client.query(rollback ? 'ROLLBACK' : 'COMMIT')
        inTransaction = false
        // An effect that caught a failed statement of its own and went on left the transaction aborted:
        // PostgreSQL then answers the COMMIT with a rollback, not an error. Nothing was kept, the message
        // ID neither, so this must not count as applied (the caller would ack a lost message).
        if (!rollback && ended.command === 'ROLLBACK') throw abortedAtCommit(label)
        return value
      } catch (error) {
        if (inTransaction) await client.query('ROLLBACK').catch(() => {})
        // The effect's own errors are the caller's; ours mean the database is in trouble.
        throw effects.inEffect || error instanceof IdempotencyError ? error : this.failure(label, error)
      }
    }
    let connected = false
    try {
      return await withPoolClient(this.#pool, (client) => {
        connected = true
        return transaction(client)
      })
    } catch (error) {
      if (connected) throw error
      throw storeUnavailable('PgInbox', 'connect', error)
    }
  }

  protected async recordId(tx: PgQueryable, messageId: string, hash: string): Promise<Seen> {
    const inserted = await tx.query(
      `INSERT INTO ${this.#table} (consumer, message_id, payload_hash) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1`,
      [this.consumer, messageId, hash],
    )
    if (inserted.rows.length === 1) return 'new'
    const { rows } = await tx.query(`SELECT 1 FROM ${this.#table} WHERE consumer = $1 AND message_id = $2 AND payload_hash <> $3`, [
      this.consumer,
      messageId,
      hash,
    ])
    return rows.length > 0 ? 'mismatch' : 'duplicate'
  }

  /** This consumer's oldest kept ID (`null`: none), by the processed_at index. */
  async oldest(): Promise<InboxOldestRecord | null> {
    try {
      const result = await this.#pool.query(
        `SELECT message_id, (extract(epoch FROM processed_at) * 1000)::float8 AS processed_at_ms
           FROM ${this.#table} WHERE consumer = $1 ORDER BY processed_at LIMIT 1`,
        [this.consumer],
      )
      const row = result.rows[0] as { message_id: string; processed_at_ms: number } | undefined
      return row ? { messageId: row.message_id, processedAtMs: Math.round(Number(row.processed_at_ms)) } : null
    } catch (error) {
      throw storeUnavailable('PgInbox', 'oldest', error)
    }
  }

  /**
   * Records one failed attempt of `message` by this consumer, in a statement of its own, and answers
   * how many are recorded (every process of this consumer, across restarts): `maxAttempts` counts them.
   */
  async recordFailure(message: InboxMessage): Promise<number> {
    try {
      const result = await this.#pool.query(
        `INSERT INTO ${this.#failures} AS f (consumer, message_id, failures) VALUES ($1, $2, 1)
         ON CONFLICT (consumer, message_id) DO UPDATE SET failures = f.failures + 1, failed_at = now()
         RETURNING failures`,
        [this.consumer, String(message?.id)],
      )
      return Number((result.rows[0] as { failures: number }).failures)
    } catch (error) {
      throw storeUnavailable('PgInbox', `recordFailure ${message?.id} (run migrate() if ${this.#failures} is missing)`, error)
    }
  }

  /** Forgets the failed attempts recorded for `messageId`. */
  async forgetFailures(messageId: string): Promise<void> {
    try {
      await this.#pool.query(`DELETE FROM ${this.#failures} WHERE consumer = $1 AND message_id = $2`, [this.consumer, String(messageId)])
    } catch (error) {
      throw storeUnavailable('PgInbox', `forgetFailures ${messageId}`, error)
    }
  }

  /** This consumer's messages with attempts recorded, most first (see {@link Inbox.failing}). */
  async failing(limit = 10): Promise<InboxFailure[]> {
    assertPositiveInteger(limit, 'PgInbox.failing limit')
    try {
      const result = await this.#pool.query(
        `SELECT message_id, failures, (extract(epoch FROM failed_at) * 1000)::float8 AS at_ms FROM ${this.#failures}
         WHERE consumer = $1 ORDER BY failures DESC, failed_at DESC LIMIT $2`,
        [this.consumer, limit],
      )
      return (result.rows as Array<{ message_id: string; failures: number; at_ms: number }>).map((row) => ({
        messageId: row.message_id,
        attempts: Number(row.failures),
        lastAttemptAtMs: Math.round(Number(row.at_ms)),
      }))
    } catch (error) {
      // Not migrated since failures were first recorded: none recorded.
      if (isMissingTable(error)) return []
      throw storeUnavailable('PgInbox', 'failing', error)
    }
  }

  /**
   * Deletes IDs processed longer ago than the retention, in batches of `batchSize` rows, each its own
   * short statement, then failed attempts last recorded that long ago. Returns how many IDs. Run it
   * periodically.
   */
  async purge(options: { batchSize?: number } = {}): Promise<number> {
    const batchSize = purgeBatchSize(options)
    return this.purgeInBatches(batchSize, { ids: this.#table, failures: this.#failures }, async (table, column) => {
      const result = await this.#pool.query(
        `DELETE FROM ${table} WHERE ctid IN (
           SELECT ctid FROM ${table} WHERE consumer = $1 AND ${column} < now() - $2 * interval '1 millisecond'
           LIMIT $3 FOR UPDATE SKIP LOCKED)`,
        [this.consumer, this.retentionMs, batchSize],
      )
      return result.rowCount ?? 0
    })
  }
}
