/**
 * CPU per new-key cycle below the HTTP layer, in one process: `node bench/peers/store-cpu.mjs [--cycles n]
 * [--rounds n] [--only text]`. Sixteen callers each loop over new keys; every row is the process's user + system CPU
 * (`process.cpuUsage()`) over the cycles it ran: two plain SETs through ioredis and through node-redis
 * (what @node-idempotency does with a new key), RedisStore's acquire + complete (with its group commit, the
 * default, and without), the same on MemoryStore, and `Ledger.run` over each store. Beside each row, the
 * Redis server's CPU per cycle (`INFO cpu`: on a shared machine Redis's time is CPU the app does not get).
 * The rows alternate within each round, so they share the machine's drift. Needs `npm run build` and Redis
 * (`REDIS_URL`); deletes the keys it wrote.
 */
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { DAY, FINGERPRINT, outcome, response } from './store-fixture.mjs'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const require = createRequire(join(ROOT, 'package.json'))
const { Redis } = require('ioredis')
const { createClient } = require('redis')
const { Ledger } = await import(join(ROOT, 'dist', 'index.js'))
const { RedisStore } = await import(join(ROOT, 'dist', 'backends', 'redis', 'index.js'))
const { MemoryStore } = await import(join(ROOT, 'dist', 'backends', 'memory', 'index.js'))

const args = process.argv.slice(2)
const option = (name, fallback) => (args.includes(name) ? Number(args[args.indexOf(name) + 1]) : fallback)
const cycles = option('--cycles', 20_000)
const rounds = option('--rounds', 3)
const CALLERS = 16
const URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379'
const PREFIX = `store-cpu-${process.pid}`

const CHARGE = { id: 'ch_2616841a-800a-44aa-9219-20fd9f269c3b', amount: 1299 }

/** The Redis server's CPU seconds so far (user + system), from INFO cpu. */
async function redisCpuSeconds() {
  const info = await io.info('cpu')
  const field = (name) => Number(info.match(new RegExp(`${name}:([0-9.]+)`))?.[1])
  return field('used_cpu_user') + field('used_cpu_sys')
}

async function measure(cycle) {
  let next = 0
  const caller = async () => {
    while (next < cycles) await cycle(next++)
  }
  const server = await redisCpuSeconds()
  const cpu = process.cpuUsage()
  await Promise.all(Array.from({ length: CALLERS }, caller))
  const used = process.cpuUsage(cpu)
  return { app: (used.user + used.system) / cycles, redis: (((await redisCpuSeconds()) - server) * 1e6) / cycles }
}

const io = new Redis(URL, { enableAutoPipelining: true })
const nodeRedis = await createClient({ url: URL }).connect()
const redisStore = new RedisStore({ url: URL, prefix: PREFIX })
const redisAlone = new RedisStore({ url: URL, prefix: PREFIX, groupCommit: false })
const memoryStore = new MemoryStore()
const onRedis = new Ledger({ store: redisStore })
const onMemory = new Ledger({ store: memoryStore })
const stored = JSON.stringify(response.headers) + new TextDecoder().decode(response.body)

const allRows = {
  'ioredis, 2 SET': (k) => io.set(k, FINGERPRINT, 'PX', DAY, 'NX').then(() => io.set(k, stored, 'PX', DAY)),
  'node-redis, 2 SET': (k) => nodeRedis.set(k, FINGERPRINT, { PX: DAY, NX: true }).then(() => nodeRedis.set(k, stored, { PX: DAY })),
  'RedisStore acquire + complete': async (k) => {
    const acquired = await redisStore.acquire('s', k, FINGERPRINT, 30_000)
    await redisStore.complete('s', k, acquired.token, outcome, DAY)
  },
  'RedisStore acquire + complete, groupCommit: false': async (k) => {
    const acquired = await redisAlone.acquire('s', k, FINGERPRINT, 30_000)
    await redisAlone.complete('s', k, acquired.token, outcome, DAY)
  },
  'MemoryStore acquire + complete': async (k) => {
    const acquired = await memoryStore.acquire('s', k, FINGERPRINT, 30_000)
    await memoryStore.complete('s', k, acquired.token, outcome, DAY)
  },
  // run's handler returns a JSON value, which the ledger stores as its JSON text (the HTTP engine stores a response).
  'Ledger.run, RedisStore': (k) => onRedis.run({ scope: 's', key: k, fingerprint: FINGERPRINT }, async () => CHARGE),
  'Ledger.run, MemoryStore': (k) => onMemory.run({ scope: 's', key: k, fingerprint: FINGERPRINT }, async () => CHARGE),
}
// `--only <text>`: the rows whose name holds it (e.g. to profile one with node --cpu-prof).
const only = args.includes('--only') ? args[args.indexOf('--only') + 1] : ''
const rows = Object.fromEntries(Object.entries(allRows).filter(([name]) => name.includes(only)))
const results = Object.fromEntries(Object.keys(rows).map((name) => [name, []]))
for (let round = -1; round < rounds; round++) {
  for (const [name, cycle] of Object.entries(rows)) {
    const micros = await measure((i) => cycle(`${PREFIX}:${round}:${name.length}:${i}`))
    if (round >= 0) results[name].push(micros) // round -1 warms every path up
  }
}
console.log(`CPU per new-key cycle, ${CALLERS} callers, ${cycles} cycles a row, ${rounds} rounds (µs, this process / the Redis server):`)
for (const [name, micros] of Object.entries(results)) {
  console.log(`${name.padEnd(50)} ${micros.map((m) => `${m.app.toFixed(1)} / ${m.redis.toFixed(1)}`).join('   ')}`)
}

let cursor = '0'
do {
  const [next, keys] = await io.scan(cursor, 'MATCH', `*${PREFIX}*`, 'COUNT', 1000)
  if (keys.length > 0) await io.unlink(...keys)
  cursor = next
} while (cursor !== '0')
await redisStore.close()
await redisAlone.close()
io.disconnect()
await nodeRedis.quit()
