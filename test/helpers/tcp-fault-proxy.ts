import { createServer, connect as netConnect, type Server, Socket } from 'node:net'
import { eventually } from './eventually.js'

/** Where the proxy forwards to. */
export interface ProxyTarget {
  host: string
  port: number
}

/** How many connections the proxy has seen, for a test to check that a fault bit. */
export interface ProxyCounts {
  /** Connections open now (client side accepted, not yet closed). */
  open: number
  /** Connections accepted since the proxy started. */
  accepted: number
  /** Connections destroyed by {@link TcpFaultProxy.cut}. */
  cut: number
  /** Connections open now that forward nothing: stalled by a blackhole, or left half-open by `heal({ stalled: 'hang' })`. */
  stalled: number
  /**
   * Bytes the app has sent that the proxy holds on a stalled connection, never forwarded: a statement
   * that is on the wire and will have no answer. A test waits for this rather than for a fixed time.
   */
  held: number
}

/** What {@link TcpFaultProxy.heal} does with the connections a blackhole stalled. */
export interface HealOptions {
  /**
   * `'resume'`: they forward again, and what they held is delivered late, in order (a partition that
   * TCP's retransmissions outlived). `'hang'`: they stay open and never forward again, in either
   * direction (the far side lost its state: a half-open connection only a timeout can end); new
   * connections work. @default 'resume'
   */
  stalled?: 'resume' | 'hang'
}

const END = Symbol('end')
type Chunk = Buffer | typeof END

/**
 * One direction of a connection: chunks leave in the order they came, each no earlier than its
 * arrival plus the delay in force when it arrived.
 */
class Pipe {
  readonly #queue: { chunk: Chunk; dueAtMs: number }[] = []
  #lastDueAtMs = 0
  #timer: NodeJS.Timeout | undefined
  /** Set once the destination socket exists (the upstream connects after accept, or never while blackholed). */
  to: Socket | undefined

  constructor(readonly link: Link) {}

  push(chunk: Chunk, delayMs: number): void {
    const dueAtMs = Math.max(Date.now() + delayMs, this.#lastDueAtMs)
    this.#lastDueAtMs = dueAtMs
    this.#queue.push({ chunk, dueAtMs })
    this.pump()
  }

  pump(): void {
    if (this.#timer !== undefined) return
    while (this.#queue.length > 0) {
      if (this.link.stalled || this.to === undefined || this.to.destroyed) return
      const head = this.#queue[0] as { chunk: Chunk; dueAtMs: number }
      const waitMs = head.dueAtMs - Date.now()
      if (waitMs > 0) {
        this.#timer = setTimeout(() => {
          this.#timer = undefined
          this.pump()
        }, waitMs)
        return
      }
      this.#queue.shift()
      if (head.chunk === END) this.to.end()
      else this.to.write(head.chunk)
    }
  }

  /** Bytes queued and not yet written on. */
  queuedBytes(): number {
    let bytes = 0
    for (const { chunk } of this.#queue) if (chunk !== END) bytes += chunk.length
    return bytes
  }

  stop(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer)
    this.#timer = undefined
    this.#queue.length = 0
  }
}

/** One proxied connection: the app's socket, the upstream socket, a pipe each way. */
class Link {
  /** Forwards nothing while set (a blackhole, or for ever once healed with `stalled: 'hang'`). */
  stalled = false
  /** Left half-open for ever: heal never resumes it. */
  dead = false
  readonly up: Pipe
  readonly down: Pipe
  upstream: Socket | undefined

  constructor(
    readonly client: Socket,
    readonly proxy: TcpFaultProxy,
  ) {
    this.up = new Pipe(this)
    this.down = new Pipe(this)
    this.down.to = client
    client.on('data', (chunk: Buffer) => this.up.push(chunk, proxy.delayMs))
    client.on('end', () => this.up.push(END, proxy.delayMs))
    client.on('error', () => this.destroy())
    client.on('close', () => this.destroy())
  }

  connectUpstream(target: ProxyTarget): void {
    if (this.upstream !== undefined || this.client.destroyed) return
    const upstream = netConnect({ host: target.host, port: target.port, allowHalfOpen: true })
    this.upstream = upstream
    upstream.setNoDelay(true)
    upstream.on('connect', () => {
      this.up.to = upstream
      this.up.pump()
    })
    upstream.on('data', (chunk: Buffer) => this.down.push(chunk, this.proxy.delayMs))
    upstream.on('end', () => this.down.push(END, this.proxy.delayMs))
    upstream.on('error', () => this.destroy())
    upstream.on('close', () => this.destroy())
  }

  resume(target: ProxyTarget): void {
    if (this.dead) return
    this.stalled = false
    this.connectUpstream(target)
    this.up.pump()
    this.down.pump()
  }

  destroy(): void {
    this.up.stop()
    this.down.stop()
    this.client.destroy()
    this.upstream?.destroy()
    this.proxy.forget(this)
  }
}

/**
 * A loopback TCP proxy that injects network faults between an app and its server (PostgreSQL,
 * MySQL, Redis), for the fault suite (test/tcp-faults.test.ts). Listens on 127.0.0.1 on a free port
 * and forwards every connection to `target`, until told otherwise at run time:
 *
 * - {@link delay}: latency added to every chunk, both ways, order kept;
 * - {@link cut}: every open connection destroyed now, mid-query;
 * - {@link blackhole}: open connections stop forwarding both ways, and new ones are accepted but
 *   never reach the server (half-open: nothing answers, nothing closes);
 * - {@link heal}: forwarding again (what the blackhole stalled resumes, or hangs for ever).
 *
 * @example
 * const proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: 5432 })
 * const pool = new pg.Pool({ host: '127.0.0.1', port: proxy.port })
 * proxy.blackhole(); await sleep(6_000); proxy.heal()
 * await proxy.close()
 */
