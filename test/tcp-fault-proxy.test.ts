/**
 * The TCP fault proxy of the fault suite (test/helpers/tcp-fault-proxy.ts), against a tiny echo
 * server: each fault must do what the suite relies on, or a green fault run would prove nothing.
 */
import { once } from 'node:events'
import { createServer, type Server, type Socket, connect as tcpConnect } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { TcpFaultProxy } from './helpers/tcp-fault-proxy.js'

let echo: Server
let echoPort = 0
let proxy: TcpFaultProxy | undefined
const sockets: Socket[] = []

beforeAll(async () => {
  echo = createServer((socket) => {
    socket.on('error', () => {})
    socket.pipe(socket)
  })
  echo.listen(0, '127.0.0.1')
  await once(echo, 'listening')
  echoPort = (echo.address() as { port: number }).port
})

afterAll(async () => {
  await new Promise<void>((resolve) => echo.close(() => resolve()))
})

afterEach(async () => {
  for (const socket of sockets.splice(0)) socket.destroy()
  await proxy?.close()
  proxy = undefined
})

async function start(): Promise<TcpFaultProxy> {
  proxy = await TcpFaultProxy.start({ host: '127.0.0.1', port: echoPort })
  return proxy
}

/** A client connected through the proxy, with everything it has received so far. */
async function client(through: TcpFaultProxy): Promise<{ socket: Socket; received: () => string; closed: Promise<unknown> }> {
  const socket = tcpConnect({ host: through.host, port: through.port })
  sockets.push(socket)
  socket.on('error', () => {})
  let text = ''
  socket.on('data', (chunk: Buffer) => {
    text += chunk.toString()
  })
  const closed = once(socket, 'close')
  await once(socket, 'connect')
  return { socket, received: () => text, closed }
}

/** Waits until `predicate` holds, for at most `ms`; returns whether it did. */
async function until(predicate: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms
  while (!predicate()) {
    if (Date.now() > deadline) return false
    await sleep(5)
  }
  return true
}

describe('TcpFaultProxy', () => {
  it('forwards both ways and counts the connection', async () => {
    const p = await start()
    const c = await client(p)
    c.socket.write('hello')
    expect(await until(() => c.received() === 'hello', 2_000)).toBe(true)
    expect(p.counts()).toMatchObject({ open: 1, accepted: 1, cut: 0, stalled: 0 })
  })

  it('delay adds latency each way and keeps the order of chunks', async () => {
    const p = await start()
    const c = await client(p)
    // 500 ms each way, so the quick check below has a second of margin on a loaded machine.
    p.delay(500)
    const sentAt = Date.now()
    for (let i = 0; i < 20; i++) {
      c.socket.write(`${String(i).padStart(2, '0')},`)
      await sleep(2)
    }
    const expected = Array.from({ length: 20 }, (_, i) => `${String(i).padStart(2, '0')},`).join('')
    expect(await until(() => c.received().length >= expected.length, 5_000)).toBe(true)
    // 500 ms out and 500 ms back: the first byte cannot be back before 1 s.
    expect(Date.now() - sentAt).toBeGreaterThanOrEqual(1_000)
    expect(c.received()).toBe(expected)
    p.delay(0)
    const quickAt = Date.now()
    c.socket.write('!')
    expect(await until(() => c.received().endsWith('!'), 2_000)).toBe(true)
    expect(Date.now() - quickAt).toBeLessThan(1_000)
  })

  it('cut ends every open connection, and the next connection works', async () => {
    const p = await start()
    const a = await client(p)
    const b = await client(p)
    expect(p.cut()).toBe(2)
    await Promise.all([a.closed, b.closed])
    expect(a.socket.destroyed && b.socket.destroyed).toBe(true)
    expect(p.counts()).toMatchObject({ open: 0, accepted: 2, cut: 2 })
    const c = await client(p)
    c.socket.write('again')
    expect(await until(() => c.received() === 'again', 2_000)).toBe(true)
  })

  it('blackhole stalls open connections and accepts new ones that never answer; heal delivers what they held', async () => {
    const p = await start()
    const open = await client(p)
    p.blackhole()
    open.socket.write('held')
    const fresh = await client(p)
    fresh.socket.write('never?')
    expect(await until(() => open.received() !== '' || fresh.received() !== '', 300)).toBe(false)
    expect(open.socket.destroyed || fresh.socket.destroyed).toBe(false)
    await p.held()
    expect(p.counts()).toMatchObject({ open: 2, stalled: 2, held: 'held'.length + 'never?'.length })
    p.heal()
    expect(await until(() => open.received() === 'held' && fresh.received() === 'never?', 2_000)).toBe(true)
    expect(p.counts()).toMatchObject({ stalled: 0, held: 0 })
  })

  it('held() waits for bytes the blackhole holds, and fails plainly when the app sends nothing', async () => {
    const p = await start()
    const idle = await client(p)
    p.blackhole()
    await expect(p.held(100)).rejects.toThrow('Timed out after 100 ms waiting for: the app to send something through the blackhole')
    setTimeout(() => idle.socket.write('late'), 50)
    await p.held()
    expect(p.counts().held).toBe('late'.length)
  })

  it("heal({ stalled: 'hang' }) leaves the stalled connections half-open for ever while new ones work", async () => {
    const p = await start()
    const stuck = await client(p)
    p.blackhole()
    stuck.socket.write('lost')
    p.heal({ stalled: 'hang' })
    stuck.socket.write(' and more')
    const fresh = await client(p)
    fresh.socket.write('works')
    expect(await until(() => fresh.received() === 'works', 2_000)).toBe(true)
    expect(await until(() => stuck.received() !== '', 300)).toBe(false)
    expect(stuck.socket.destroyed).toBe(false)
    expect(p.counts()).toMatchObject({ open: 2, stalled: 1, held: 'lost and more'.length })
    // A cut still ends a hung connection, as a timeout in the app would.
    p.cut()
    await stuck.closed
  })
})
