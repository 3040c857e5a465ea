/**
 * The consumer helpers' engine: the {@link Dispatcher} that runs messages through the inbox in
 * order per partition key, and the verdicts it settles them with.
 */
import { IdempotencyError, isIdempotencyError } from '../errors.js'
import {
  type ConsumeOptions,
  consumerConcurrency,
  DEFAULT_CONSUMER_BATCH_SIZE,
  DEFAULT_FAILURE_HOLD_MS,
  maxAttemptsOption,
  positive,
} from './consumer-options.js'
import type { InboxMessage } from './inbox/types.js'

/**
 * Handles one message through the inbox. `ack`: applied now or before (a duplicate). `retry`: the
 * effect or the database failed; leave it to the broker. `reject`: redelivery cannot help (same ID,
 * other payload; no ID): drop it and report.
 */
export async function processMessage<Tx>(options: ConsumeOptions<Tx>, message: InboxMessage): Promise<Verdict> {
  try {
    await options.inbox.handle(message, (tx) => options.handler(tx, message))
    return 'ack'
  } catch (error) {
    options.onError?.(error, message)
    if (isIdempotencyError(error) && (error.code === 'FINGERPRINT_MISMATCH' || error.code === 'INVALID_ARGUMENT')) return 'reject'
    return 'retry'
  }
}

/** A dispatcher for a helper's options: `concurrency` workers (or `limit`), batches of `batchSize`. */
export function createDispatcher<Tx>(
  options: ConsumeOptions<Tx>,
  limit = consumerConcurrency(options),
  deadLetter = 'dead-lettered',
): Dispatcher<Tx> {
  const holdMs = options.failureHoldMs ?? DEFAULT_FAILURE_HOLD_MS
  if (!Number.isFinite(holdMs) || holdMs < 0) {
    throw new IdempotencyError('INVALID_OPTION', `consumer: failureHoldMs must be a number >= 0, got ${String(holdMs)}.`)
  }
  const attempts = { max: maxAttemptsOption(options), deadLetter }
  return new Dispatcher(options, limit, positive(options.batchSize, DEFAULT_CONSUMER_BATCH_SIZE, 'batchSize'), holdMs, attempts)
}

/** How many failing messages' attempt counts a consumer keeps at most (the oldest go first). */
const FAILURES_KEPT = 10_000

/**
 * What a helper does with a message once the inbox answered. `ack`: applied (or a duplicate).
 * `retry`: its effect failed, the broker delivers it again. `return`: not tried (an earlier message
 * of its key failed), given back like a retry but not counted as an attempt. `reject`: redelivery
 * cannot help (same ID, other payload; no ID). `dead`: it failed `maxAttempts` times; dead-lettered.
 */
export type Verdict = 'ack' | 'retry' | 'return' | 'reject' | 'dead'

/**
 * Handles several messages (in order) with one inbox transaction when the inbox
 * offers `handleBatch`; if that batch fails, each message alone with {@link processMessage}, one
 * after another, so only the failing one is retried. One verdict per message, in order.
 */
export async function processBatch<Tx>(
  options: ConsumeOptions<Tx>,
  messages: readonly InboxMessage[],
  keys: readonly (string | null)[] = [],
): Promise<Verdict[]> {
  const { inbox } = options
  if (messages.length > 1 && inbox.handleBatch) {
    try {
      const results = await inbox.handleBatch(messages, (tx, message) => options.handler(tx, message))
      return results.map((result, i) => {
        if (result.status !== 'mismatch') return 'ack'
        options.onError?.(result.error, messages[i] as InboxMessage)
        return 'reject'
      })
    } catch {
      // One message (or the database) failed the batch: find out which, one at a time.
    }
  }
  // One at a time; after a failure, the later messages of its key are not applied before it.
  const verdicts: Verdict[] = []
  const failed = new Set<string>()
  for (const [i, message] of messages.entries()) {
    const key = keys[i] ?? null
    if (key !== null && failed.has(key)) {
      verdicts.push('return')
      continue
    }
    const verdict = await processMessage(options, message)
    if (verdict === 'retry' && key !== null) failed.add(key)
    verdicts.push(verdict)
  }
  return verdicts
}

