/**
 * The deterministic simulator's speed beside its floor, in one run: simulated requests per CPU-second of
 * `runScenario` (sim/scenario.ts: the real client, engine, ledger, steps and memory store under the
 * seeded scheduler, its faulty network and its checks), and of the same real code with no simulator at
 * all: the HTTP engine, the ledger and a MemoryStore in one process, answering new keys with the
 * simulator's payment handler (three durable steps, a derived key for the bank), then with a handler
 * that has no steps. No client, no network, no scheduler, no checks: whatever the simulator does, it
 * cannot run a request for less than that.
 * The sides alternate round by round, each measured by `process.cpuUsage()` (every thread of the
 * process, as `npm run sim` counts it).
 * Run alone: npx tsx bench/sim.bench.ts [--requests 100000] [--rounds 3]
 */

import { floorBatch } from '../sim/floor.js'
import { runScenario } from '../sim/scenario.js'
import { fmt, numberArg, report, table } from './lib.js'

const REQUESTS = numberArg('--requests', 100_000)
const ROUNDS = numberArg('--rounds', 3)
const TARGET = 100_000

/** CPU µs per request of `work`, which runs `REQUESTS` requests (or reports how many it ran). */
async function cpuPerRequest(work: () => Promise<number>): Promise<number> {
  const started = process.cpuUsage()
  const requests = await work()
  const used = process.cpuUsage(started)
  return (used.user + used.system) / requests
}

let nextSeed = 1
/** Seeds in order, as `npm run sim` runs them, until the budget of requests. */
async function simulator(): Promise<number> {
  let requests = 0
  while (requests < REQUESTS) {
    const result = await runScenario({ seed: nextSeed++ })
    if (result.violations.length > 0) throw new Error(`sim seed ${result.seed} failed: ${result.violations[0]}`)
    requests += result.requests
  }
  return requests
}

/** The floor (sim/floor.ts): the engine, ledger and MemoryStore alone, with or without the handler's three steps. */
function floor(steps: 0 | 3): () => Promise<number> {
  return async () => {
    for (let done = 0; done < REQUESTS; done += 1_000) await floorBatch(Math.min(1_000, REQUESTS - done), steps)
    return REQUESTS
  }
}

const sides: Array<[name: string, work: () => Promise<number>]> = [
  ['simulator (`npm run sim`, one thread)', simulator],
  ['floor: engine + ledger + MemoryStore, three steps, no simulator', floor(3)],
  ['floor: engine + ledger + MemoryStore, no steps, no simulator', floor(0)],
]
const results = new Map<string, number[]>(sides.map(([name]) => [name, []]))
await simulator() // warm-up: the JIT compiles the code all sides share
for (let round = 0; round < ROUNDS; round++) {
  const order = sides.map((_, i) => sides[(i + round) % sides.length] as [string, () => Promise<number>])
  for (const [name, work] of order) results.get(name)?.push(await cpuPerRequest(work))
}
const least = (name: string) => Math.min(...(results.get(name) as number[]))
const simUs = least(sides[0]?.[0] as string)
report(
  'sim',
  'The simulator beside its floor',
  `npx tsx bench/sim.bench.ts --requests ${REQUESTS} --rounds ${ROUNDS}`,
  `${table(
    ['side', 'CPU µs per request (least of rounds)', 'rounds', 'requests per CPU-second', 'share of the target (100,000)'],
    sides.map(([name]) => [
      name,
      fmt(least(name), 1),
      (results.get(name) as number[]).map((us) => fmt(us, 1)).join(', '),
      fmt(1e6 / least(name)),
      `${((1e6 / least(name) / TARGET) * 100).toFixed(0)}%`,
    ]),
  )}\n\n` +
    `${fmt(REQUESTS)} requests per side and round; the sides alternate, each going first in turn, and each keeps its least ` +
    'CPU per request (load from elsewhere only adds to it). The floors run the code the simulator drives with nothing ' +
    "around it: the engine's key, scope and fingerprint, the ledger's acquire, steps and complete on a MemoryStore, the " +
    "payment handler's JSON; sixteen callers, so promise continuations batch as they would, and a fresh store every " +
    'thousand requests (the simulator starts one per seed). They leave out the client ' +
    '(`idempotentFetch` and its retry policy), the simulated network, the scheduler and the invariant checks, so they are ' +
    `an upper bound for any simulator of this workload: the simulator runs at ${((simUs > 0 ? least(sides[1]?.[0] as string) / simUs : 0) * 100).toFixed(0)}% ` +
    'of the three-step floor. docs/testing.md, "Its own speed", says where the rest goes.',
)
process.exit(0)
