/** Group commit of PostgresStore's pool path. Not part of the public API. */

/** What a batch statement answers for one of its callers: the answer, or "send it again in the next batch". */
export type BatchAnswer<O> = { value: O } | { again: true }

/** One kind of operation (acquire, complete, …), as one statement for one caller and as one for many. */
export interface BatchKind<I, O> {
  /** The single-statement path, exactly as without group commit: taken by a caller that finds no batch of its kind in flight. */
  one(input: I): Promise<O>
  /**
   * One statement for several callers (at least two), answering in their order. The inputs come
   * sorted by identity, so every batch (in any process) takes its row locks in one order and two
   * batches cannot deadlock each other; with `distinct`, no two share an identity.
   */
  many(inputs: I[]): Promise<Array<BatchAnswer<O>>>
  /** The row an input touches (scope and key). */
  identity(input: I): string
  /** Whether two inputs of one row must go in separate statements (an UPDATE … FROM changes a row once). */
  distinct: boolean
  /** The error for a caller sent again `MAX_ROUNDS` times (writers kept changing its row). */
  gaveUp(input: I): Error
  /**
   * Whether a failed batch statement should be run again as single statements, one per caller
   * (a deadlock with another process's batch: the server rolled it back whole, nothing was written).
   */
  alone(error: unknown): boolean
}

interface Waiting<I, O> {
  input: I
  rounds: number
  resolve: (value: O) => void
  reject: (error: unknown) => void
}

/** How many times a caller may be sent again, as the single path retries its statement. */
export const MAX_ROUNDS = 100
/** Callers per statement: bounds the size of one statement's arrays (and of its response). */
export const MAX_BATCH = 256

/**
 * Batches what is already waiting, with no timer. A caller that finds no statement of its kind in
 * flight sends the single statement at once (no added latency); callers that arrive while one is in
 * flight wait for it and then go out together, as one statement and one commit:
 *
 *   caller A ──acquire(A)──────────▶ answer A
 *   callers B, C, D  (queued while A is in flight)
 *                                   ──acquire(B, C, D)──▶ answers B, C, D
 *   callers E, F  (queued meanwhile)                    ──acquire(E, F)──▶ …
 *
 * Where a kind cannot change one row twice in a statement, a second caller of a row already in the
 * batch waits for the next batch, and then sees the first one's effect, as on the single path.
 */
export class GroupCommit<I, O> {
  readonly #kind: BatchKind<I, O>
  readonly #waiting: Array<Waiting<I, O>> = []
  #busy = false
  /** Who waits for every caller to be answered (a close()). */
  readonly #idle: Array<() => void> = []

  constructor(kind: BatchKind<I, O>) {
    this.#kind = kind
  }

  run(input: I): Promise<O> {
    if (this.#busy) {
      return new Promise<O>((resolve, reject) => {
        this.#waiting.push({ input, rounds: 0, resolve, reject })
      })
    }
    this.#busy = true
    let answer: Promise<O>
    try {
      answer = this.#kind.one(input)
    } catch (error) {
      // A driver that throws instead of rejecting must not leave the kind busy for ever.
      answer = Promise.reject(error)
    }
    void answer.then(this.#next, this.#next)
    return answer
  }

  /**
   * Resolves once no statement of this kind is in flight and no caller waits: a store's close() waits
   * for it before ending its pool, so the callers queued behind a batch get their answers, not a pool
   * that was ended under them.
   */
  idle(): Promise<void> {
    if (!this.#busy) return Promise.resolve()
    return new Promise<void>((resolve) => {
      this.#idle.push(resolve)
    })
  }

  readonly #next = (): void => {
    if (this.#waiting.length === 0) {
      this.#busy = false
      for (const resolve of this.#idle.splice(0)) resolve()
      return
    }
    const batch: Array<{ waiting: Waiting<I, O>; id: string }> = []
    const later: Array<Waiting<I, O>> = []
    const ids = new Set<string>()
    for (const waiting of this.#waiting.splice(0)) {
      const id = this.#kind.identity(waiting.input)
      if (batch.length >= MAX_BATCH || (this.#kind.distinct && ids.has(id))) later.push(waiting)
      else {
        if (this.#kind.distinct) ids.add(id)
        batch.push({ waiting, id })
      }
    }
    // Those left for later go ahead of whoever arrives while this batch is in flight.
    this.#waiting.push(...later)
    if (batch.length === 1) {
      const only = (batch[0] as { waiting: Waiting<I, O> }).waiting
      void Promise.resolve()
        .then(() => this.#kind.one(only.input))
        .then(only.resolve, only.reject)
        .finally(this.#next)
      return
    }
    batch.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
    void this.#kind
      .many(batch.map(({ waiting }) => waiting.input))
      .then(
        (answers) => {
          const again: Array<Waiting<I, O>> = []
          for (const [i, { waiting }] of batch.entries()) {
            const answer = answers[i] as BatchAnswer<O>
            if ('value' in answer) waiting.resolve(answer.value)
            else if (++waiting.rounds >= MAX_ROUNDS) waiting.reject(this.#kind.gaveUp(waiting.input))
            else again.push(waiting)
          }
          this.#waiting.unshift(...again)
        },
        async (error: unknown) => {
          // One statement, one transaction: it failed as a whole and wrote nothing. Every caller in it
          // gets its error, or, when the single statements cannot meet the same failure, its own answer from one.
          if (!this.#kind.alone(error)) {
            for (const { waiting } of batch) waiting.reject(error)
            return
          }
          await Promise.all(batch.map(({ waiting }) => this.#kind.one(waiting.input).then(waiting.resolve, waiting.reject)))
        },
      )
      .finally(this.#next)
  }
}