export class TcpFaultProxy {
  readonly host = '127.0.0.1'
  /** Latency added to each chunk, in ms (see {@link delay}). */
  delayMs = 0
  readonly #links = new Set<Link>()
  #accepted = 0
  #cut = 0
  #blackholed = false

  private constructor(
    readonly target: ProxyTarget,
    readonly server: Server,
    /** The port the proxy listens on (127.0.0.1). */
    readonly port: number,
  ) {
    server.on('connection', (client) => this.#accept(client))
  }

  /** Starts a proxy to `target` on 127.0.0.1 and a free port. */
  static async start(target: ProxyTarget): Promise<TcpFaultProxy> {
    const server = createServer({ allowHalfOpen: true, pauseOnConnect: false })
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject)
      server.listen(0, '127.0.0.1', () => {
        server.off('error', reject)
        resolve()
      })
    })
    const address = server.address()
    if (address === null || typeof address === 'string') throw new Error('TcpFaultProxy: the server has no TCP address')
    return new TcpFaultProxy(target, server, address.port)
  }

  #accept(client: Socket): void {
    this.#accepted++
    client.setNoDelay(true)
    const link = new Link(client, this)
    this.#links.add(link)
    if (this.#blackholed) link.stalled = true
    else link.connectUpstream(this.target)
  }

  /** Called by a link as it closes. */
  forget(link: Link): void {
    this.#links.delete(link)
  }

  /** Adds `ms` of latency to every chunk from now on, both ways (0 ends it); chunks never overtake each other. */
  delay(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) throw new Error(`TcpFaultProxy.delay needs a duration in ms >= 0, got ${ms}`)
    this.delayMs = ms
  }

  /** Destroys every open connection now (both sockets, what they held is lost); returns how many. */
  cut(): number {
    const links = [...this.#links]
    for (const link of links) link.destroy()
    this.#cut += links.length
    return links.length
  }

  /** Stops forwarding on every open connection, both ways, and accepts new ones that never reach the server. */
  blackhole(): void {
    this.#blackholed = true
    for (const link of this.#links) link.stalled = true
  }

  /** Ends a blackhole: new connections reach the server; the stalled ones resume or hang, as `options` says. */
  heal(options: HealOptions = {}): void {
    this.#blackholed = false
    for (const link of this.#links) {
      if (!link.stalled) continue
      if (options.stalled === 'hang') link.dead = true
      else link.resume(this.target)
    }
  }

  /** Connections open, accepted, cut and stalled. */
  counts(): ProxyCounts {
    let stalled = 0
    let held = 0
    for (const link of this.#links) {
      if (!link.stalled) continue
      stalled++
      held += link.up.queuedBytes()
    }
    return { open: this.#links.size, accepted: this.#accepted, cut: this.#cut, stalled, held }
  }

  /**
   * This process's own sockets connected to the proxy: a store's side of its connections, when the store
   * runs in the test's process. {@link counts} sees the proxy's side, which a FIN from the store does not
   * close (the proxy forwards half-closes), so only this tells whether the store really closed its socket.
   */
  localSockets(): number {
    const handles = (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles()
    return handles.filter((handle) => handle instanceof Socket && handle.remotePort === this.port).length
  }

  /**
   * Resolves once the app has sent something the blackhole holds (a statement on the wire with no answer
   * coming): what a test waits for before it cuts or closes, rather than a fixed time a loaded machine may outrun.
   */
  held(timeoutMs = 5_000): Promise<void> {
    return eventually(() => this.counts().held > 0, 'the app to send something through the blackhole', timeoutMs, 5)
  }

  /** Destroys every connection and stops listening. */
  async close(): Promise<void> {
    for (const link of [...this.#links]) link.destroy()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
  }
}

/**
 * Starts a transaction with `start` and holds it at its first statement until the proxy is blackholed,
 * so that statement waits on a half-open connection. `settled` is what the transaction settles with (its
 * error, or its value; in an object, which an async function does not wait for). `start` gets a body to
 * run inside the transaction, given the statement to send.
 *
 * @example
 * const { settled } = await hangMidTransaction(proxy, (body) => store.transaction((tx) => body(() => tx.query('SELECT 1'))))
 * await store.close()
 * expect(await settled).toMatchObject({ code: 'STORE_UNAVAILABLE' })
 */
export async function hangMidTransaction(
  proxy: TcpFaultProxy,
  start: (body: (statement: () => Promise<unknown>) => Promise<unknown>) => Promise<unknown>,
): Promise<{ settled: Promise<unknown> }> {
  let entered!: () => void
  let go!: () => void
  const inside = new Promise<void>((resolve) => {
    entered = resolve
  })
  const proceed = new Promise<void>((resolve) => {
    go = resolve
  })
  const settled = start(async (statement) => {
    entered()
    await proceed
    return statement()
  }).catch((error: unknown) => error)
  await inside
  proxy.blackhole()
  go()
  await proxy.held() // the statement is on the wire, unanswered
  return { settled }
}
