/**
 * npm run sim: runs the deterministic simulation over many seeds and checks every invariant on each.
 *
 *   npm run sim                          the CI budget: seeds from 1 until the budget of simulated requests
 *   npm run sim -- --requests 2000000    another budget
 *   npm run sim -- --minutes 30          a soak: seeds until the time is up
 *   npm run sim -- --seed 1234 --trace   replays one run exactly, printing its schedule
 *   npm run sim -- --defect fence        runs with a deliberate defect (DEFECTS in sim/scenario.ts): must fail
 *   npm run sim -- --workers 1           one thread (default: one worker thread per core, at most 2)
 *   npm run sim -- --seeds 60            exactly the seeds first..first+59, whatever requests they make
 *                                        (npm run mutate:sim: the same seeds for every mutant)
 *   npm run sim -- --seeds 60 --bail     stops at the first failing seed, unshrunk (mutate:sim's verdict)
 *
 * With workers, worker i of n runs the seeds first+i, first+i+n, … until its share of the budget: the
 * seeds run depend on n only, not on timing. The requests per CPU-second printed count the CPU time of
 * every thread (process.cpuUsage), so more workers shorten the run, not the figure. Beside it, the
 * share of the floor (sim/floor.ts: the code under test alone, measured just after in this process):
 * issue 57 asks for 0.41 or more; docs/testing.md ("Its own speed") records what it is and why that is out
 * of reach of this workload. A --seeds run (mutate:sim) skips the floor.
 *
 * A failing seed is printed with the command that replays it, and shrunk: the same seed with fewer
 * clients and intents, as long as it still fails, so the trace to read is short.
 */
import { availableParallelism } from 'node:os'
import { parseArgs } from 'node:util'
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads'
import { floorRequestsPerCpuSecond } from './floor.js'
import { DEFECTS, type Defect, runScenario, type ScenarioOptions } from './scenario.js'

const { values } = parseArgs({
  options: {
    seed: { type: 'string' },
    'first-seed': { type: 'string', default: '1' },
    requests: { type: 'string', default: '1000000' },
    minutes: { type: 'string' },
    defect: { type: 'string' },
    trace: { type: 'boolean', default: false },
    clients: { type: 'string' },
    intents: { type: 'string' },
    json: { type: 'boolean', default: false },
    workers: { type: 'string' },
    seeds: { type: 'string' },
    bail: { type: 'boolean', default: false },
  },
})

const defect = values.defect as Defect | undefined
if (defect !== undefined && !DEFECTS.includes(defect)) {
  console.error(`sim: --defect is one of ${DEFECTS.join(', ')}, not ${defect}`)
  process.exit(2)
}
const base: Omit<ScenarioOptions, 'seed'> = {
  ...(values.clients ? { clients: Number(values.clients) } : {}),
  ...(values.intents ? { intentsPerClient: Number(values.intents) } : {}),
  ...(defect ? { defect } : {}),
}

function replayCommand(options: ScenarioOptions): string {
  const flags = [`--seed ${options.seed}`]
  if (options.clients) flags.push(`--clients ${options.clients}`)
  if (options.intentsPerClient) flags.push(`--intents ${options.intentsPerClient}`)
  if (options.defect) flags.push(`--defect ${options.defect}`)
  return `npm run sim -- ${flags.join(' ')} --trace`
}

/** The same seed with fewer clients and intents, while it still fails: a shorter schedule to read. */
async function shrink(options: ScenarioOptions): Promise<ScenarioOptions> {
  const best = { clients: 6, intentsPerClient: 8, ...options }
  for (const next of [
    { clients: 1, intentsPerClient: 1 },
    { clients: 1, intentsPerClient: 2 },
    { clients: 2, intentsPerClient: 2 },
    { clients: 2, intentsPerClient: 4 },
    { clients: 3, intentsPerClient: 4 },
    { clients: 4, intentsPerClient: 6 },
  ]) {
    if (next.clients * next.intentsPerClient >= best.clients * best.intentsPerClient) continue
    const candidate = { ...best, ...next }
    if ((await runScenario(candidate)).violations.length > 0) return candidate
  }
  return best
}

if (values.seed !== undefined) {
  const options = { ...base, seed: Number(values.seed), trace: values.trace }
  const result = await runScenario(options)
  if (values.trace) for (const line of result.trace) console.log(line)
  console.log(
    `seed ${result.seed}: ${result.requests} requests, ${result.intents} intents, ${result.events} events, ${result.simulatedMs.toFixed(0)} ms simulated`,
  )
  for (const v of result.violations) console.log(`  VIOLATION ${v}`)
  process.exit(result.violations.length > 0 ? 1 : 0)
}

// The simulated store network and timeouts make thousands of errors per second and nothing prints
// their stacks; capturing them is a fifth of the run. A replay (--seed) keeps them.
Error.stackTraceLimit = 0

interface Failure {
  options: ScenarioOptions
  violations: string[]
}

interface Share {
  firstSeed: number
  stride: number
  budget: number
  deadline: number | undefined
  /** When set, exactly the seeds below this one (a fixed set), whatever the budget. */
  endSeed: number | undefined
  /** [failures found by all threads]: a thread stops once there are enough to report. */
  shared: Int32Array
}