interface Item {
  key: string | null
  message: InboxMessage
  /** Acks, returns or dead-letters the message; rejects when a `dead` message could not be given up (it comes back). */
  settle: (verdict: Verdict) => Promise<void> | void
  /**
   * Delivered before, with `maxAttempts` counted in the inbox: its attempt is counted before it runs, and
   * it runs alone, nothing else beside it (see `push`).
   */
  isolated?: boolean
}

/**
 * The consumer helpers' engine. Messages are given in delivery order with their partition key;
 * up to `concurrency` workers each take a batch of ready messages (each followed by the messages
 * waiting behind it in its key; spread over the idle workers, at most `batchSize`), run it through the inbox in one transaction
 * ({@link processBatch}), then `settle` each (ack, nak, ...), after the commit. A message is ready
 * when no earlier message of its key is in hand; so one key's messages run in order, and effects
 * never run more than `concurrency` at once (a batch runs its effects one after another).
 * `inHand` counts messages given and not settled, for the pull loops' back-pressure.
 */
export class Dispatcher<Tx> {
  readonly #options: ConsumeOptions<Tx>
  readonly #limit: number
  readonly #batchSize: number
  readonly #ready: Item[] = []
  /** Keys with a message ready or running, each with the messages waiting behind it. */
  readonly #keys = new Map<string, Item[]>()
  /** Keys held after a failure: until the failed message (by ID) is given again, or `until`. */
  readonly #held = new Map<string, { id: string; until: number }>()
  readonly #holdMs: number
  #workers = 0
  /** An isolated message is running: nothing else starts until it ends. */
  #isolating = false
  #inHand = 0
  #waiters: Array<() => void> = []

  /** `maxAttempts` (undefined: no limit) and where a message that reached it goes, for its report. */
  readonly #attempts: { max: number | undefined; deadLetter: string }
  /** Failed attempts so far of the messages that failed and have not succeeded since, by message ID. */
  readonly #failures = new Map<string, number>()

  constructor(
    options: ConsumeOptions<Tx>,
    limit: number,
    batchSize: number,
    holdMs: number,
    attempts: { max: number | undefined; deadLetter: string },
  ) {
    this.#options = options
    this.#limit = limit
    this.#batchSize = batchSize
    this.#holdMs = holdMs
    this.#attempts = attempts
  }

  get inHand(): number {
    return this.#inHand
  }

