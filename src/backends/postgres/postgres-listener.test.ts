/**
 * The PostgreSQL store's shared LISTEN connection (Listener), on its own: which notices wake which
 * watcher, what `arm` answering does, unwatch and the idle stop, close(), reconnecting (and waking every
 * watcher) after the connection is lost, the backoff between attempts, the SELECT 1 probe while anyone
 * watches, and clients that are not node-postgres clients. Against the PostgreSQL at 127.0.0.1:5432
 * through a thin pool wrapper that counts connects and releases, logs the statements, can hold or fail
 * them and can hand a client's own event listeners an event; the backoff and ready() give-up run on fake
 * timers against a pool that never reaches a server.
 */
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { eventually } from '../../../test/helpers/eventually.js'
import { serviceSkipReason } from '../../../test/helpers/services.js'
import { Listener } from './listener.js'
import type { PgClientLike, PgNotification, PgPoolLike, PgQueryConfig, PgQueryResult } from './pool.js'

const URL = 'postgres://root@127.0.0.1:5432/test'
const skip = await serviceSkipReason('PostgreSQL', 5432)
if (skip) console.warn(`\n!!! SKIPPED: Listener (LISTEN/NOTIFY connection) against PostgreSQL: ${skip}\n`)
const suffix = randomUUID().slice(0, 8)
let channels = 0
/** A channel of this test's own. */
const channel = () => `idemkey_listener_${suffix}_${channels++}`

/** Resolves when `check` turns true, polling every few ms; rejects after `ms` (a deadline, not a timing). */
const until = (check: () => boolean | Promise<boolean>, what: string, ms = 5_000) => eventually(check, what, ms, 5)
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

type Handler = (arg?: unknown) => void

/** One client the wrapper handed out: the pg client under it, what was sent on it, its releases. */
interface Conn {
  raw: pg.PoolClient
  sent: PgQueryConfig[]
  released: Array<boolean | Error | undefined>
  /** The listeners registered through the wrapper and not removed, per event. */
  handlers: Map<string, Set<Handler>>
}

/**
 * A pg.Pool seen through a thin wrapper: counts connects, logs each client's statements and releases,
 * keeps the client's listeners (forwarded to the real client too) so a test can fire an event at them,
 * can hold a statement (`hold` answers a promise of its own) and gate connect. `noOn` / `noRemove` leave
 * out `on` / `removeListener` (both optional in PgClientLike).
 */
function tap(pool: pg.Pool, options: { noOn?: boolean; noRemove?: boolean } = {}) {
  const conns: Conn[] = []
  let hold: ((config: PgQueryConfig, index: number) => Promise<PgQueryResult> | undefined) | undefined
  let gate: Promise<void> | undefined
  const wrapped: PgPoolLike = {
    query: ((config: PgQueryConfig) => pool.query(config)) as unknown as PgPoolLike['query'],
    connect: async () => {
      await gate
      const raw = await pool.connect()
      const conn: Conn = { raw, sent: [], released: [], handlers: new Map() }
      const index = conns.push(conn) - 1
      const client: PgClientLike = {
        query: (async (config: PgQueryConfig) => {
          conn.sent.push(config)
          return hold?.(config, index) ?? raw.query(config)
        }) as PgClientLike['query'],
        release: (destroy?: boolean | Error) => {
          conn.released.push(destroy)
          raw.release(destroy)
        },
      }
      if (!options.noOn) {
        client.on = ((event: string, handler: Handler) => {
          if (!conn.handlers.has(event)) conn.handlers.set(event, new Set())
          conn.handlers.get(event)?.add(handler)
          raw.on(event as 'end', handler)
        }) as PgClientLike['on']
      }
      if (!options.noRemove) {
        client.removeListener = ((event: string, handler: Handler) => {
          conn.handlers.get(event)?.delete(handler)
          raw.removeListener(event, handler)
        }) as PgClientLike['removeListener']
      }
      return client
    },
  }
  return {
    pool: wrapped,
    conns,
    /** Hands `event` to the listeners registered (and not removed) on client `index`, as pg would. */
    fire: (index: number, event: 'notification' | 'error' | 'end', arg?: PgNotification | Error) => {
      for (const handler of [...(conns[index]?.handlers.get(event) ?? [])]) handler(arg)
    },
    holdWith: (fn: typeof hold) => {
      hold = fn
    },
    gateWith: (promise: Promise<void> | undefined) => {
      gate = promise
    },
    probes: (index: number) => conns[index]?.sent.filter((q) => q.text === 'SELECT 1').length ?? 0,
  }
}