interface Tally {
  passed: number
  requests: number
  events: number
  failures: Failure[]
}

/** --bail (npm run mutate:sim): the first failing seed is enough, and it is not shrunk (a mutant's verdict, fast). */
const ENOUGH_FAILURES = values.bail ? 1 : 3

/** Runs seeds firstSeed, firstSeed+stride, … until the share's budget (or deadline) is spent. */
async function runShare(share: Share): Promise<Tally> {
  const tally: Tally = { passed: 0, requests: 0, events: 0, failures: [] }
  for (let seed = share.firstSeed; ; seed += share.stride) {
    if (
      share.endSeed !== undefined ? seed >= share.endSeed : share.deadline ? Date.now() >= share.deadline : tally.requests >= share.budget
    )
      break
    if (Atomics.load(share.shared, 0) >= ENOUGH_FAILURES) break
    const options = { ...base, seed }
    const result = await runScenario(options)
    tally.requests += result.requests
    tally.events += result.events
    if (result.violations.length === 0) tally.passed++
    else {
      tally.failures.push({ options, violations: result.violations })
      Atomics.add(share.shared, 0, 1)
    }
  }
  return tally
}

if (isMainThread) await main()
else parentPort?.postMessage(await runShare(workerData as Share))

async function main(): Promise<never> {
  const budget = Number(values.requests)
  const deadline = values.minutes ? Date.now() + Number(values.minutes) * 60_000 : undefined
  const workers = Math.max(1, Number(values.workers ?? Math.min(2, availableParallelism())))
  const shared = new Int32Array(new SharedArrayBuffer(4))
  const started = process.cpuUsage()
  const startedAt = Date.now()

  const shares: Share[] = Array.from({ length: workers }, (_, i) => ({
    firstSeed: Number(values['first-seed']) + i,
    stride: workers,
    budget: Math.ceil(budget / workers),
    deadline,
    endSeed: values.seeds ? Number(values['first-seed']) + Number(values.seeds) : undefined,
    shared,
  }))
  const tallies = workers === 1 ? [await runShare(shares[0] as Share)] : await Promise.all(shares.map(inWorker))
  const passed = tallies.reduce((sum, t) => sum + t.passed, 0)
  const requests = tallies.reduce((sum, t) => sum + t.requests, 0)
  const events = tallies.reduce((sum, t) => sum + t.events, 0)
  const failures = tallies
    .flatMap((t) => t.failures)
    .sort((a, b) => a.options.seed - b.options.seed)
    .slice(0, ENOUGH_FAILURES)
  const cpu = process.cpuUsage(started)
  const cpuSeconds = (cpu.user + cpu.system) / 1e6
  const summary = {
    passed,
    failed: failures.length,
    requests,
    events,
    workers,
    cpuSeconds: Number(cpuSeconds.toFixed(1)),
    wallSeconds: Number(((Date.now() - startedAt) / 1000).toFixed(1)),
    requestsPerCpuSecond: Math.round(requests / cpuSeconds),
    floorRequestsPerCpuSecond: 0,
    ratioToFloor: 0,
  }
  if (values.seeds === undefined && failures.length === 0) {
    summary.floorRequestsPerCpuSecond = Math.round(await floorRequestsPerCpuSecond())
    summary.ratioToFloor = Number((summary.requestsPerCpuSecond / summary.floorRequestsPerCpuSecond).toFixed(2))
  }
  Error.stackTraceLimit = 10
  for (const failure of failures) {
    const shrunk = values.bail ? failure.options : await shrink(failure.options)
    console.log(`\nFAILED seed ${failure.options.seed}${defect ? ` (defect ${defect})` : ''}:`)
    for (const v of failure.violations.slice(0, 5)) console.log(`  ${v}`)
    console.log(`  replay: ${replayCommand(shrunk)}`)
  }
  if (values.json) console.log(JSON.stringify(summary))
  console.log(
    `\nsim: ${passed} passed, ${failures.length} failed; ${requests} simulated requests (${events} events) in ${summary.cpuSeconds} CPU-s ` +
      `(${summary.wallSeconds} s on ${workers} thread${workers === 1 ? '' : 's'}), ${summary.requestsPerCpuSecond} requests per CPU-second` +
      (summary.ratioToFloor > 0
        ? `; ${summary.ratioToFloor} of the floor (the code under test alone: ${summary.floorRequestsPerCpuSecond} requests per CPU-second)`
        : ''),
  )
  process.exit(failures.length > 0 ? 1 : 0)
}

function inWorker(share: Share): Promise<Tally> {
  return new Promise((resolve, reject) => {
    // The same script with the same flags (--import tsx included), so the worker runs what the main thread would.
    const worker = new Worker(new URL(import.meta.url), { workerData: share, argv: process.argv.slice(2) })
    worker.once('message', resolve)
    worker.once('error', reject)
    worker.once('exit', (code) => reject(new Error(`sim worker exited with ${code} before reporting`)))
  })
}
