/**
 * What one client, or many, may hold of the proxy: a byte budget across covered requests, a cap on
 * connections that closes the longest-idle one first, early answers that close cleanly, backpressure
 * with a stall limit, and a log that an attack cannot flood.
 */
import { readFileSync } from 'node:fs'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { HttpResponseLike } from '../../http/types.js'
import { send } from './http.js'

/** How long a connection closed after an early answer keeps reading (and dropping) what the client still sends. */
const LINGER_MS = 2_000

/**
 * Bytes held at once across all in-flight covered requests: their bodies while read and forwarded,
 * and the upstream responses held to be stored. Each request takes its share through a ticket, given
 * back whole when the request is over, so the count cannot leak.
 */
export class ByteBudget {
  used = 0
  constructor(readonly limit: number) {}
  ticket(): BudgetTicket {
    return new BudgetTicket(this)
  }
}

export class BudgetTicket {
  private held = 0
  private released = false
  constructor(private readonly budget: ByteBudget) {}
  /** Takes `bytes` when the budget has room for them; otherwise takes nothing and says no. */
  tryTake(bytes: number): boolean {
    if (this.budget.used + bytes > this.budget.limit) return false
    this.hold(bytes)
    return true
  }
  /** Counts bytes already in memory that must be kept (a response that already ran); false once over the budget. */
  hold(bytes: number): boolean {
    if (!this.released) {
      this.held += bytes
      this.budget.used += bytes
    }
    return this.budget.used <= this.budget.limit
  }
  /** Gives everything back; later takes count nothing. */
  release(): void {
    this.budget.used -= this.held
    this.held = 0
    this.released = true
  }
}

/** The default `maxConnections`: 1024, or less when the open-file limit leaves less room beside upstream and store connections. */
export function defaultMaxConnections(): number {
  try {
    const soft = /^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1]
    if (soft !== undefined) return Math.max(64, Math.min(1024, Number(soft) - 320))
  } catch {
    // Not Linux: no /proc.
  }
  return 1024
}

/**
 * Caps open client connections at `max`. Past it, the connection idle the longest (between keep-alive
 * requests, or still sending its headers) is closed to make room, so idle sockets cannot starve new
 * clients; only when every connection has a request in progress is the new one closed instead.
 */
export function capConnections(server: Server, max: number, log: (kind: string, line: string) => void) {
  /** Requests in progress per open connection. */
  const open = new Map<Socket, number>()
  /** Connections without a request in progress, idle the longest first. */
  const idle = new Set<Socket>()
  const forget = (socket: Socket) => {
    open.delete(socket)
    idle.delete(socket)
  }
  server.on('connection', (socket: Socket) => {
    if (open.size >= max) {
      const oldest = idle.values().next().value
      if (oldest === undefined) {
        log('connections', `--max-connections ${max} reached and every connection is busy: closing new ones`)
        return void socket.destroy()
      }
      log('connections', `--max-connections ${max} reached: closing the longest-idle connections to make room`)
      forget(oldest)
      oldest.destroy()
    }
    open.set(socket, 0)
    idle.add(socket)
    socket.once('close', () => forget(socket))
  })
  return {
    /** Takes a connection out of the count (a WebSocket tunnel, which has a limit of its own). */
    forget,
    busy(socket: Socket): void {
      const requests = open.get(socket)
      if (requests === undefined) return
      open.set(socket, requests + 1)
      idle.delete(socket)
    },
    free(socket: Socket): void {
      const requests = open.get(socket)
      if (requests === undefined) return
      open.set(socket, Math.max(0, requests - 1))
      if (requests <= 1) idle.add(socket)
    },
  }
}

export const lingering = new WeakSet<Socket>()

/**
 * Answers a request whose body was not read to its end (refused, timed out, too large) and closes the
 * connection, whose unread rest would otherwise be read as the next request. Closing a socket with
 * unread bytes resets it, and the client may lose the answer: so the rest is read and dropped, the
 * answer is followed by a FIN, and the socket is destroyed when the client closes, or after LINGER_MS.
 */
export function sendAndClose(req: IncomingMessage, res: ServerResponse, response: HttpResponseLike): void {
  const socket = req.socket as Socket & { destroySoon?: () => void }
  if (res.headersSent || res.destroyed || !socket || socket.destroyed) return
  lingering.add(socket)
  // Node ends a `Connection: close` answer with destroySoon(), which would reset: end it instead.
  socket.destroySoon = () => socket.end()
  setTimeout(() => socket.destroy(), LINGER_MS).unref()
  req.resume()
  send(res, { ...response, headers: { ...response.headers, connection: 'close' } })
}

/** Resolves `true` once `res` takes writes again; `false` (its connection closed) when the client left or stalled past `stallMs`. */
export function drained(res: ServerResponse, stallMs: number): Promise<boolean> {
  if (res.destroyed) return Promise.resolve(false)
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      clearTimeout(timer)
      res.off('drain', onDrain)
      res.off('close', onClose)
      if (!ok) res.destroy()
      resolve(ok)
    }
    const onDrain = () => done(true)
    const onClose = () => done(false)
    const timer = setTimeout(onClose, stallMs)
    res.once('drain', onDrain)
    res.once('close', onClose)
  })
}

/**
 * A log of one line per event, at most one a second per kind (an outage or an attack would otherwise
 * flood it); the next line of a kind says how many were left out.
 */
export function throttledLog(sink: (line: string) => void, intervalMs = 1_000): (kind: string, line: string) => void {
  const last = new Map<string, { at: number; skipped: number }>()
  return (kind, line) => {
    const now = Date.now()
    const entry = last.get(kind)
    if (entry && now - entry.at < intervalMs) {
      entry.skipped++
      return
    }
    last.set(kind, { at: now, skipped: 0 })
    sink(entry?.skipped ? `${line} (and ${entry.skipped} more like it since the last)` : line)
  }
}
