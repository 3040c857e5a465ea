/**
 * Ending a SQL driver's pool within a deadline, for the pools the PostgreSQL and MySQL stores open
 * themselves. Not part of the public API.
 *
 * Both drivers end a connection politely (a goodbye message, then a FIN) and leave its socket for the
 * server to close. The far side of a half-open connection (a NAT or firewall that forgot it, a vanished
 * host) never answers: the socket stays open, keeping the process alive, and a statement waiting on it
 * never settles, nor does node-postgres's `end()`, which waits for every client to come back.
 */

/** A connection's socket, as far as closing it goes (a `net.Socket`). */
export interface PoolSocket {
  readonly destroyed?: boolean
  destroy?(error?: Error): void
  once?(event: 'close', listener: () => void): unknown
}

/**
 * Waits for `ended` (the driver's own end) and for each of `sockets` to close, up to `timeoutMs`; then
 * destroys, with `error()`, every socket still open, which fails what waits on it, and gives the
 * driver's end as long again to settle (failed by those sockets: a failure that is ours, not news).
 * A failure of `ended` before the deadline is the caller's. `timeoutMs` 0: `ended` alone, unbounded.
 */
export async function endWithin(
  ended: Promise<void>,
  sockets: readonly PoolSocket[],
  timeoutMs: number,
  error: () => Error,
): Promise<void> {
  if (timeoutMs === 0) return ended
  if (await within(Promise.all([ended, ...sockets.map(closing)]), timeoutMs)) return
  for (const socket of sockets) if (!socket.destroyed) socket.destroy?.(error())
  await within(
    ended.catch(() => {}),
    timeoutMs,
  )
}

/**
 * Whether `work` settled within `ms` (its failure is thrown). The timer is cleared either way: a close
 * must not keep the process alive for the rest of its deadline.
 */
async function within(work: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms)
  })
  try {
    return await Promise.race([work.then(() => true), late])
  } finally {
    clearTimeout(timer)
  }
}

/** Settles when the socket has closed: at once for one closed already, or one that cannot say. */
function closing(socket: PoolSocket): Promise<void> {
  if (socket.once === undefined || socket.destroyed) return Promise.resolve()
  return new Promise((resolve) => {
    socket.once?.('close', () => resolve())
  })
}
