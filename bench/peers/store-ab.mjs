/**
 * Two builds of the Redis store and the ledger, side by side in one process: `node bench/peers/store-ab.mjs
 * <other dist/> [--cycles n] [--rounds n]`. Compares `dist/` (this checkout's build) with another build
 * of idemkey: for example `git stash && npm run build && cp -r dist .dist-old && git stash pop && npm run
 * build`, then `node bench/peers/store-ab.mjs .dist-old` (a folder inside the checkout, so the other build
 * finds ioredis). Each row is the process's CPU per new-key cycle (`process.cpuUsage()`, sixteen callers):
 * RedisStore acquire + complete, and `Ledger.run` on it. The builds alternate within each round and
 * swap places every round, so both share the machine's drift; a difference smaller than the rounds'
 * spread is noise. Needs Redis (`REDIS_URL`); deletes the keys it wrote.
 */
import { dirname, isAbsolute, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { unlinkMatching } from './redis-cleanup.mjs'
import { DAY, FINGERPRINT, outcome } from './store-fixture.mjs'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const args = process.argv.slice(2)
const option = (name, fallback) => (args.includes(name) ? Number(args[args.indexOf(name) + 1]) : fallback)
const other = args[0]
if (!other || other.startsWith('--')) {
  console.error('usage: node bench/peers/store-ab.mjs <other dist/> [--cycles n] [--rounds n]')
  process.exit(2)
}
const cycles = option('--cycles', 15_000)
const rounds = option('--rounds', 8)
const URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379'
const PREFIX = `store-ab-${process.pid}`

const SCOPE = `cred:${'b'.repeat(43)}`
// Keys as a header parser hands them over: flat strings, not ones built by concatenation.
const flat = (text) => JSON.parse(JSON.stringify(text))

const rigs = {}
for (const [name, dir] of [
  ['other', isAbsolute(other) ? other : join(process.cwd(), other)],
  ['this', join(ROOT, 'dist')],
]) {
  const { Ledger } = await import(join(dir, 'index.js'))
  const { RedisStore } = await import(join(dir, 'backends', 'redis', 'index.js'))
  const store = new RedisStore({ url: URL, prefix: `${PREFIX}-${name}` })
  rigs[name] = { store, ledger: new Ledger({ store }) }
}

async function measure(cycle) {
  let next = 0
  const caller = async () => {
    while (next < cycles) await cycle(next++)
  }
  const cpu = process.cpuUsage()
  await Promise.all(Array.from({ length: 16 }, caller))
  const used = process.cpuUsage(cpu)
  return (used.user + used.system) / cycles
}

const rows = {}
for (let round = 0; round < rounds; round++) {
  const order = round % 2 ? ['this', 'other'] : ['other', 'this']
  for (const kind of ['RedisStore acquire + complete', 'Ledger.run, RedisStore']) {
    for (const name of order) {
      const { store, ledger } = rigs[name]
      const prefix = `k-${round}-${kind.length}-${Date.now()}-`
      const micros = await measure(
        kind.startsWith('Ledger')
          ? (i) => ledger.run({ scope: SCOPE, key: flat(prefix + i), fingerprint: FINGERPRINT }, async () => 1)
          : async (i) => {
              const key = flat(prefix + i)
              const acquired = await store.acquire(SCOPE, key, FINGERPRINT, 30_000)
              await store.complete(SCOPE, key, acquired.token, outcome, DAY)
            },
      )
      const row = `${kind}, ${name}`
      rows[row] = [...(rows[row] ?? []), micros]
    }
  }
}
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]
console.log(`CPU per new-key cycle (µs), ${rounds} rounds of ${cycles} cycles; this = ${join(ROOT, 'dist')}, other = ${other}:`)
for (const [row, values] of Object.entries(rows)) {
  console.log(`${row.padEnd(40)} median ${median(values).toFixed(1).padStart(6)}   ${values.map((v) => v.toFixed(1)).join(' ')}`)
}
// The rounds' drift moves both builds together: the ratio within each round is the comparison.
for (const kind of ['RedisStore acquire + complete', 'Ledger.run, RedisStore']) {
  const ratios = rows[`${kind}, this`].map((value, round) => value / rows[`${kind}, other`][round])
  const lower = ratios.filter((ratio) => ratio < 1).length
  console.log(
    `${kind}: this / other, median of the rounds' ratios ${median(ratios).toFixed(3)}; this lower in ${lower} of ${rounds} rounds`,
  )
}
for (const { ledger } of Object.values(rigs)) await ledger.close()
await unlinkMatching([`${PREFIX}-*`])
