import type { Channel, ConsumeMessage } from 'amqplib'

/** Where a delivered message stands in the {@link AckWindow}. */
type State = 'running' | 'acked' | 'waiting' | 'settled'

/** A delivered message's handle in the {@link AckWindow}. */
export interface AckEntry {
  readonly msg: ConsumeMessage
  state: State
}

/**
 * The acks of one consumer channel, sent as few frames as the order of settlement allows.
 *
 * A channel's delivery tags rise in delivery order, and `basic.ack` with `multiple` settles every
 * unacked tag up to the one given. Messages finish out of order (up to `concurrency` batches run at
 * once), so acks are gathered and, once per turn of the event loop, the run of acked messages at the
 * front of the window goes out as one multiple ack. A message still running holds back the acks
 * behind it (briefly: it is being applied). A message waiting out its requeue delay would hold them
 * back for that whole delay, so the acks behind it go out one by one instead; a multiple ack never
 * covers it. Nacks (requeue or reject) are always sent one by one, when due.
 */
export class AckWindow {
  readonly #channel: Pick<Channel, 'ack' | 'nack'>
  /** Delivered and not yet settled at the broker, oldest first. */
  #entries: AckEntry[] = []
  #head = 0
  #scheduled = false

  constructor(channel: Pick<Channel, 'ack' | 'nack'>) {
    this.#channel = channel
  }

  /** Messages delivered whose ack, nack or reject has not been sent yet. */
  get unsettled(): number {
    let n = 0
    for (let i = this.#head; i < this.#entries.length; i++) if ((this.#entries[i] as AckEntry).state !== 'settled') n++
    return n
  }

  /** A message just delivered (in delivery order): returns its handle for the calls below. */
  delivered(msg: ConsumeMessage): AckEntry {
    const entry: AckEntry = { msg, state: 'running' }
    this.#entries.push(entry)
    return entry
  }

  /** Applied (or a known duplicate): acked with the next flush. */
  ack(entry: AckEntry): void {
    if (entry.state !== 'running') return
    entry.state = 'acked'
    this.#schedule()
  }

  /** Refused for good: rejected now, without requeue (to the dead-letter exchange, if any). */
  reject(entry: AckEntry): void {
    this.#nack(entry, false)
  }

  /** Failed: it will be requeued once its delay has passed; until then acks behind it go out one by one. */
  holdForRequeue(entry: AckEntry): void {
    if (entry.state !== 'running') return
    entry.state = 'waiting'
    this.#schedule()
  }

  /** Requeues a message held by {@link holdForRequeue}. */
  requeue(entry: AckEntry): void {
    this.#nack(entry, true)
  }

  /** Sends every ack gathered so far (also called by the scheduled flush). */
  flush(): void {
    this.#scheduled = false
    let last: AckEntry | undefined
    while (this.#head < this.#entries.length) {
      const entry = this.#entries[this.#head] as AckEntry
      if (entry.state === 'acked') {
        last = entry
        entry.state = 'settled'
      } else if (entry.state !== 'settled') break
      this.#head++
    }
    if (last) this.#channel.ack(last.msg, true)
    // A requeue delay at the front: what was acked behind it cannot wait that long.
    if ((this.#entries[this.#head] as AckEntry | undefined)?.state === 'waiting') {
      for (let i = this.#head + 1; i < this.#entries.length; i++) {
        const entry = this.#entries[i] as AckEntry
        if (entry.state !== 'acked') continue
        entry.state = 'settled'
        this.#channel.ack(entry.msg, false)
      }
    }
    this.#compact()
  }

  #nack(entry: AckEntry, requeue: boolean): void {
    if (entry.state === 'settled' || entry.state === 'acked') return
    // Acks gathered in front of it go first, so the broker sees settlements in a sane order.
    this.flush()
    entry.state = 'settled'
    this.#channel.nack(entry.msg, false, requeue)
    this.flush()
  }

  #schedule(): void {
    if (this.#scheduled) return
    this.#scheduled = true
    setImmediate(() => {
      try {
        this.flush()
      } catch {
        // The channel closed: the broker requeues every unacked message itself.
      }
    })
  }

  #compact(): void {
    if (this.#head > 1_024 && this.#head * 2 > this.#entries.length) {
      this.#entries = this.#entries.slice(this.#head)
      this.#head = 0
    }
  }
}