/** The server process of a client's connection (for pg_terminate_backend). */
const pidOf = (conn: Conn | undefined) => (conn?.raw as unknown as { processID?: number } | undefined)?.processID

function deferred<T>() {
  let resolve!: (value: T) => void
  let reject!: (error: Error) => void
  const promise = new Promise<T>((yes, no) => {
    resolve = yes
    reject = no
  })
  return { promise, resolve, reject }
}

/** Counts the calls of each named watcher. */
function counter() {
  const calls = new Map<string, number>()
  return {
    calls,
    of: (name: string) => calls.get(name) ?? 0,
    fn: (name: string) => () => calls.set(name, (calls.get(name) ?? 0) + 1),
  }
}

const inProgress = async (_id: string) => true

describe.skipIf(skip !== undefined)('Listener against PostgreSQL', () => {
  const pool = new pg.Pool({ connectionString: URL, max: 6 })
  const admin = new pg.Pool({ connectionString: URL, max: 2 })
  const notify = (on: string, payload: string) => admin.query('SELECT pg_notify($1, $2)', [on, payload])
  const opened: Listener[] = []
  /** A Listener on `t`'s pool, closed after the test. */
  const listener = (t: ReturnType<typeof tap>, on: string, arm = inProgress, queryTimeoutMs = 10_000, idleMs = 60_000) => {
    const made = new Listener(async () => t.pool, on, arm, queryTimeoutMs, idleMs)
    opened.push(made)
    return made
  }
  /**
   * A listener on `t` and `on` with one counted watcher per id (counted under the id), once it listens,
   * its counts cleared: the first LISTEN wakes every watcher once.
   */
  const watched = async (t: ReturnType<typeof tap>, on: string, ids: string[], arm = inProgress, queryTimeoutMs?: number) => {
    const l = listener(t, on, arm, queryTimeoutMs)
    const c = counter()
    const stops = ids.map((id) => l.watch(id, c.fn(id)))
    expect(await l.ready()).toBe(true)
    c.calls.clear()
    return { l, c, stops }
  }

  afterEach(async () => {
    for (const made of opened.splice(0)) await made.close()
  })
  afterAll(async () => {
    await pool.end()
    await admin.end()
  })

  it('wakes the watchers of an id on a notice of that id on its channel, and not those of another id', async () => {
    const t = tap(pool)
    const on = channel()
    const l = listener(t, on)
    const c = counter()
    l.watch('s\na', c.fn('a1'))
    l.watch('s\na', c.fn('a2'))
    l.watch('s\nb', c.fn('b'))
    expect(await l.ready()).toBe(true)
    expect(l.listening).toBe(true)
    // The first LISTEN woke everyone once: count from here.
    c.calls.clear()
    await notify(on, 's\na')
    await until(() => c.of('a1') === 1 && c.of('a2') === 1, 'the notice of a')
    await notify(on, 's\nb')
    await until(() => c.of('b') === 1, 'the notice of b')
    expect(c.of('a1')).toBe(1)
    expect(t.conns).toHaveLength(1)
    expect(t.conns[0]?.sent[0]).toEqual({ text: `LISTEN "${on}"`, query_timeout: 10_000 })
  })

  it('ignores a notice of the id on another channel the same connection listens to', async () => {
    const t = tap(pool)
    const on = channel()
    const other = channel()
    const { l, c } = await watched(t, on, ['a'])
    await t.conns[0]?.raw.query(`LISTEN "${other}"`)
    await notify(other, 'a')
    // A later notice on the listener's channel arrives after the other one: the other was seen and ignored.
    l.watch('marker', c.fn('marker'))
    await notify(on, 'marker')
    await until(() => c.of('marker') === 1, 'the marker notice')
    expect(c.of('a')).toBe(0)
    await notify(on, 'a')
    await until(() => c.of('a') === 1, 'the notice on its own channel')
  })

  it('calls arm once per id, for its first watcher, and wakes it at once when arm says the record is no longer in progress', async () => {
    const t = tap(pool)
    const armed: string[] = []
    const answers = new Map<string, ReturnType<typeof deferred<boolean>>>()
    const arm = (id: string) => {
      armed.push(id)
      const d = deferred<boolean>()
      answers.set(id, d)
      return d.promise
    }
    const { l, c } = await watched(t, channel(), ['up'], arm)
    l.watch('done', c.fn('done'))
    l.watch('done', c.fn('done2'))
    l.watch('busy', c.fn('busy'))
    l.watch('broken', c.fn('broken'))
    expect(armed).toEqual(['up', 'done', 'busy', 'broken'])
    answers.get('busy')?.resolve(true)
    answers.get('done')?.resolve(false)
    answers.get('broken')?.reject(new Error('arm failed'))
    await until(() => c.of('done') === 1 && c.of('done2') === 1 && c.of('broken') === 1, 'the wake-ups of done and broken')
    await pause(20)
    expect(c.of('busy')).toBe(0)
    expect(c.of('up')).toBe(0)
  })

  it('wakes nobody (and throws nowhere) when arm answers for an id no longer watched', async () => {
    const t = tap(pool)
    const unhandled: unknown[] = []
    const onUnhandled = (reason: unknown) => unhandled.push(reason)
    process.on('unhandledRejection', onUnhandled)
    try {
      const answer = deferred<boolean>()
      const { l, c, stops } = await watched(t, channel(), ['gone'], () => answer.promise)
      stops[0]?.()
      expect(l.watches('gone')).toBe(false)
      answer.resolve(false)
      await pause(30)
      expect(c.of('gone')).toBe(0)
      expect(unhandled).toEqual([])
    } finally {
      process.off('unhandledRejection', onUnhandled)
    }
  })

  it('unwatch removes only that watcher, forgets the id with its last one, and a stale unwatch leaves a new watcher alone', async () => {
    const t = tap(pool)
    const on = channel()
    const l = listener(t, on)
    const c = counter()
    const stop1 = l.watch('k', c.fn('w1'))
    const stop2 = l.watch('k', c.fn('w2'))
    expect(await l.ready()).toBe(true)
    c.calls.clear()
    stop1()
    expect(l.watches('k')).toBe(true)
    await notify(on, 'k')
    await until(() => c.of('w2') === 1, 'the notice')
    expect(c.of('w1')).toBe(0)
    stop2()
    expect(l.watches('k')).toBe(false)
    // A new watcher of the same id, then the old unsubscribe called again: the new one stays.
    const stop3 = l.watch('k', c.fn('w3'))
    stop2()
    stop1()
    expect(l.watches('k')).toBe(true)
    await notify(on, 'k')
    await until(() => c.of('w3') === 1, 'the notice to the new watcher')
    stop3()
    expect(l.watches('k')).toBe(false)
  })

  it('gives the connection back, destroyed, idleMs after its last watcher left, and not while one remains', async () => {
    const t = tap(pool)
    const l = listener(t, channel(), inProgress, 10_000, 40)
    const stopA = l.watch('a', () => {})
    const stopB = l.watch('b', () => {})
    expect(await l.ready()).toBe(true)
    stopA()
    await pause(150)
    expect(l.listening).toBe(true)
    expect(t.conns[0]?.released).toEqual([])
    stopB()
    await until(() => !l.listening, 'the idle stop')
    expect(t.conns[0]?.released).toEqual([true])
    // A watch opens a new one.
    l.watch('c', () => {})
    expect(await l.ready()).toBe(true)
    expect(t.conns).toHaveLength(2)
  })

  it('close() destroys the connection, stops probing, and a watch after it is a no-op that opens nothing', async () => {
    const t = tap(pool)
    const armed: string[] = []
    const l = listener(
      t,
      channel(),
      async (id) => {
        armed.push(id)
        return true
      },
      60,
    )
    l.watch('a', () => {})
    expect(await l.ready()).toBe(true)
    await until(() => t.probes(0) >= 1, 'a probe')
    await l.close()
    expect(l.listening).toBe(false)
    expect(t.conns[0]?.released).toEqual([true])
    const probes = t.probes(0)
    const stop = l.watch('b', () => {})
    stop()
    expect(l.watches('b')).toBe(false)
    expect(armed).toEqual(['a'])
    expect(await l.ready()).toBe(false)
    await pause(200)
    expect(t.conns).toHaveLength(1)
    expect(t.probes(0)).toBe(probes)
  })

  it('close() while the LISTEN is in flight destroys that connection once it answers and never listens', async () => {
    const t = tap(pool)
    const listen = deferred<PgQueryResult>()
    t.holdWith((config) => (config.text.startsWith('LISTEN') ? listen.promise : undefined))
    const l = listener(t, channel())
    l.watch('a', () => {})
    await until(() => (t.conns[0]?.sent.length ?? 0) === 1, 'the LISTEN sent')
    await l.close()
    listen.resolve({ rows: [], rowCount: null })
    await until(() => t.conns[0]?.released.length === 1, 'the release')
    expect(t.conns[0]?.released).toEqual([true])
    expect(l.listening).toBe(false)
  })

  it('a failed LISTEN destroys that client and retries on a new one', async () => {
    const t = tap(pool)
    let fails = 1
    t.holdWith((config) => (config.text.startsWith('LISTEN') && fails-- > 0 ? Promise.reject(new Error('LISTEN failed')) : undefined))
    const l = listener(t, channel())
    const c = counter()
    l.watch('a', c.fn('a'))
    await until(() => l.listening, 'the second connection')
    expect(t.conns).toHaveLength(2)
    expect(t.conns[0]?.released).toEqual([true])
    expect(t.conns[1]?.released).toEqual([])
    expect(c.of('a')).toBe(1)
  })

  it('after the connection ends, wakes every watcher, reconnects and wakes them again; a notice still arrives', async () => {
    const t = tap(pool)
    const on = channel()
    const { l, c } = await watched(t, on, ['a', 'b'])
    // A clean end (no error event): only the 'end' listener sees it.
    await t.conns[0]?.raw.end()
    await until(() => t.conns.length === 2 && l.listening, 'the reconnect')
    expect(c.of('a')).toBe(2)
    expect(c.of('b')).toBe(2)
    expect(t.conns[0]?.released).toEqual([true])
    await notify(on, 'a')
    await until(() => c.of('a') === 3, 'a notice on the new connection')
  })

  it('after the server kills the connection, reconnects; stale events of the old client then change nothing', async () => {
    const t = tap(pool)
    const on = channel()
    const { l, c } = await watched(t, on, ['a'])
    const gate = deferred<void>()
    t.gateWith(gate.promise)
    const pid = pidOf(t.conns[0])
    await admin.query('SELECT pg_terminate_backend($1)', [pid])
    await until(() => c.of('a') === 1 && !l.listening, 'the loss')
    // While it reconnects: the old client's late error and notice (its listeners gone but the error one) are ignored.
    t.fire(0, 'error', new Error('late'))
    t.fire(0, 'notification', { channel: on, payload: 'a' })
    t.fire(0, 'end')
    expect(c.of('a')).toBe(1)
    gate.resolve()
    t.gateWith(undefined)
    await until(() => l.listening && c.of('a') === 2, 'the reconnect')
    // And once the new one listens, too: the old client's late error or end is not the new one's loss.
    t.fire(0, 'error', new Error('late'))
    t.fire(0, 'end')
    t.fire(0, 'notification', { channel: on, payload: 'a' })
    expect(c.of('a')).toBe(2)
    expect(l.listening).toBe(true)
    expect(t.conns).toHaveLength(2)
    await notify(on, 'a')
    await until(() => c.of('a') === 3, 'a notice on the new connection')
  })

  it('does not reconnect a lost connection nobody watches', async () => {
    const t = tap(pool)
    const l = listener(t, channel())
    const stop = l.watch('a', () => {})
    expect(await l.ready()).toBe(true)
    stop()
    const pid = pidOf(t.conns[0])
    await admin.query('SELECT pg_terminate_backend($1)', [pid])
    await until(() => !l.listening, 'the loss')
    await pause(400)
    expect(t.conns).toHaveLength(1)
    expect(l.listening).toBe(false)
  })

  it('probes with SELECT 1 bounded by queryTimeout, every queryTimeout, while anyone watches, and not while nobody does', async () => {
    const t = tap(pool)
    const l = listener(t, channel(), inProgress, 40)
    const stop = l.watch('a', () => {})
    expect(await l.ready()).toBe(true)
    await until(() => t.probes(0) >= 3, 'three probes')
    expect(t.conns[0]?.sent.filter((q) => q.text === 'SELECT 1').every((q) => q.query_timeout === 40)).toBe(true)
    expect(t.conns).toHaveLength(1)
    stop()
    await pause(60)
    const probes = t.probes(0)
    await pause(250)
    expect(t.probes(0)).toBe(probes)
    expect(l.listening).toBe(true)
    l.watch('b', () => {})
    await until(() => t.probes(0) >= probes + 2, 'probes again')
  })

  it('counts a failed probe as a lost connection: destroys it, wakes the watchers and reconnects', async () => {
    const t = tap(pool)
    let fail = true
    t.holdWith((config, index) =>
      config.text === 'SELECT 1' && index === 0 && fail ? Promise.reject(new Error('probe timed out')) : undefined,
    )
    const { l, c } = await watched(t, channel(), ['a'], inProgress, 40)
    await until(() => t.conns.length === 2 && l.listening, 'the reconnect')
    fail = false
    expect(t.conns[0]?.released).toEqual([true])
    expect(c.of('a')).toBe(2)
    await until(() => t.probes(1) >= 2, 'probes of the new connection')
  })

  it("a probe answering on a connection already replaced leaves the new connection's probes and connection alone", async () => {
    for (const outcome of ['resolve', 'reject'] as const) {
      const t = tap(pool)
      const held = deferred<PgQueryResult>()
      t.holdWith((config, index) => (config.text === 'SELECT 1' && index === 0 ? held.promise : undefined))
      const l = listener(t, channel(), inProgress, 40, 20)
      const stop = l.watch('a', () => {})
      expect(await l.ready()).toBe(true)
      await until(() => t.probes(0) === 1, 'the held probe')
      stop()
      await until(() => !l.listening, 'the idle stop')
      l.watch('a', () => {})
      expect(await l.ready()).toBe(true)
      if (outcome === 'resolve') held.resolve({ rows: [], rowCount: 1 })
      else held.reject(new Error('late probe failure'))
      const before = t.probes(1)
      await until(() => t.probes(1) >= before + 3, `probes of the new connection after a late ${outcome}`)
      expect(l.listening).toBe(true)
      expect(t.conns).toHaveLength(2)
      expect(t.conns[1]?.released).toEqual([])
      await l.close()
    }
  })

  it('with a client that is not a node-postgres client (no on), gives it back undestroyed and stops listening for good', async () => {
    const t = tap(pool, { noOn: true })
    const armed: string[] = []
    const l = listener(t, channel(), async (id) => {
      armed.push(id)
      return true
    })
    l.watch('a', () => {})
    expect(await l.ready()).toBe(false)
    expect(t.conns[0]?.released).toEqual([undefined])
    expect(t.conns[0]?.sent).toEqual([])
    l.watch('b', () => {})
    expect(armed).toEqual(['a'])
    await pause(300)
    expect(t.conns).toHaveLength(1)
  })

  it('with a client that has on but no removeListener, still destroys it on the idle stop', async () => {
    const t = tap(pool, { noRemove: true })
    const l = listener(t, channel(), inProgress, 10_000, 20)
    const stop = l.watch('a', () => {})
    expect(await l.ready()).toBe(true)
    stop()
    await until(() => !l.listening && t.conns[0]?.released.length === 1, 'the idle stop')
    expect(t.conns[0]?.released).toEqual([true])
  })
})

