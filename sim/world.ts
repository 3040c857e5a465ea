/**
 * The simulator's world: one seeded random source, one queue of events in simulated time, and the
 * processes whose clocks and timers run on it. Nothing here reads real time or arms a real timer, so
 * a run is a pure function of its seed: the same seed replays the same schedule, event for event.
 */
import type { Clock } from '../src/core/clock.js'

/** mulberry32: a small, fast, well-spread 32-bit generator; enough for choosing schedules. */
export class Rng {
  #state: number
  constructor(seed: number) {
    this.#state = seed >>> 0 || 0x9e3779b9
  }
  /** A float in [0, 1). */
  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0
    let t = this.#state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  /** An integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n)
  }
  /** True with probability `p`. */
  chance(p: number): boolean {
    return p > 0 && this.next() < p
  }
  /** A float in [min, max). */
  between(min: number, max: number): number {
    return min + this.next() * (max - min)
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)] as T
  }
}

interface Event {
  at: number
  seq: number
  owner: Proc | null
  fire: () => void
  cancelled: boolean
}

/** Events in time order; ties in the order they were scheduled. */
class EventQueue {
  readonly #heap: Event[] = []
  get size(): number {
    return this.#heap.length
  }
  push(event: Event): void {
    const heap = this.#heap
    heap.push(event)
    let i = heap.length - 1
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (!before(event, heap[parent] as Event)) break
      heap[i] = heap[parent] as Event
      i = parent
    }
    heap[i] = event
  }
  pop(): Event | undefined {
    const heap = this.#heap
    const top = heap[0]
    const last = heap.pop()
    if (top === undefined || last === undefined || heap.length === 0) return top
    let i = 0
    for (;;) {
      const left = 2 * i + 1
      if (left >= heap.length) break
      const right = left + 1
      const child = right < heap.length && before(heap[right] as Event, heap[left] as Event) ? right : left
      if (!before(heap[child] as Event, last)) break
      heap[i] = heap[child] as Event
      i = child
    }
    heap[i] = last
    return top
  }
}

const before = (a: Event, b: Event) => a.at < b.at || (a.at === b.at && a.seq < b.seq)

/**
 * How the scheduler waits, between two events, for every promise continuation the first released (and
 * those they queue) to run:
 * - `tick` (the default): on a `process.nextTick`, which Node runs once the whole microtask queue has
 *   drained. About a quarter of the cost of `loop`, which goes round the event loop (and into the
 *   kernel) once per event. It relies on the code under simulation queueing no ticks of its own (a tick
 *   queued behind the settle's could still be pending when it resolves): the ledger, engine, client
 *   and memory store queue none, and test/sim.test.ts pins that both ways replay the same runs.
 * - `loop`: on a `setImmediate`, after everything queued, ticks included.
 */
export type Settle = 'tick' | 'loop'

const settlers: Record<Settle, () => Promise<void>> = {
  tick: () => new Promise<void>((resolve) => process.nextTick(resolve)),
  loop: () => new Promise<void>((resolve) => setImmediate(resolve)),
}

export class World {
  /** Simulated true time, in ms (the store server's clock). */
  now = 0
  /** Events fired so far. */
  fired = 0
  readonly rng: Rng
  readonly #queue = new EventQueue()
  #seq = 0
  readonly #trace: string[] | undefined
  readonly #settle: () => Promise<void>

  constructor(
    readonly seed: number,
    options: { trace?: boolean; settle?: Settle } = {},
  ) {
    this.rng = new Rng(seed)
    this.#trace = options.trace ? [] : undefined
    this.#settle = settlers[options.settle ?? 'tick']
  }

  /** Calls `fire` after `delayMs` of simulated time, unless cancelled, and only while `owner` (if any) is up. */
  at(delayMs: number, owner: Proc | null, fire: () => void): () => void {
    const event: Event = { at: this.now + Math.max(0, delayMs), seq: this.#seq++, owner, fire, cancelled: false }
    this.#queue.push(event)
    return () => {
      event.cancelled = true
    }
  }

  log(line: () => string): void {
    if (this.#trace) this.#trace.push(`${this.now.toFixed(2).padStart(10)}ms  ${line()}`)
  }

  get tracing(): boolean {
    return this.#trace !== undefined
  }

  trace(): string[] {
    return this.#trace ?? []
  }

  /** Re-queues an event held while its process was paused, at the time the process resumes. */
  requeue(event: Event): void {
    event.at = this.now
    event.seq = this.#seq++
    this.#queue.push(event)
  }

  /**
   * Fires events in order until `done()` or no event is left or time passes `untilMs`. Between two
   * events every continuation they released runs to its end (the processes are quiet when time moves).
   * When it stops for want of events before `untilMs`, time still passes to `untilMs`: nothing happens
   * meanwhile, but leases run out and deadlines pass, as they would.
   */
  async run(done: () => boolean, untilMs = Number.POSITIVE_INFINITY): Promise<void> {
    const settle = this.#settle
    await settle()
    while (!done()) {
      const event = this.#queue.pop()
      if (event === undefined) {
        if (untilMs !== Number.POSITIVE_INFINITY) this.now = Math.max(this.now, untilMs)
        return
      }
      if (event.cancelled) continue
      if (event.at > untilMs) {
        this.#queue.push(event)
        this.now = Math.max(this.now, untilMs)
        return
      }
      const owner = event.owner
      if (owner?.state === 'crashed') continue
      if (owner?.state === 'paused') {
        owner.held.push(event)
        continue
      }
      if (event.at > this.now) this.now = event.at
      this.fired++
      event.fire()
      await settle()
    }
  }
}

/**
 * A process of the simulated deployment (an app instance or a client): its own clock (offset from
 * true time, which may jump), its timers on the world's queue. Paused, its timers and replies wait
 * and its work resumes late (a zombie); crashed, they never come and its work is gone.
 */
export class Proc {
  state: 'up' | 'paused' | 'crashed' = 'up'
  /** Pauses and clock jumps so far: work that spans one of them may act late (a zombie), by design. */
  disturbances = 0
  readonly held: Array<Parameters<World['requeue']>[0]> = []
  /** Offset of this process's clock from true time. */
  skewMs: number
  readonly clock: Clock

  constructor(
    readonly world: World,
    readonly id: string,
    skewMs = 0,
  ) {
    this.skewMs = skewMs
    this.clock = {
      now: () => Math.round(world.now + this.skewMs),
      timer: (ms, callback) => world.at(ms, this, callback),
      sleep: (ms, signal) =>
        new Promise<void>((resolve, reject) => {
          if (signal?.aborted) return reject(signal.reason)
          const onAbort = () => {
            cancel()
            reject(signal?.reason)
          }
          const cancel = world.at(ms, this, () => {
            signal?.removeEventListener('abort', onAbort)
            resolve()
          })
          signal?.addEventListener('abort', onAbort, { once: true })
        }),
    }
  }

  pause(): void {
    if (this.state !== 'up') return
    this.state = 'paused'
    this.disturbances++
  }

  /** The process's clock jumps by `ms` (backwards when negative). */
  jump(ms: number): void {
    this.skewMs += ms
    this.disturbances++
  }

  resume(): void {
    if (this.state !== 'paused') return
    this.state = 'up'
    for (const event of this.held.splice(0)) this.world.requeue(event)
  }

  crash(): void {
    this.state = 'crashed'
    this.held.length = 0
  }
}