  /**
   * A message given up on before it runs (the broker has delivered it too often: its effect may stop
   * the process each time, so no failure is ever seen to count): reported as `RETRIES_EXHAUSTED` with
   * `why`, then dead-lettered. A hold on its key for it ends; the messages behind it go on.
   */
  giveUp(key: string | null, message: InboxMessage, settle: Item['settle'], why: string): void {
    this.#inHand++
    if (key !== null && this.#held.get(key)?.id === message.id) this.#held.delete(key)
    this.#exhausted(message, `${why}; it is not run`)
    void this.#settleAll([{ key, message, settle }], ['dead']).then(() => this.#settled(1))
  }

  /**
   * Gives a message, in delivery order. `redelivered`: the broker delivered it before, maybe to a
   * process that died running it, which no failure counts. With `maxAttempts` counted in the inbox
   * (and `isolateRedelivered` not false), such a message runs isolated: once every running batch has
   * ended, alone, and nothing starts beside it; its attempt is recorded before it runs, so an effect
   * that kills the process is counted too, and it alone (no innocent neighbour was running). One
   * recorded past `maxAttempts` is given up on without running.
   */
  push(key: string | null, message: InboxMessage, settle: Item['settle'], redelivered = false): void {
    const isolated =
      redelivered &&
      this.#attempts.max !== undefined &&
      this.#options.inbox.recordFailure !== undefined &&
      this.#options.isolateRedelivered !== false
    const item: Item = isolated ? { key, message, settle, isolated } : { key, message, settle }
    this.#inHand++
    if (key !== null && this.#heldBack(key, message.id)) {
      // An earlier message of this key failed and has not come back yet: this one goes back too.
      void this.#settleAll([item]).then(() => this.#settled(1))
      return
    }
    if (key !== null) {
      const behind = this.#keys.get(key)
      if (behind) {
        behind.push(item)
        return
      }
      this.#keys.set(key, [])
    }
    this.#ready.push(item)
    this.#pump()
  }

  #pump(): void {
    while (!this.#isolating && this.#workers < this.#limit && this.#ready.length > 0) {
      if ((this.#ready[0] as Item).isolated) {
        // Alone: once the running batches have ended (each one's end pumps again).
        if (this.#workers > 0) return
        this.#isolating = true
        this.#workers++
        void this.#run([this.#ready.shift() as Item])
        return
      }
      const idle = this.#limit - this.#workers
      const size = Math.min(this.#batchSize, Math.ceil(this.#inHand / idle))
      const batch: Item[] = []
      while (batch.length < size && this.#ready.length > 0 && !(this.#ready[0] as Item).isolated) {
        const item = this.#ready.shift() as Item
        batch.push(item)
        // The messages waiting behind it in its key join the batch, in order, after it (up to an isolated one).
        const behind = item.key === null ? undefined : this.#keys.get(item.key)
        while (behind && behind.length > 0 && batch.length < size && !(behind[0] as Item).isolated) batch.push(behind.shift() as Item)
      }
      this.#workers++
      void this.#run(batch)
    }
  }

  /** Whether `key` is held after a failure; the failed message itself (`id`) ends the hold. */
  #heldBack(key: string, id: string): boolean {
    const hold = this.#held.get(key)
    if (!hold) return false
    if (hold.id === id || Date.now() >= hold.until) {
      this.#held.delete(key)
      return false
    }
    return true
  }

  async #settleAll(items: readonly Item[], verdicts: readonly Verdict[] = []): Promise<void> {
    for (const [i, item] of items.entries()) {
      const verdict = verdicts[i] ?? 'return'
      try {
        await item.settle(verdict)
        if (verdict === 'dead') this.#forget(item.message)
      } catch {
        // settle reports its own failures. A message given up on that could not be moved comes back:
        // its count stays at the limit, so its next failure gives it up again instead of starting over.
        if (verdict === 'dead' && this.#attempts.max !== undefined) this.#failures.set(item.message.id, this.#attempts.max - 1)
      }
    }
  }

  async #run(batch: Item[]): Promise<void> {
    const isolated = (batch[0] as Item).isolated === true
    let verdicts: Verdict[]
    if (isolated) verdicts = [await this.#runIsolated(batch[0] as Item)]
    else {
      try {
        verdicts = await processBatch(
          this.#options,
          batch.map((item) => item.message),
          batch.map((item) => item.key),
        )
      } catch {
        verdicts = batch.map(() => 'retry')
      }
      if (this.#attempts.max !== undefined) {
        const counted: Verdict[] = []
        for (const [i, verdict] of verdicts.entries()) counted.push(await this.#counted(verdict, (batch[i] as Item).message))
        verdicts = counted
      }
    }
    await this.#settleAll(batch, verdicts)
    let settled = batch.length
    for (const key of new Set(batch.map((item) => item.key))) {
      if (key === null) continue
      // The first message of the key going back to the broker (failed, or not tried behind one that failed).
      const failed = batch.find((item, i) => item.key === key && (verdicts[i] === 'retry' || verdicts[i] === 'return'))
      if (failed && this.#holdMs > 0) {
        // Hold the key until the failed message comes back; what waits behind it goes back unapplied.
        this.#held.set(key, { id: failed.message.id, until: Date.now() + this.#holdMs })
        const behind = this.#keys.get(key) ?? []
        this.#keys.delete(key)
        await this.#settleAll(behind)
        settled += behind.length
        continue
      }
      const next = this.#keys.get(key)?.shift()
      if (next) this.#ready.push(next)
      else this.#keys.delete(key)
    }
    this.#workers--
    if (isolated) this.#isolating = false
    this.#settled(settled)
  }

  /**
   * A redelivered message, alone (see `push`): its attempt recorded first, then run unless the
   * attempts recorded already reach `maxAttempts`; a failure is not counted again.
   */
  async #runIsolated(item: Item): Promise<Verdict> {
    const max = this.#attempts.max as number
    const attempt = await this.#failed(item.message)
    if (attempt > max) {
      this.#exhausted(
        item.message,
        `was delivered again after ${attempt - 1} attempt(s) that did not succeed (the process may have stopped while running it), its maxAttempts; it is not run`,
      )
      return 'dead'
    }
    const verdict = await processMessage(this.#options, item.message)
    if (verdict !== 'retry') {
      // Applied, or refused for good: the attempt recorded before it ran goes.
      this.#forget(item.message)
      return verdict
    }
    return this.#retryOrDead(attempt, item.message)
  }

  /** A failure counted against `maxAttempts`: the one that reaches it turns the retry into `dead`, and is reported. */
  async #counted(verdict: Verdict, message: InboxMessage): Promise<Verdict> {
    if (verdict !== 'retry') {
      // Applied (or refused for good) after failing here: its recorded failures go now, not at purge().
      if (verdict !== 'return' && this.#failures.has(message.id)) this.#forget(message)
      return verdict
    }
    return this.#retryOrDead(await this.#failed(message), message)
  }

  /** A failed message after its `attempts`th attempt: retried, or given up on (and reported) at `maxAttempts`. */
  #retryOrDead(attempts: number, message: InboxMessage): Verdict {
    if (attempts < (this.#attempts.max as number)) return 'retry'
    this.#exhausted(message, `failed ${attempts} time(s), its maxAttempts; it is not retried`)
    return 'dead'
  }

  /** Reports a message given up on: `RETRIES_EXHAUSTED`, saying why and where it goes. */
  #exhausted(message: InboxMessage, why: string): void {
    this.#options.onError?.(
      new IdempotencyError(
        'RETRIES_EXHAUSTED',
        `consumer: message "${message.id}" ${why}: ${this.#attempts.deadLetter}. Fix the cause, then move it back for another try.`,
      ),
      message,
    )
  }

  /**
   * Counts one more failure of `message` and answers how many there have been: as the inbox records them
   * (every process of this consumer, across restarts), or, when it cannot, as this process counted them.
   */
  async #failed(message: InboxMessage): Promise<number> {
    const failures = this.#failures
    const local = (failures.get(message.id) ?? 0) + 1
    failures.delete(message.id) // re-inserted last: the oldest counts are the ones dropped
    if (failures.size >= FAILURES_KEPT) failures.delete(failures.keys().next().value as string)
    failures.set(message.id, local)
    const inbox = this.#options.inbox
    if (!inbox.recordFailure) return local
    try {
      return Math.max(local, await inbox.recordFailure(message))
    } catch (error) {
      this.#options.onError?.(error, message)
      return local
    }
  }

  /**
   * A message given up on and moved (so that moved back it starts afresh), or applied or refused after
   * attempts were recorded: its counts go.
   */
  #forget(message: InboxMessage): void {
    this.#failures.delete(message.id)
    const inbox = this.#options.inbox
    inbox.forgetFailures?.(message.id).catch((error: unknown) => this.#options.onError?.(error, message))
  }

  #settled(count: number): void {
    this.#inHand -= count
    this.#pump()
    const waiters = this.#waiters
    this.#waiters = []
    for (const wake of waiters) wake()
  }

  /** Resolves once fewer than `max` messages are in hand. */
  async room(max: number): Promise<void> {
    while (this.#inHand >= max) await new Promise<void>((resolve) => this.#waiters.push(resolve))
  }

  /** Resolves when every message given so far (and any given meanwhile) is settled. */
  async idle(): Promise<void> {
    while (this.#inHand > 0) await new Promise<void>((resolve) => this.#waiters.push(resolve))
  }
}
