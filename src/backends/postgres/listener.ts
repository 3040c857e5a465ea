import type { Unsubscribe } from '../../core/store.js'
import type { PgClientLike, PgNotification, PgPoolLike } from './pool.js'

const MAX_BACKOFF_MS = 5_000

/**
 * One LISTENing connection shared by every waiter of a store (not one per waiter). Waiters register
 * a callback per (scope, key), and the first waiter of a record in this process flags it in the table
 * (`arm`); `complete`, `release` and `evict` of a flagged record send `pg_notify(channel,
 * scope || '\n' || key)` in the same statement, delivered at commit. When `arm` finds the record no
 * longer in progress (it changed before the flag), the waiters are woken at once. The connection is opened on the
 * first watch, reopened with backoff when it breaks (waking every waiter then, since notices sent
 * meanwhile are lost), and given back (destroyed, never pooled while LISTENing) after `idleMs`
 * without waiters. Waiters poll as well, so a lost notice costs a poll interval, never a hang.
 */
export class Listener {
  readonly #pool: () => Promise<PgPoolLike>
  readonly #channel: string
  readonly #idleMs: number
  readonly #arm: (id: string) => Promise<boolean>
  /** Bound on the LISTEN statement: one sent on a half-open connection would otherwise never settle. */
  readonly #queryTimeoutMs: number
  readonly #watchers = new Map<string, Set<() => void>>()
  #client: PgClientLike | undefined
  #connecting = false
  #closed = false
  #failures = 0
  #retryTimer: NodeJS.Timeout | undefined
  #idleTimer: NodeJS.Timeout | undefined
  #probeTimer: NodeJS.Timeout | undefined

  constructor(
    pool: () => Promise<PgPoolLike>,
    channel: string,
    arm: (id: string) => Promise<boolean>,
    queryTimeoutMs: number,
    idleMs = 30_000,
  ) {
    this.#pool = pool
    this.#queryTimeoutMs = queryTimeoutMs
    this.#arm = arm
    this.#channel = channel
    this.#idleMs = idleMs
  }

  /** Whether anyone in this process watches the record. */
  watches(id: string): boolean {
    return this.#watchers.has(id)
  }

  /** Whether the LISTEN connection is up (for tests and health checks). */
  get listening(): boolean {
    return this.#client !== undefined
  }

  watch(id: string, onChange: () => void): Unsubscribe {
    if (this.#closed) return () => {}
    let listeners = this.#watchers.get(id)
    const first = !listeners
    if (!listeners) {
      listeners = new Set()
      this.#watchers.set(id, listeners)
    }
    listeners.add(onChange)
    clearTimeout(this.#idleTimer)
    this.#ensure()
    if (first) {
      const wake = () => this.#wake(id)
      this.#arm(id).then((inProgress) => inProgress || wake(), wake)
    }
    return () => {
      listeners.delete(onChange)
      if (listeners.size === 0 && this.#watchers.get(id) === listeners) this.#watchers.delete(id)
      if (this.#watchers.size === 0) this.#scheduleIdleStop()
    }
  }

  /** Resolves once the connection LISTENs (or failed to); for tests and warm-up. */
  async ready(): Promise<boolean> {
    this.#ensure()
    for (let i = 0; i < 500 && this.#connecting; i++) await new Promise((resolve) => setTimeout(resolve, 10))
    return this.listening
  }

  async close(): Promise<void> {
    this.#closed = true
    clearTimeout(this.#retryTimer)
    clearTimeout(this.#idleTimer)
    this.#watchers.clear()
    this.#drop()
  }

  #ensure(): void {
    if (this.#closed || this.#client || this.#connecting || this.#retryTimer) return
    this.#connecting = true
    // #connect handles its own failures (retry with backoff); it never rejects.
    void this.#connect().finally(() => {
      this.#connecting = false
    })
  }

  async #connect(): Promise<void> {
    let client: PgClientLike | undefined
    try {
      client = await (await this.#pool()).connect()
      if (!client.on) {
        // Not a node-postgres client: no notifications, waiters poll.
        client.release()
        this.#closed = true
        return
      }
      // An error on a checked-out client with no listener would crash the process. A replaced client's
      // late 'error' or 'end' must not be taken for the loss of the current one: the handler is this client's.
      const connected = client
      const lost = () => this.#lost(connected)
      client.on('error', lost)
      client.on('end', lost)
      client.on('notification', this.#onNotification)
      // Unbounded, a LISTEN on a half-open connection kept this listener connecting (and its pool slot
      // taken) for ever: waiters were left to polling for the life of the store.
      await client.query({ text: `LISTEN "${this.#channel}"`, query_timeout: this.#queryTimeoutMs })
      if (this.#closed) {
        client.release(true)
        return
      }
      this.#client = client
      this.#failures = 0
      this.#scheduleProbe(client)
      // Changes made while nobody listened were not announced: every waiter looks again.
      this.#wakeAll()
    } catch {
      client?.release(true)
      this.#retry()
    }
  }

  readonly #onNotification = (message: PgNotification): void => {
    if (message.channel === this.#channel && message.payload !== undefined) this.#wake(message.payload)
  }

  #wake(id: string): void {
    const listeners = this.#watchers.get(id)
    if (listeners) for (const listener of [...listeners]) listener()
  }

  /** The loss of `client`: acted on only while it is the listening connection. */
  #lost(client: PgClientLike): void {
    if (this.#client !== client) return
    this.#drop()
    this.#wakeAll()
    this.#retry()
  }

  #retry(): void {
    if (this.#closed || this.#watchers.size === 0 || this.#retryTimer) return
    const delay = Math.min(MAX_BACKOFF_MS, 100 * 2 ** this.#failures++)
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined
      this.#ensure()
    }, delay)
    this.#retryTimer.unref()
  }

  /**
   * A LISTENing connection only receives: gone half-open, nothing ever fails on it and notices stop
   * for good. While anyone waits, a `SELECT 1` bounded by queryTimeout, every queryTimeout, finds it
   * out; the connection is then replaced (and every waiter looks again).
   */
  #scheduleProbe(client: PgClientLike): void {
    clearTimeout(this.#probeTimer)
    this.#probeTimer = setTimeout(() => {
      this.#probeTimer = undefined
      if (this.#client !== client) return
      if (this.#watchers.size === 0) return this.#scheduleProbe(client)
      client.query({ text: 'SELECT 1', query_timeout: this.#queryTimeoutMs }).then(
        () => {
          if (this.#client === client) this.#scheduleProbe(client)
        },
        () => this.#lost(client),
      )
    }, this.#queryTimeoutMs)
    this.#probeTimer.unref()
  }

  #scheduleIdleStop(): void {
    clearTimeout(this.#idleTimer)
    this.#idleTimer = setTimeout(() => {
      if (this.#watchers.size === 0) this.#drop()
    }, this.#idleMs)
    this.#idleTimer.unref()
  }

  /** Destroys the connection: a LISTENing connection must never go back into the pool. */
  #drop(): void {
    const client = this.#client
    this.#client = undefined
    clearTimeout(this.#probeTimer)
    this.#probeTimer = undefined
    if (!client) return
    client.removeListener?.('notification', this.#onNotification)
    // Its 'error' and 'end' listeners stay (a destroyed socket may still emit either): they act only
    // while this client is the listening one.
    client.release(true)
  }

  #wakeAll(): void {
    for (const listeners of [...this.#watchers.values()]) for (const listener of [...listeners]) listener()
  }
}
