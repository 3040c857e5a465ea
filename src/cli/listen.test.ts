import { createServer, type Server } from 'node:net'
import { listen } from './listen.js'
import { CliError } from './run.js'

const FLAGS = { port: '--admin-port', host: '--admin-host' }

async function held(): Promise<{ server: Server; port: number }> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { server, port: (server.address() as { port: number }).port }
}

describe('listen: where a command serves, or what to do instead', () => {
  it('listens, and leaves no error listener behind', async () => {
    const server = createServer()
    await listen(server, 0, '127.0.0.1', FLAGS)
    expect(server.listening).toBe(true)
    expect(server.listenerCount('error')).toBe(0)
    server.close()
  })

  it('names the port flag when something else holds the port', async () => {
    const { server: holder, port } = await held()
    try {
      const error = await listen(createServer(), port, '127.0.0.1', FLAGS).catch((e: unknown) => e)
      expect(error).toBeInstanceOf(CliError)
      expect((error as CliError).message).toBe(
        `--admin-port ${port}: something else already listens on 127.0.0.1:${port}. Pick another port (0 takes any free one), or stop what holds it.`,
      )
    } finally {
      holder.close()
    }
  })

  it('names the host flag when the address is not this machine’s', async () => {
    // 192.0.2.1 is TEST-NET-1: never a local address, and binding to it sends nothing anywhere.
    const error = await listen(createServer(), 0, '192.0.2.1', FLAGS).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(CliError)
    expect((error as CliError).message).toBe(
      '--admin-host 192.0.2.1: not an address of this machine. Give one of its own addresses (127.0.0.1, 0.0.0.0 for every interface, ::).',
    )
  })
})
