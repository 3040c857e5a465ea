import type { Server } from 'node:net'
import { CliError } from './run.js'

/** The flags that chose where a server listens, as the user typed them (`--port`, `--host`). */
export interface ListenFlags {
  port: string
  host: string
}

/**
 * Listens on `host`:`port`, or fails with a {@link CliError} that names the flag at fault and what to
 * do: a port something else holds, a port the process may not take, a host that is not this machine's.
 *
 * @example await listen(server, flags.adminPort, flags.adminHost, { port: '--admin-port', host: '--admin-host' })
 */
export function listen(server: Server, port: number, host: string, flags: ListenFlags): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const onError = (error: NodeJS.ErrnoException) => reject(new CliError(cannotListen(error, port, host, flags)))
    server.once('error', onError)
    server.listen(port, host, () => {
      server.removeListener('error', onError)
      resolve()
    })
  })
}

function cannotListen(error: NodeJS.ErrnoException, port: number, host: string, flags: ListenFlags): string {
  switch (error.code) {
    case 'EADDRINUSE':
      return `${flags.port} ${port}: something else already listens on ${host}:${port}. Pick another port (0 takes any free one), or stop what holds it.`
    case 'EACCES':
      return `${flags.port} ${port}: this process may not listen on ${host}:${port} (ports below 1024 need privileges). Pick a port from 1024 up.`
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return `${flags.host} ${host}: no such host name. Give an address of this machine (127.0.0.1, 0.0.0.0 for every interface, ::) or a name that resolves to one.`
    case 'EADDRNOTAVAIL':
      return `${flags.host} ${host}: not an address of this machine. Give one of its own addresses (127.0.0.1, 0.0.0.0 for every interface, ::).`
    default:
      return `cannot listen on ${host}:${port} (${flags.host}, ${flags.port}): ${error.code ?? error.message}.`
  }
}