describe('Listener retries on fake timers (no server needed)', () => {
  afterEach(() => {
    vi.useRealTimers()
  })

  /** A pool whose connect fails (or never answers), counting attempts. */
  function unreachable(hang = false) {
    let connects = 0
    const pool: PgPoolLike = {
      query: (() => Promise.reject(new Error('offline'))) as PgPoolLike['query'],
      connect: () => {
        connects++
        return hang ? new Promise<never>(() => {}) : Promise.reject(new Error('connection refused'))
      },
    }
    return { pool, connects: () => connects }
  }

  it('retries a failed connect after 100 ms, doubling up to 5 s', async () => {
    vi.useFakeTimers()
    const u = unreachable()
    const l = new Listener(async () => u.pool, 'ch', inProgress, 1_000)
    l.watch('a', () => {})
    await vi.advanceTimersByTimeAsync(0)
    expect(u.connects()).toBe(1)
    let expected = 1
    for (const delay of [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000]) {
      await vi.advanceTimersByTimeAsync(delay - 1)
      expect(u.connects()).toBe(expected)
      await vi.advanceTimersByTimeAsync(1)
      expect(u.connects()).toBe(++expected)
    }
    await l.close()
    await vi.advanceTimersByTimeAsync(20_000)
    expect(u.connects()).toBe(expected)
  })

  it('does not retry a failed connect nobody watches (ready() alone)', async () => {
    vi.useFakeTimers()
    const u = unreachable()
    const l = new Listener(async () => u.pool, 'ch', inProgress, 1_000)
    const ready = l.ready()
    await vi.advanceTimersByTimeAsync(100)
    expect(await ready).toBe(false)
    await vi.advanceTimersByTimeAsync(20_000)
    expect(u.connects()).toBe(1)
    await l.close()
  })

  it('ready() gives up on a connect that never answers after 5 s (500 polls of 10 ms)', async () => {
    vi.useFakeTimers()
    const u = unreachable(true)
    const l = new Listener(async () => u.pool, 'ch', inProgress, 1_000)
    let answer: boolean | undefined
    void l.ready().then((value) => {
      answer = value
    })
    await vi.advanceTimersByTimeAsync(4_999)
    expect(answer).toBeUndefined()
    await vi.advanceTimersByTimeAsync(1)
    expect(answer).toBe(false)
    expect(u.connects()).toBe(1)
    await l.close()
  })
})
