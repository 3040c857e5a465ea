/**
 * One adapter's app in its own process: `node --import tsx bench/peers/server.ts <adapter>`.
 * Prints `{"port":N}` on stdout once listening. `GET /__stats` (outside the adapter's app) answers how
 * many times the charge ran, so the runner can check that replays never ran it.
 * Environment: REDIS_URL, POSTGRES_URL, PEERS_SQLITE_DIR (set by the runner).
 */
import { createServer } from 'node:http'
import { ADAPTERS, makeCharge } from './adapters.js'

const name = process.argv[2]
const adapter = ADAPTERS.find((a) => a.name === name)
if (!adapter) {
  console.error(`unknown adapter "${name}"; known: ${ADAPTERS.map((a) => a.name).join(', ')}`)
  process.exit(2)
}

const { charge, executions } = makeCharge()
const built = await adapter.build({
  charge,
  redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
  postgresUrl: process.env.POSTGRES_URL ?? 'postgres://root@127.0.0.1:5432/test',
  sqliteDir: process.env.PEERS_SQLITE_DIR ?? '.',
})

const server = createServer((req, res) => {
  if (req.url === '/__stats') {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ executions: executions() }))
    return
  }
  built.app(req, res)
})
server.keepAliveTimeout = 60_000
server.listen(0, '127.0.0.1', () => {
  const address = server.address() as { port: number }
  process.stdout.write(`${JSON.stringify({ port: address.port })}\n`)
})

const shutdown = async () => {
  server.closeAllConnections()
  server.close()
  try {
    await built.close()
  } finally {
    process.exit(0)
  }
}
process.on('SIGTERM', () => void shutdown())
process.on('SIGINT', () => void shutdown())
